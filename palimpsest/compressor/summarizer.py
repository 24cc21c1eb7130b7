"""The summary call to Ollama, in one of two forms.

*Standalone*: the summary prompt and the history to condense as plain text (cut to the summary's
window), the form every summarizer model can be sent. *Prefix*: the conversation's own prompt as
its last chat call began it (system prompt, tool schemas, messages, in the same view) up to the
last message summarized, and the instruction last; the conversation's model has all of it
evaluated already, so Ollama reads only the instruction instead of thousands of tokens. The
prefix form is used when the summary is written by the conversation's own model and the Agent
said what its prompt begins with; any failure of it falls back to the standalone form.

Either way the summary is asked to be as long as what it condenses warrants (``summary_length``),
and num_predict follows, not the 6,000-token cap on every call.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.summary_format import (
    META_SUMMARY_PROMPT,
    SUMMARY_PROMPT,
    SummaryInput,
    format_for_summary,
    needs_meta_summary,
    split_keys_line,
    split_summaries,
    summary_messages,
)
from palimpsest.compressor.summary_window import (
    num_predict,
    padded,
    predict_for,
    summary_budget,
    summary_length,
    summary_num_ctx,
    words_for,
)
from palimpsest.shared import metrics
from palimpsest.shared.context_view import to_ollama_messages
from palimpsest.shared.ollama import ContextRefused, OllamaClient
from palimpsest.v1 import common_pb2

log = logging.getLogger("palimpsest.compressor")

Message = common_pb2.Message

# The prefix form's instruction, after the conversation it summarizes (its own words: the model
# reads it as the newest message, so it says whose request it is and what not to do).
PREFIX_INSTRUCTION = """\
[This request comes from the system, not from the user.] The oldest part of the conversation \
above is about to leave your context: {scope}. Write a concise bullet-point summary of it so that \
you can carry on the work without it. Keep what the user asked for and every decision with its \
reason; facts established along the way (results, numbers, names, errors and how they were \
resolved); exact file paths, commands, configuration keys, identifiers and links; what is still \
open. Leave out small talk. Do not call tools and do not answer the user: write only the summary."""
SCOPE_ALL = "everything above this request"
SCOPE_AFTER_SUMMARY = "the messages after the earlier summary (that summary stays as it is)"
SCOPE_MERGE = "the earlier summary and the messages after it, to be merged into one summary"


# A tool result is worth a summary's few lines whatever its size (its status, its figures): in the
# length asked for, it counts as much as the summarizer's preview of it, at most.
CONDENSED_RESULT_TOKENS = 200


def condensed_tokens(messages: list[Message], pricing: Pricing) -> int:
    """What ``messages`` weigh in the length of their summary: their tokens, a tool result's
    capped at CONDENSED_RESULT_TOKENS."""
    words = [m for m in messages if m.role != "tool"]
    results = [m for m in messages if m.role == "tool"]
    return pricing.added(words) + sum(min(CONDENSED_RESULT_TOKENS, pricing.added([m])) for m in results)


def length_line(tokens: int) -> str:
    """The request's last line: how long, and the KEYS line the breadcrumbs come from."""
    return (
        f"\n\nWrite at most {words_for(tokens)} words. Finish with exactly one line of the form\n"
        "KEYS: item, item, item\nlisting the names, commands, paths, config keys, amounts, tickets, "
        "decisions and links a reader would search for later."
    )


# The least num_predict a prefix summary is sent with: the length asked for and a quarter more.
MIN_SLACK_DIVISOR = 4


@dataclass(frozen=True)
class Prefix:
    """The conversation's prompt up to the last message a summary condenses, as Ollama was sent it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tokens: int  # the prefix's count (what Ollama has evaluated already)
    condensed_tokens: int  # of those, what the summary condenses (the length follows it)
    scope: str


class Summarizer:
    """Writes summaries through Ollama with think=False, per the resolved knobs, in one num_ctx per
    model: the conversation's window for its own model, the configured one for a summarizer model."""

    def __init__(self, ollama: OllamaClient, knobs: Knobs, model: str, window: int) -> None:
        self.ollama = ollama
        self.knobs = knobs
        self.model = knobs.summarizer_model or model
        self.same_model = self.model == model
        self.window = window
        self.budget = summary_budget(window, knobs.summary_max_tokens)

    def _pricing(self, pricing: Pricing) -> Pricing:
        # The session's calibration line describes its model's tokenizer; another model's prompt is
        # priced at chars / 1.8 rather than at a rate that may be too low for it.
        return pricing if self.same_model else Pricing.build([], self.window, self.knobs)

    async def _input(
        self, messages: list[Message], prompt: str, num_ctx: int, vision: bool, pricing: Pricing
    ) -> SummaryInput:
        formatted = await asyncio.to_thread(  # prices the input repeatedly while cutting it: off the loop
            format_for_summary,
            messages,
            critical_tools=self.knobs.critical_tools,
            vision=vision,
            window=num_ctx,
            image_fallback=self.knobs.image_fallback,
            prompt=prompt,
            summary_max_tokens=self.knobs.summary_max_tokens,
            estimate=pricing.estimate,
            costs=pricing.message_costs,
        )
        if formatted.omitted_chars or formatted.omitted_images:
            log.info(
                "summary input for %s cut to its num_ctx %d: %d chars and %d image(s) left out",
                self.model,
                num_ctx,
                formatted.omitted_chars,
                formatted.omitted_images,
            )
        return formatted

    async def _send(
        self, messages: list[dict[str, Any]], predict: int, num_ctx: int, tools: list[dict[str, Any]] | None = None
    ) -> str:
        facts = await self.ollama.model_facts(self.model)
        body = OllamaClient.chat_body(
            self.model,
            messages,
            num_ctx=num_ctx,
            tools=tools,
            think=False if facts.thinking else None,
            stream=False,
            options={"temperature": self.knobs.summary_temperature, "num_predict": predict},
        )
        with metrics.summary_call():
            result = await self.ollama.chat(body)
        if not result.content.strip():
            raise ValueError(
                "the summarizer returned an empty summary"
                + (" (it called a tool instead)" if result.tool_calls else "")
            )
        return result.content.strip()

    async def _call(
        self, prompt: str, formatted: SummaryInput, num_ctx: int, pricing: Pricing, length: int | None = None
    ) -> str:
        line = length_line(length) if length else ""
        # Priced as the input already counted (format_for_summary's last candidate) plus what the
        # line adds as a message of its own, not as one more encode of a ~16,000-character text
        # (40% of a replica's CPU per compression, bench compressor): a few tokens over the whole,
        # where the line's own wrapper is counted and the join with the text is not.
        prompt_tokens = pricing.estimate(summary_messages(prompt, formatted.text, formatted.images))
        if line:
            prompt_tokens += pricing.added([Message(role="user", content=line)])
        messages = summary_messages(prompt, formatted.text + line, formatted.images)
        predict = num_predict(num_ctx, prompt_tokens, self.knobs.summary_max_tokens)
        if predict <= 0:
            raise ValueError(f"no room for a summary in num_ctx {num_ctx}")
        if length:
            predict = min(predict, predict_for(length, self.knobs.summary_max_tokens))
        return await self._send(to_ollama_messages(messages), predict, num_ctx)

    async def num_ctx(self) -> int:
        facts = await self.ollama.model_facts(self.model)
        return summary_num_ctx(
            same_model=self.same_model,
            conversation_window=self.window,
            summarizer_window=self.knobs.summarizer_window,
            context_length=facts.context_length,
        )

    async def summarize(self, messages: list[Message], pricing: Pricing) -> tuple[str, list[str]]:
        """The standalone form: (summary, keys) of ``messages`` (old summaries among them are
        merged in; past the meta-summary threshold they are first condensed on their own)."""
        facts = await self.ollama.model_facts(self.model)
        num_ctx = await self.num_ctx()
        pricing = self._pricing(pricing)
        if needs_meta_summary(messages):
            # Old summaries first condensed into one, so they do not crowd out the new history.
            summaries, rest = split_summaries(messages)
            meta = await self._written(summaries, META_SUMMARY_PROMPT, num_ctx, False, pricing)
            meta_text, _ = split_keys_line(meta)
            messages = [Message(role="user", content=meta_text, is_summary=True), *rest]
        prompt = self.knobs.summary_prompt or SUMMARY_PROMPT
        text = await self._written(messages, prompt, num_ctx, facts.vision, pricing, sized=True)
        return split_keys_line(text)

    async def _written(
        self, messages: list[Message], prompt: str, num_ctx: int, vision: bool, pricing: Pricing, *, sized: bool = False
    ) -> str:
        """One standalone summary call (``sized``: asked for a length that follows what it reads).
        Its prompt refused by Ollama as over num_ctx (our count of it was low), the input is cut to
        fit half the window and sent once more, in the same num_ctx (another would reload the
        model); refused again, the error goes to the caller's retry and fallback."""
        formatted = await self._input(messages, prompt, num_ctx, vision, pricing)
        try:
            return await self._call(prompt, formatted, num_ctx, pricing, self._length(formatted, pricing, sized))
        except ContextRefused as exc:
            log.warning(
                "summary prompt for %s refused as over num_ctx %d: its input cut to half: %s", self.model, num_ctx, exc
            )
        formatted = await self._input(messages, prompt, num_ctx // 2, vision, pricing)
        return await self._call(prompt, formatted, num_ctx, pricing, self._length(formatted, pricing, sized))

    def _length(self, formatted: SummaryInput, pricing: Pricing, sized: bool) -> int | None:
        """The summary's length asked for: following what it reads (``sized``), else none."""
        if not sized:
            return None
        return summary_length(pricing.added([Message(role="user", content=formatted.text)]), self.budget)

    async def summarize_prefix(self, prefix: Prefix, pricing: Pricing) -> tuple[str, list[str]]:
        """The prefix form: the conversation's prompt up to the last message condensed, then the
        instruction. ValueError when it would not fit the window with its summary."""
        num_ctx = await self.num_ctx()
        length = summary_length(prefix.condensed_tokens, self.budget)
        body = self.knobs.summary_prompt or PREFIX_INSTRUCTION.format(scope=prefix.scope)
        instruction = Message(role="user", content=body + length_line(length))
        # The slack past the length asked for gives way first: a prefix just under the trigger of a
        # small window left no room for twice the length, and half the summaries at 4,096 went
        # standalone, evaluating their whole prompt again (bench compaction, calibrated path).
        room = num_ctx - padded(prefix.tokens + pricing.added([instruction]))
        predict = min(predict_for(length, self.knobs.summary_max_tokens), room)
        if predict < length + length // MIN_SLACK_DIVISOR:
            raise ValueError(
                f"the conversation's prompt (~{prefix.tokens:,} tokens) and a summary of "
                f"{length + length // MIN_SLACK_DIVISOR} pass num_ctx {num_ctx}"
            )
        text = await self._send([*prefix.messages, *to_ollama_messages([instruction])], predict, num_ctx, prefix.tools)
        return split_keys_line(text)

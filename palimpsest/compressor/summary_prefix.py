"""The conversation's prompt as the Agent's last chat call began it, up to the last message a
summary condenses: the prefix form of the summary call (see ``summarizer``).

Ollama keeps the tokens of the last prompt it evaluated and reads a new request only from where
the two differ. A summary request that begins exactly as the chat call before it (the same system
prompt and memory message, the same tool block, the same messages in the same view) costs the
model the instruction at its end, not the thousands of tokens of history it condenses. The view
is the size check's (``Pricing.view``: the same message always gets the same cut), and the rows
are the ones the Agent's ``ContextBuilder`` sends (``reaches_model``). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from palimpsest.compressor.pricing import Pricing
from palimpsest.compressor.summarizer import SCOPE_AFTER_SUMMARY, SCOPE_ALL, SCOPE_MERGE, Prefix, condensed_tokens
from palimpsest.shared.context_view import reaches_model, to_ollama_messages
from palimpsest.v1 import common_pb2

Message = common_pb2.Message


def scope_of(summarized: Sequence[Message], folds: bool) -> str:
    """What the instruction asks to condense, in its words."""
    if not any(m.is_summary for m in summarized):
        return SCOPE_ALL
    return SCOPE_AFTER_SUMMARY if folds else SCOPE_MERGE


def build_prefix(
    head: Sequence[Message],
    tool_schemas: Sequence[str],
    context: Sequence[Message],
    summarized: Sequence[Message],
    pricing: Pricing,
    vision: bool,
    scope: str,
) -> Prefix | None:
    """The prefix that ends with the last of ``summarized`` (stored rows of ``context``); None
    without the head the Agent's prompts begin with (an older Agent, a forced compaction from
    another client), or when no summarized row is in the prompt."""
    if not head or not summarized:
        return None
    built = [*head, *(m for m in context if reaches_model(m))]
    seqs = {m.seq for m in summarized}
    positions = [i for i, m in enumerate(built) if i >= len(head) and m.seq in seqs]
    if not positions:
        return None
    end = positions[-1] + 1
    # An important old turn the plan keeps may sit inside the prefix: the model reads it again
    # (evaluated already, it costs nothing) and it stays verbatim all the same.
    view, _ = pricing.view(built)
    part = view[:end]
    messages = to_ollama_messages(part)
    if not vision:
        for m in messages:
            m.pop("images", None)
    tools = [json.loads(s) for s in tool_schemas] or None
    tokens = pricing.count_view(part, list(tool_schemas)).tokens
    baseline = pricing.baseline
    if (
        not pricing.exact
        and baseline is not None
        and 0 < baseline.tokens
        and built[end - 1].seq <= baseline.through_seq
    ):
        # A prefix of the last prompt costs at most what Ollama said that prompt cost: a real count,
        # where the calibrated line over-counts by design.
        tokens = min(tokens, baseline.tokens)
    # A merge rewrites the earlier summary too; a fold condenses only what follows it.
    condensed = condensed_tokens(
        [part[i] for i in positions if scope == SCOPE_MERGE or not part[i].is_summary], pricing
    )
    return Prefix(messages, tools, tokens, condensed, scope)

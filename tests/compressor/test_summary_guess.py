"""The summarizer's input is cut where per-message rates guess it fits, then counted exactly once:
the guess decides where the search starts, never whether the request fits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollama_sim.vocabulary import QWEN3_6, tokenizer_metadata
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.summary_format import ENOUGH_DIVISOR, SUMMARY_PROMPT, format_for_summary, summary_messages
from palimpsest.compressor.summary_guess import RenderedCosts
from palimpsest.compressor.summary_window import input_limit
from palimpsest.compressor.vocabulary import build_tokenizer
from palimpsest.shared.settings import Settings
from palimpsest.v1.common_pb2 import Message, ToolCall
from tests.helpers.compressor_calls import PIECES


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tokenizer_metadata(QWEN3_6))


class Counting:
    """The model's tokenizer, saying how many long texts it encoded."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.encoded = 0

    def encode_batch(self, texts, **kw):
        self.encoded += sum(1 for t in texts if len(t) > 2_000)
        return self.tokenizer.encode_batch(texts, **kw)

    def encode_batch_fast(self, texts, **kw):
        self.encoded += sum(1 for t in texts if len(t) > 2_000)
        return self.tokenizer.encode_batch_fast(texts, **kw)


def history(rng: random.Random, rows: int) -> list[Message]:
    out = []
    for seq in range(1, rows + 1):
        role = rng.choice(["user", "assistant", "tool"])
        text = "".join(rng.choice(PIECES) for _ in range(rng.choice([1, 4, 30, 90])))
        calls = [ToolCall(name="read_log", arguments_json='{"path": "/var/log/x"}')] if role == "assistant" else []
        out.append(Message(seq=seq, role=role, content=text, tool_calls=calls, name="read_log" * (role == "tool")))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([4_096, 8_192, 16_384]), lie=st.sampled_from([0, 1, 50]))
def test_the_cut_input_always_fits_whatever_the_guess(tokenizer, seed, window, lie):
    knobs = Knobs.resolve(Settings(), None)
    pricing = Pricing.build([], window, knobs, None, TokenCounter(tokenizer, "exact"))
    messages = history(random.Random(seed), 80)

    def costs(ms):  # lie=1: the messages' own counts; 0 and 50: rates far off in either direction
        return [n * lie if lie != 1 else n for n in pricing.message_costs(ms)]

    out = format_for_summary(
        messages,
        vision=False,
        window=window,
        prompt=SUMMARY_PROMPT,
        summary_max_tokens=knobs.summary_max_tokens,
        estimate=pricing.estimate,
        costs=costs,
    )
    priced = pricing.estimate(summary_messages(SUMMARY_PROMPT, out.text))
    limit = input_limit(window, knobs.summary_max_tokens)
    assert priced <= limit  # the exact count of what is sent, never a guess
    if out.omitted_chars and lie == 1:
        assert priced >= limit - limit // ENOUGH_DIVISOR  # and it takes what room there is


def test_with_the_messages_own_counts_the_input_is_counted_once(tokenizer):
    knobs = Knobs.resolve(Settings(), None)
    counter = Counting(tokenizer)
    pricing = Pricing.build([], 8_192, knobs, None, TokenCounter(counter, "counting"))
    encodes = []
    for seed in range(8):
        messages = history(random.Random(seed), 120)
        pricing.message_costs(messages)  # counted before, as a compression's plan has
        counter.encoded = 0
        out = format_for_summary(
            messages,
            vision=False,
            window=8_192,
            prompt=SUMMARY_PROMPT,
            summary_max_tokens=knobs.summary_max_tokens,
            estimate=pricing.estimate,
            costs=pricing.message_costs,
        )
        assert out.omitted_chars > 0
        encodes.append(counter.encoded)
    assert max(encodes) <= 2 and sum(encodes) <= 10  # a bisection counted ~17 times


def test_rendered_costs_add_up_from_either_end():
    costs = RenderedCosts(["aaaa", "bb", "cccccc"], [1.0, 0.5, 2.0])
    assert costs.length == 4 + 2 + 2 + 2 + 6
    assert costs.prefix(0) == 0 and costs.prefix(6) == 6.0 and costs.prefix(7) == 6.5
    assert costs.suffix(6) == 12.0 and costs.prefix(costs.length) == costs.suffix(costs.length) == 6 + 2 + 12

"""Exact counts: the Compressor's tokenizer from the simulator's GGUF vocabulary equals the
reference, the template cost fitted from reports makes prompt counts exact, and cuts are stable."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollama_sim.prompt import count_prompt_tokens, encoding
from ollama_sim.vocabulary import QWEN3_6, tokenizer_metadata
from palimpsest.compressor.exact_count import (
    ExactObservation,
    Template,
    counted_view,
    exact_view,
    fit_template,
    shape_of,
)
from palimpsest.compressor.model_tokenizers import TokenCounter
from palimpsest.compressor.vocabulary import build_tokenizer
from palimpsest.shared.context_view import to_ollama_messages
from palimpsest.v1.common_pb2 import Message, ToolCall
from tests.helpers.compressor_calls import Watched

# The kinds of text whose chars-per-token differ most (1.85 for logs, ~4 for prose, ~1 for CJK).
CORPUS = {
    "prose": "The compressor keeps the model's context inside its window; nothing the user said is lost. " * 8,
    "code": "def handler(event, context):\n    for i in range(10):\n        yield {'id': i, 'ok': i % 3 == 0}\n" * 6,
    "json": json.dumps({"rows": [{"id": i, "value": f"v-{i}", "ok": i % 2 == 0} for i in range(40)]}),
    "logs": "\n".join(
        f"2026-11-30T10:{i % 60:02d}:17.{i:03d}Z ERROR [worker-{i % 7}] 10.0.{i % 255}.7:5432 "
        f"conn reset id=0x{i * 7919:08x}"
        for i in range(40)
    ),
    "cjk": "上下文窗口必须始终容纳完整的提示。日本語のテキストも数えます。한국어 텍스트도 셉니다。" * 6,
    "emoji": "Deploy done 🎉🚀 team 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ok ✅ " * 10,
    "combining": "cafe\u0301 nai\u0308ve e\u0301te\u0301 " * 20,
    "base64": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==" * 4,
    "whitespace": "a  \n\n\n\t\t  b" + " " * 40 + "\n" * 9 + "c",
}


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter(build_tokenizer(tokenizer_metadata(QWEN3_6)), "sim-qwen3.6")


def reference(text: str) -> list[int]:
    return encoding().encode(text, allowed_special="all")


@pytest.mark.parametrize("kind", sorted(CORPUS))
def test_the_exact_count_equals_the_reference_tokenizer(counter, kind):
    text = CORPUS[kind]
    assert counter.tokenizer.encode(text, add_special_tokens=False).ids == reference(text)
    assert counter.count(text) == len(reference(text))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_the_exact_count_equals_the_reference_on_any_text(counter, text):
    assert counter.count(text) == len(reference(text))


def test_repeated_texts_are_counted_from_the_cache(counter):
    texts = [CORPUS["prose"], CORPUS["logs"], CORPUS["prose"]]
    assert counter.counts(texts) == [len(reference(t)) for t in texts]


def _conversation(rnd: random.Random, turns: int) -> list[Message]:
    messages = [Message(role="system", content="You are a careful assistant. " * rnd.randint(1, 20))]
    for turn in range(turns):
        messages.append(Message(role="user", content=f"turn {turn}: " + CORPUS[rnd.choice(sorted(CORPUS))][:300]))
        if rnd.random() < 0.4:
            args = json.dumps({"path": f"/srv/{turn}.log", "lines": rnd.randint(1, 500)})
            messages.append(
                Message(role="assistant", tool_calls=[ToolCall(id=f"c{turn}", name="read", arguments_json=args)])
            )
            body = CORPUS[rnd.choice(sorted(CORPUS))]
            messages.append(
                Message(role="tool", name="read", tool_call_id=f"c{turn}", content=body[: rnd.randint(50, len(body))])
            )
        messages.append(Message(role="assistant", content=CORPUS[rnd.choice(sorted(CORPUS))][: rnd.randint(10, 400)]))
    return messages


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _real(messages: list[Message], tools) -> int:
    return count_prompt_tokens(to_ollama_messages(messages), tools)


def test_the_fitted_template_makes_prompt_counts_exact_and_never_low(counter):
    rnd = random.Random(7)
    schemas = [json.dumps(t, ensure_ascii=False) for t in TOOLS]
    reports = []
    for _ in range(40):
        messages = _conversation(rnd, rnd.randint(1, 12))
        tools = TOOLS if rnd.random() < 0.7 else None
        shape = shape_of(messages, schemas if tools else [], counter, 1024)
        reports.append((messages, tools, shape, _real(messages, tools)))
    template = fit_template([ExactObservation(shape, real) for _, _, shape, real in reports[:24]])
    errors = []
    for messages, tools, shape, real in reports[24:]:  # prompts the fit never saw
        counted = template.tokens(shape)
        assert counted >= real, (counted, real)
        errors.append((counted - real) / real)
    errors.sort()
    assert errors[len(errors) // 2] <= 0.005 and errors[-1] <= 0.02, errors


def test_before_any_report_the_chatml_prior_errs_on_the_safe_side(counter):
    rnd = random.Random(3)
    for _ in range(20):
        messages = _conversation(rnd, rnd.randint(1, 8))
        shape = shape_of(messages, [], counter, 1024)
        assert Template().tokens(shape) >= _real(messages, None)


def test_image_cost_is_learned_from_reports_and_starts_at_the_area_prior():
    from palimpsest.compressor.exact_count import Shape

    text_only = [ExactObservation(Shape(content_tokens=1000 + 10 * i, messages=4 + i), 1023 + 15 * i) for i in range(6)]
    with_image = ExactObservation(Shape(content_tokens=1000, messages=4, image_prior_tokens=400, images=1), 1023 + 800)
    assert fit_template(text_only).image_scale == 1.0
    assert fit_template([*text_only, with_image]).image_scale == pytest.approx(2.0, rel=0.05)


def test_a_cut_view_is_the_same_on_every_call_and_within_its_budget(counter):
    big = Message(role="tool", content=CORPUS["logs"] * 20)
    first, cuts = exact_view([Message(role="user", content="go"), big], 500, counter)
    second, _ = exact_view([Message(role="user", content="go"), big], 500, counter)
    assert list(cuts) == [1] and first[1].content == second[1].content
    assert counter.count(first[1].content) <= 500 + 4  # a merge or two at the seams
    assert first[1].content.startswith(big.content[:100]) and first[1].content.endswith(big.content[-100:])
    assert "truncated" in first[1].content and big.content == CORPUS["logs"] * 20  # the stored row is untouched


def whole_cut(tokenizer, text: str, head: int, tail: int) -> tuple[str, str]:
    """The cut as the text's own whole encoding places it."""
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    if head + tail >= len(offsets):
        return text, ""
    return (text[: offsets[head - 1][1]] if head else "", text[offsets[-tail][0] :] if tail else "")


@pytest.mark.parametrize("for_cut", [True, False])
@pytest.mark.parametrize("kind", ["logs", "cjk", "code", "emoji", "base64"])
def test_a_long_text_is_cut_where_its_whole_encoding_places_the_cut_however_it_was_counted(counter, kind, for_cut):
    tokenizer = counter.tokenizer
    text = CORPUS[kind] * 30
    counted = TokenCounter(tokenizer, "counted first")
    total = counted.counts([text], for_cut=for_cut)[0]
    assert total == len(tokenizer.encode(text, add_special_tokens=False).ids) >= 512
    # Told it may be cut, the count holds its encoding for the cut; otherwise it skipped the offsets.
    assert bool(counted._encodings) is for_cut
    for head, tail in [(100, 50), (1, 1), (300, 0), (0, 300), (total // 2, total // 3), (total, 1)]:
        assert counted.head_and_tail(text, head, tail) == whole_cut(tokenizer, text, head, tail), (head, tail)
    assert not counted._encodings  # taken by the cut: the cut itself is remembered


def test_a_view_counts_only_the_contents_it_may_cut_with_their_offsets(counter):
    tokenizer = counter.tokenizer
    fresh = TokenCounter(tokenizer, "view")
    big_result = Message(role="tool", content=CORPUS["logs"] * 20)
    big_request = Message(role="user", content=CORPUS["prose"] * 20)  # a user's words are never cut
    small_result = Message(role="tool", content="ok")
    view, cuts, _ = counted_view([big_request, big_result, small_result], 500, fresh)
    assert list(cuts) == [1] and view[1].content == cuts[1]
    assert view[0].content == big_request.content and view[2].content == "ok"
    head_tail = fresh.head_and_tail(big_result.content, 1, 1)  # the cut above took its kept encoding
    assert head_tail == whole_cut(tokenizer, big_result.content, 1, 1) and not fresh._encodings


def varied(rng: random.Random, rows: int) -> list[Message]:
    out = []
    for seq in range(1, rows + 1):
        role = rng.choice(["user", "assistant", "tool"])
        body = CORPUS[rng.choice(sorted(CORPUS))] * rng.choice([1, 1, 12])
        calls = (
            [ToolCall(name="grep", arguments_json='{"q": "x"}')] if role == "assistant" and rng.random() < 0.3 else []
        )
        out.append(Message(seq=seq, role=role, content=body, tool_calls=calls, name="grep" * (role == "tool")))
    return out


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.sampled_from([0, 300, 1_365]))
def test_a_pricing_prices_the_same_messages_again_from_memory_and_alike(counter, seed, budget):
    from palimpsest.compressor.pricing import Knobs, Pricing
    from palimpsest.shared.settings import Settings

    knobs = Knobs.resolve(Settings(), None)
    rng = random.Random(seed)
    context = varied(rng, 30)
    watched = Watched(counter.tokenizer)
    pricing = Pricing.build([], 8_192, knobs, None, watched)
    pricing.budget = budget
    subsets = [context[rng.randrange(0, 30) :][: rng.randrange(1, 30)] for _ in range(12)]
    uncached = TokenCounter(counter.tokenizer, "fresh")  # its own caches, no memory of a Pricing
    for subset in subsets:
        fresh = Pricing.build([], 8_192, knobs, None, uncached)
        fresh.budget = budget
        assert pricing.estimate(subset) == fresh.estimate(subset)
        assert pricing.message_costs(subset) == fresh.message_costs(subset)
    asked = len(watched.counted)
    for subset in subsets:  # all priced before: only a cut view's copies are counted again
        pricing.estimate(subset)
    assert len(watched.counted) - asked <= sum(1 for s in subsets for m in s if m.role in ("assistant", "tool")) * 2
    # A copy with other words is another message, whatever the copied one cost.
    changed = Message()
    changed.CopyFrom(context[0])
    changed.content = "a different text altogether, " * 40
    fresh = Pricing.build([], 8_192, knobs, None, uncached)
    fresh.budget = budget
    assert pricing.estimate([changed, *context[1:4]]) == fresh.estimate([changed, *context[1:4]])


def test_a_pricing_for_another_counter_remembers_nothing(counter):
    from dataclasses import replace

    from palimpsest.compressor.pricing import Knobs, Pricing
    from palimpsest.shared.settings import Settings

    pricing = Pricing.build([], 8_192, Knobs.resolve(Settings(), None), None, counter)
    messages = varied(random.Random(1), 10)
    pricing.estimate(messages)
    watched = Watched(counter.tokenizer)
    again = replace(pricing, counter=watched)
    again.estimate(messages)
    assert len(watched.counted) >= len(messages)  # counted by its own counter, not answered from the first's memory


def test_only_stored_rows_are_remembered_and_what_is_remembered_is_answered_from_memory(counter):
    from palimpsest.compressor.exact_count import message_tokens

    memo: dict = {}
    stored = Message(seq=3, role="user", content="a stored row of the context " * 20)
    once = Message(role="user", content="a summary input, priced once " * 20)  # kept alive by nothing
    assert message_tokens([stored, once], counter, memo) == message_tokens([stored, once], counter)
    assert list(memo) == [id(stored)]
    watched = Watched(counter.tokenizer)
    assert message_tokens([once, stored], watched, memo) == message_tokens([once, stored], counter)
    assert watched.counted == [once.content]  # the stored row came from memory

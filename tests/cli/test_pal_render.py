"""The pieces of `pal` that need no server: reading chat input, rendering a stream, picking a session."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console

from palimpsest.cli.chat_input import image_paths_in, parse_command, read_message
from palimpsest.cli.commands.turns import most_recent_session
from palimpsest.cli.errors import CliError
from palimpsest.cli.render import ContextMeter, JsonTurn, LiveTurn, arguments_line, preview_of
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import common_pb2, compressor_pb2
from palimpsest.v1 import session_store_pb2 as store_pb


def typed(*lines: str):
    """A read_line that answers with these lines, then end of input."""
    feed: Iterator[str] = iter(lines)

    def read_line(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read_line


# -- chat input -----------------------------------------------------------------------------------
def test_a_trailing_backslash_continues_the_message():
    assert read_message(typed("first \\", "second \\", "third", "next"), "> ", ". ") == "first \nsecond \nthird"


def test_triple_quotes_open_and_close_a_block():
    assert read_message(typed('"""', "a", "", "b", '"""', "next"), "> ", ". ") == "a\n\nb"
    assert read_message(typed('"""starts here', 'ends here"""'), "> ", ". ") == "starts here\nends here"
    assert read_message(typed('"""one line"""'), "> ", ". ") == "one line"


def test_end_of_input_sends_what_was_typed_and_then_ends():
    assert read_message(typed('"""', "unfinished"), "> ", ". ") == "unfinished"
    assert read_message(typed("dangling \\"), "> ", ". ") == "dangling \n"
    assert read_message(typed(), "> ", ". ") is None


def test_slash_commands_are_told_from_paths_and_prose():
    assert parse_command("/attach my notes.txt") == ("attach", "my notes.txt")
    assert parse_command("  /NEW ") == ("new", "")
    assert parse_command("/tmp/shot.png what is this?") is None
    assert parse_command("//literal slash") is None
    assert parse_command("plain text") is None


def test_pasted_image_paths_are_found_quoted_or_escaped(tmp_path):
    spaced = tmp_path / "screen shot.png"
    plain = tmp_path / "plot.JPG"
    for path in (spaced, plain):
        path.write_bytes(b"\x89PNG")
    (tmp_path / "notes.txt").write_text("x")
    escaped = str(spaced).replace(" ", "\\ ")
    text = f"compare '{spaced}' with {plain} and {escaped}, ignore {tmp_path / 'notes.txt'} and /nope/x.png"
    assert image_paths_in(text) == [spaced, plain]
    assert image_paths_in(f"don't break on apostrophes: {plain}") == [plain]
    assert image_paths_in(f"file://{str(spaced).replace(' ', '%20')}") == [spaced]


# -- rendering ------------------------------------------------------------------------------------
def event(seq: int, **kind) -> pb.AgentEvent:
    return pb.AgentEvent(session_id="s-1", seq=seq, **kind)


def a_turn() -> list[pb.AgentEvent]:
    return [
        event(1, model_info=pb.ModelInfo(model="qwen3.6", context_window=8192)),
        event(2, thinking_delta=pb.ThinkingDelta(text="let me think")),
        event(3, thinking_end=pb.ThinkingEnd()),
        event(4, plan_ready=pb.PlanReady(plan="Two steps.", steps=["look", "answer"], complexity="simple")),
        event(
            5,
            todo_updated=pb.TodoUpdated(
                items=[
                    pb.TodoItem(id="1", text="look", status="in_progress"),
                    pb.TodoItem(id="2", text="answer", status="pending"),
                ]
            ),
        ),
        event(
            6,
            todo_updated=pb.TodoUpdated(
                items=[
                    pb.TodoItem(id="1", text="look", status="in_progress"),
                    pb.TodoItem(id="2", text="answer", status="pending"),
                ]
            ),
        ),
        event(7, tool_started=pb.ToolStarted(call_id="c1", name="memory_search", arguments_json='{"query": "x"}')),
        event(
            8,
            tool_finished=pb.ToolFinished(
                call_id="c1", name="memory_search", preview="found 2 chunks", elapsed_seconds=0.25
            ),
        ),
        event(9, usage=pb.Usage(context_tokens=6000, max_context_tokens=8192)),
        event(10, compression_started=compressor_pb2.CompressionStarted(context_tokens=7000)),
        event(
            11,
            context_compressed=compressor_pb2.ContextCompressed(
                messages_before=40, messages_after=9, context_tokens=2100, max_context_tokens=8192, summary="gist"
            ),
        ),
        event(12, text_delta=pb.TextDelta(text="The answer ")),
        event(13, text_delta=pb.TextDelta(text="is 42.\nSecond")),
        event(14, text_delta=pb.TextDelta(text=" line.")),
        event(
            15, stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_COMPLETED, text="The answer is 42.\nSecond line.")
        ),
    ]


def rendered(events: list[pb.AgentEvent], meter: ContextMeter | None = None) -> tuple[str, LiveTurn]:
    console = Console(file=io.StringIO(), width=100, force_terminal=False, color_system=None)
    view = LiveTurn(console, meter)
    with view:
        for e in events:
            view.handle(e)
    return console.file.getvalue(), view  # type: ignore[attr-defined]


def test_a_turn_renders_every_kind_of_event_in_order():
    out, view = rendered(a_turn())
    order = [
        "let me think",
        "Plan · simple",
        "1. look",
        "Todo · 0/2 done",
        "⚙ memory_search",
        'query="x"',
        "found 2 chunks",
        "done · 0.2s",
        "Context compressed: 40 → 9 messages",
        "The answer is 42.",
        "Second line.",
        "2,100 / 8,192 tokens (26%)",
    ]
    positions = [out.index(piece) for piece in order]
    assert positions == sorted(positions)
    assert out.count("Todo ·") == 1  # an unchanged todo list is not printed again
    assert view.outcome.session_id == "s-1" and not view.outcome.failed


def test_a_compression_card_says_what_was_freed_and_why_it_stopped_short_of_its_target():
    short = "ended at ~5,000 tokens, above the target of 4,096: the messages kept verbatim take 4,200"
    out, view = rendered(
        [
            event(
                1,
                context_compressed=compressor_pb2.ContextCompressed(
                    messages_before=40,
                    messages_after=9,
                    context_tokens=3_700,
                    max_context_tokens=8192,
                    tokens_before=7_300,
                    tokens_after=5_000,
                    target_tokens=4_096,
                    shortfall=short,
                ),
            )
        ],
        ContextMeter(),
    )
    assert "now 5,000 / 8,192 tokens (freed 2,300)" in out and "above the target of 4,096" in out
    assert view.meter.tokens == 5_000  # the whole prompt, not only the stored context


def test_the_final_text_is_printed_when_nothing_was_streamed():
    out, _ = rendered([event(1, stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_COMPLETED, text="Only here."))])
    assert "Only here." in out


def test_errors_and_unfinished_turns_say_why():
    out, view = rendered(
        [
            event(1, error=pb.ErrorEvent(code="UNAVAILABLE", message="Ollama went away")),
            event(2, stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_ERROR)),
        ]
    )
    assert "error: UNAVAILABLE: Ollama went away" in out and "turn ended with an error" in out
    assert view.outcome.failed


def test_failed_tools_and_sub_agents_are_marked():
    out, _ = rendered(
        [
            event(1, tool_started=pb.ToolStarted(call_id="c", name="image_view", arguments_json="not json")),
            event(
                2, tool_finished=pb.ToolFinished(call_id="c", name="image_view", preview="no such file", is_error=True)
            ),
            pb.AgentEvent(session_id="s", seq=3, is_subagent=True, text_delta=pb.TextDelta(text="sub says hi\n")),
        ]
    )
    assert "failed" in out and "no such file" in out and "│ sub says hi" in out


def test_the_meter_carries_over_between_turns():
    meter = ContextMeter()
    rendered([event(1, usage=pb.Usage(context_tokens=100, max_context_tokens=1000))], meter)
    out, _ = rendered([event(1, text_delta=pb.TextDelta(text="hi\n"))], meter)
    assert (meter.tokens, meter.window) == (100, 1000)
    assert "100 / 1,000" not in out  # nothing changed in that turn: no repeated meter on a pipe


def test_json_mode_prints_one_object_per_event(capsys):
    from palimpsest.cli.output import Output

    turn = JsonTurn(Output(json=True))
    for e in a_turn():
        turn.handle(e)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(a_turn())
    import json

    assert json.loads(lines[-1])["stream_end"]["reason"] == "STREAM_END_REASON_COMPLETED"
    assert turn.outcome.text.endswith("Second line.")


def test_previews_and_arguments_are_kept_short():
    assert preview_of("\n".join(f"line {i}" for i in range(20))).endswith("\n…")
    assert len(preview_of("x" * 5000)) <= 800
    assert arguments_line('{"path": "/tmp/a", "n": 3}') == 'path="/tmp/a", n=3'
    assert arguments_line("[1, 2]") == "[1, 2]"


# -- picking the most recent session --------------------------------------------------------------
class FakeStore:
    """ListSessions as the store answers it: pinned first, then newest activity first."""

    def __init__(self, rows: list[tuple[str, bool, int]], page: int = 2) -> None:
        ordered = sorted(rows, key=lambda r: (not r[1], -r[2]))
        self.rows = [common_pb2.SessionSummary(id=i, pinned=p, last_active=Timestamp(seconds=t)) for i, p, t in ordered]
        self.page = page
        self.calls = 0

    def ListSessions(self, request: store_pb.ListSessionsRequest) -> store_pb.ListSessionsResponse:
        self.calls += 1
        chunk = self.rows[request.offset : request.offset + self.page]
        return store_pb.ListSessionsResponse(
            sessions=chunk, total=len(self.rows), has_more=request.offset + len(chunk) < len(self.rows)
        )


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([("old-pinned", True, 10), ("newest", False, 50), ("older", False, 40)], "newest"),
        (
            [("fresh-pinned", True, 90), ("a", True, 20), ("b", True, 30), ("newest-unpinned", False, 50)],
            "fresh-pinned",
        ),
        ([("only-pinned", True, 5)], "only-pinned"),
    ],
)
def test_the_most_recent_session_is_found_below_pinned_ones(rows, expected):
    assert most_recent_session(FakeStore(rows)) == expected  # type: ignore[arg-type]


def test_no_session_at_all_says_how_to_start_one():
    with pytest.raises(CliError, match="pal run"):
        most_recent_session(FakeStore([]))  # type: ignore[arg-type]


def test_a_shared_file_is_one_line_with_the_command_that_fetches_it():
    from palimpsest.cli.render import file_line
    from palimpsest.v1 import agent_pb2

    link = "palimpsest://sessions/abc/files/report.html"
    viewed = file_line(
        agent_pb2.FileShared(
            name="report.html", link=link, content_type="text/html", size=2048, viewer="html", title="Q3", sandbox=True
        )
    )
    assert viewed.plain == (
        f"📎 Q3 · report.html · text/html · 2,048 bytes · to view (html, sandboxed): pal files get {link}"
    )
    downloaded = file_line(agent_pb2.FileShared(name="a.zip", link=link, content_type="application/zip", size=1))
    assert "to download: pal files get" in downloaded.plain


def test_a_window_the_model_cannot_give_is_noted_once_at_the_turns_start():
    out, view = rendered(
        [
            event(
                1, model_info=pb.ModelInfo(model="small-model", context_window=16384, requested_context_window=65536)
            ),
            event(2, stream_end=pb.StreamEnd(reason=pb.STREAM_END_REASON_COMPLETED)),
        ]
    )
    assert "asks for a 65,536-token window" in out and "trained on 16,384" in out
    assert view.meter.window == 16384
    plain, _ = rendered(a_turn())
    assert "asks for" not in plain

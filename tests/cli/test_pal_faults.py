"""`pal` under a misbehaving server: grpc_testing's channel plays the services' side call by call.

Faults a real server will not produce on demand — a stream cut mid-turn, each failure status, a newer
server's events, a first event that never comes, a call that never answers — scripted here, with pal
run in-process (`cli.run`, through `connection.open_channel`). No sockets, no servers: each test takes
well under a second.

pal runs in the main thread (its Ctrl-C handling installs a SIGINT handler, which only the main
thread may); the server's side is played by a script in a thread of its own.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import pytest

_ROOT_HANDLERS = list(logging.getLogger().handlers)
import grpc_testing  # noqa: E402

# grpc_testing calls logging.basicConfig() when imported: a stderr handler on the root logger of the
# whole test process (collection imports this module in every worker). Take it back.
for _added in [h for h in logging.getLogger().handlers if h not in _ROOT_HANDLERS]:
    logging.getLogger().removeHandler(_added)
from grpc_health.v1 import health_pb2

from palimpsest.cli import cli, connection, streaming
from palimpsest.cli.commands.info import HEALTH_TIMEOUT_S
from palimpsest.cli.connection import UNARY_TIMEOUT_S
from palimpsest.cli.errors import EXIT_NOPERM, EXIT_TEMPFAIL, EXIT_UNAVAILABLE
from palimpsest.cli.render import WAITING
from palimpsest.cli.streaming import STOP_TIMEOUT_S
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import session_store_pb2 as store_pb

AGENT = pb.DESCRIPTOR.services_by_name["Agent"]
STORE = store_pb.DESCRIPTOR.services_by_name["SessionStore"]
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
RUN_STREAM = AGENT.methods_by_name["RunStream"]
STOP = AGENT.methods_by_name["Stop"]
RESUME_STREAM = AGENT.methods_by_name["ResumeStream"]
LIST_SESSIONS = STORE.methods_by_name["ListSessions"]
CHECK = HEALTH.methods_by_name["Check"]
LIST_PROFILES = AGENT.methods_by_name["ListProfiles"]
SESSION = "5f0c3e9a-1111-4222-8333-444455556666"
# Every wait on the other side is bounded: a pal that misbehaves fails the test, never hangs it.
BOUND_S = 10.0


def full_name(method: Any) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


class _Noted:
    """A multicallable that notes each call's timeout, then hands the call on unchanged."""

    def __init__(self, inner: Any, method: str, timeouts: dict[str, list[float | None]]) -> None:
        self._inner, self._method, self._timeouts = inner, method, timeouts

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        self._timeouts.setdefault(self._method, []).append(timeout)
        return self._inner(request, timeout=timeout, **kwargs)


class _NotedStream(_Noted, grpc.UnaryStreamMultiCallable):
    """pal tells streams from unary calls by their multicallable's type: keep it a stream's."""

    def __init__(self, inner: Any, method: str, timeouts: dict[str, list[float | None]], read: _Reads) -> None:
        super().__init__(inner, method, timeouts)
        self._read = read

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return _CountedCall(super().__call__(request, timeout=timeout, **kwargs), self._read)


class _Reads:
    """How many responses pal has taken from its streams. grpc_testing drops the responses still queued
    when the server ends a call with an error, where a real transport delivers them first; so a script
    waits until pal has read what it sent before it cuts the stream."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def add(self) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def reach(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.count >= n, timeout=BOUND_S), f"pal read {self.count} of {n}"


class _CountedCall:
    """A stream call whose reads are counted; everything else is the call's own."""

    def __init__(self, call: Any, read: _Reads) -> None:
        self._call, self._read = call, read

    def __iter__(self) -> _CountedCall:
        return self

    def __next__(self) -> Any:
        response = next(self._call)
        self._read.add()
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class Services:
    """The server's side of every channel pal opens, played by a test script.

    grpc_testing has no transport, so nothing expires a call at its deadline; the channel notes the
    timeout pal gave each call, and `expire` does what gRPC's core does when it runs out.
    """

    def __init__(self) -> None:
        self.channel = grpc_testing.channel([AGENT, STORE, HEALTH], grpc_testing.strict_real_time())
        self.timeouts: dict[str, list[float | None]] = {}
        self.read = _Reads()
        self._enders: list[Callable[[], None]] = []

    # What pal's generated stubs call on a channel.
    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _Noted:
        return _Noted(self.channel.unary_unary(method, *args, **kwargs), method, self.timeouts)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> _Noted:
        return _Noted(self.channel.stream_unary(method, *args, **kwargs), method, self.timeouts)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> _NotedStream:
        return _NotedStream(self.channel.unary_stream(method, *args, **kwargs), method, self.timeouts, self.read)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:  # (pal makes no such call)
        return self.channel.stream_stream(method, *args, **kwargs)

    def close(self) -> None:
        self.channel.close()

    # The server's moves.
    def take_stream(self, method: Any = RUN_STREAM) -> tuple[Any, Any]:
        """(request, rpc) of the next call pal makes of this server-streaming method."""
        _, request, rpc = self.channel.take_unary_stream(method)
        self._enders.append(lambda: rpc.terminate((), grpc.StatusCode.INTERNAL, "the scripted server failed"))
        return request, rpc

    def take_unary(self, method: Any) -> tuple[Any, Any]:
        _, request, rpc = self.channel.take_unary_unary(method)
        self._enders.append(lambda: rpc.terminate(None, (), grpc.StatusCode.INTERNAL, "the scripted server failed"))
        return request, rpc

    def send(self, rpc: Any, events: list[pb.AgentEvent]) -> None:
        """Send these events and wait until pal has read them all."""
        with self.read.changed:
            target = self.read.count + len(events)
        for e in events:
            rpc.send_response(e)
        self.read.reach(target)

    def deadline_of(self, method: Any) -> float | None:
        """The timeout pal gave its latest call of `method` (None: no deadline)."""
        return self.timeouts[full_name(method)][-1]

    @staticmethod
    def expire(rpc: Any) -> None:
        rpc.terminate(None, (), grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def play(self, script: Callable[[Services], None]) -> Future[None]:
        """Run the server's side in a thread. Should the script fail, or still wait after BOUND_S for
        something pal never does (say, cancel), every call it took ends: pal returns, and the test
        reports the script's failure instead of hanging."""
        done: Future[None] = Future()

        def run() -> None:
            try:
                script(self)
            except BaseException as err:  # noqa: BLE001 — handed to the test through the future
                self._end_all()
                done.set_exception(err)
            else:
                done.set_result(None)

        threading.Thread(target=run, name="scripted-server", daemon=True).start()
        watchdog = threading.Timer(BOUND_S, lambda: done.done() or self._end_all())
        watchdog.daemon = True
        watchdog.start()
        done.add_done_callback(lambda _: watchdog.cancel())
        return done

    def _end_all(self) -> None:
        for end in self._enders:
            end()


def event(seq: int, **kind: Any) -> pb.AgentEvent:
    return pb.AgentEvent(session_id=SESSION, seq=seq, **kind)


def answer_start() -> list[pb.AgentEvent]:
    return [
        event(1, model_info=pb.ModelInfo(model="qwen3.6", context_window=8192)),
        event(2, text_delta=pb.TextDelta(text="The first half of the answer\nand a line")),
        event(3, text_delta=pb.TextDelta(text=" still being written")),
    ]


def stream_end(seq: int, reason: int = pb.STREAM_END_REASON_COMPLETED, text: str = "") -> pb.AgentEvent:
    return event(seq, stream_end=pb.StreamEnd(reason=reason, text=text))


class Pal:
    """`pal ARGS` in this process against scripted services: exit code, stdout, stderr."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.monkeypatch, self.capsys = monkeypatch, capsys
        self.services = Services()
        monkeypatch.setattr(connection, "open_channel", lambda target, options, credentials=None: self.services)
        # Predictable addresses, whatever the machine running the tests has set.
        for endpoint in connection.ENDPOINTS:
            monkeypatch.setenv(endpoint.env, endpoint.default)
        monkeypatch.delenv("PALIMPSEST_TOKEN", raising=False)
        monkeypatch.setenv("COLUMNS", "200")

    def __call__(
        self, *argv: str, server: Callable[[Services], None], screen: io.StringIO | None = None, stdin: str = ""
    ) -> tuple[int, str, str]:
        """`screen`: pal's stdout instead of the captured one; `stdin`: what pal reads (both set here,
        in the test's call phase: pytest puts its own capture back after a fixture's setup)."""
        if screen is not None:
            self.monkeypatch.setattr(sys, "stdout", screen)
        self.monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        played = self.services.play(server)
        code = cli.run(list(argv))
        played.result(timeout=BOUND_S)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def pal(monkeypatch, capsys) -> Pal:
    return Pal(monkeypatch, capsys)


def one_line(err: str, *words: str) -> str:
    """The failure contract: exactly one line on stderr, never a traceback, with these words."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# -- a stream cut mid-turn ----------------------------------------------------------------------------
def cut_after_three(services: Services) -> None:
    _, rpc = services.take_stream()
    services.send(rpc, answer_start())
    rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")


def test_a_stream_cut_mid_turn_keeps_what_arrived_and_says_where_the_rest_is(pal):
    code, out, err = pal("run", "write me an answer", server=cut_after_three)
    assert "The first half of the answer" in out and "and a line still being written" in out
    line = one_line(err, "interrupted", f"pal sessions show {SESSION}", "lost the connection to the Agent")
    assert line.startswith("pal: ")
    assert code == EXIT_UNAVAILABLE


def test_a_stream_cut_mid_turn_in_json_leaves_only_whole_json_lines(pal):
    code, out, err = pal("run", "--json", "write me an answer", server=cut_after_three)
    events = [json.loads(line) for line in out.splitlines()]  # every line parses, none is torn
    assert [e["seq"] for e in events] == ["1", "2", "3"]  # int64 is a string in proto3 JSON
    one_line(err, "interrupted", f"pal sessions show {SESSION}")
    assert code == EXIT_UNAVAILABLE


def test_a_stream_closed_without_stream_end_is_an_interrupted_turn_too(pal):
    def closes_early(services: Services) -> None:
        _, rpc = services.take_stream()
        for e in answer_start():
            rpc.send_response(e)
        rpc.terminate((), grpc.StatusCode.OK, "")

    code, out, err = pal("run", "write me an answer", server=closes_early)
    assert "still being written" in out
    one_line(err, "interrupted", "before the turn ended", f"pal sessions show {SESSION}")
    assert code == 1


def test_a_stream_lost_after_stream_end_is_a_complete_turn(pal):
    def ends_then_drops(services: Services) -> None:
        _, rpc = services.take_stream()
        services.send(rpc, [*answer_start(), stream_end(4, text="whole")])
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")

    code, out, err = pal("run", "--json", "write me an answer", server=ends_then_drops)
    assert json.loads(out.splitlines()[-1])["stream_end"]["text"] == "whole"
    assert err == "" and code == 0


def test_chat_goes_on_in_the_same_session_after_a_turn_is_cut(pal):
    def cut_then_answer(services: Services) -> None:
        first, rpc = services.take_stream()
        assert first.session_id == ""  # a new session: its id comes with the first event
        services.send(rpc, answer_start())
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")
        second, rpc = services.take_stream()
        assert (second.session_id, second.text) == (SESSION, "are you there?")
        rpc.send_response(stream_end(1, text="yes"))
        rpc.terminate((), grpc.StatusCode.OK, "")

    code, out, err = pal("chat", "--json", server=cut_then_answer, stdin="write me an answer\nare you there?\n")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == ["1", "2", "3", "1"]
    assert (
        f"error: the turn was interrupted: lost the connection to the Agent at 127.0.0.1:50053: did it stop? "
        f"· what the session kept: pal sessions show {SESSION}" in err
    )
    assert "Traceback" not in err and code == 0


# -- a stream cut mid-turn, resumed (events that name their turn: an Agent with ResumeStream) ----------
TURN = "7d1e2f3a4b5c6d7e8f9a0b1c2d3e4f50"


def turn_events(events: list[pb.AgentEvent]) -> list[pb.AgentEvent]:
    for e in events:
        e.turn_id = TURN
    return events


def rest_of_answer() -> list[pb.AgentEvent]:
    return turn_events(
        [
            event(4, text_delta=pb.TextDelta(text=", and its end.")),
            stream_end(5, text="The first half of the answer\nand a line still being written, and its end."),
        ]
    )


@pytest.fixture
def quick_resume(monkeypatch):
    monkeypatch.setattr(streaming, "RESUME_WAITS_S", (0.0, 0.0, 0.0))


def test_a_stream_cut_mid_turn_is_resumed_from_the_last_event_shown(pal, quick_resume):
    def cut_then_resume(services: Services) -> None:
        _, rpc = services.take_stream()
        services.send(rpc, turn_events(answer_start()))
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")
        request, resumed = services.take_stream(RESUME_STREAM)
        assert (request.session_id, request.turn_id, request.after_seq) == (SESSION, TURN, 3)
        services.send(resumed, rest_of_answer())
        resumed.terminate((), grpc.StatusCode.OK, "")

    code, out, err = pal("run", "--json", "write me an answer", server=cut_then_resume)
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == ["1", "2", "3", "4", "5"]  # each shown once, in order
    assert events[-1]["stream_end"]["text"].endswith("and its end.")
    assert "resuming the turn" in err and "Traceback" not in err and code == 0


def test_a_resume_that_cannot_reach_the_agent_tries_again_then_says_the_turn_was_interrupted(pal, quick_resume):
    def cut_and_gone(services: Services) -> None:
        _, rpc = services.take_stream()
        services.send(rpc, turn_events(answer_start()))
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")
        for _ in streaming.RESUME_WAITS_S:
            _, resumed = services.take_stream(RESUME_STREAM)
            resumed.terminate((), grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")

    code, out, err = pal("run", "write me an answer", server=cut_and_gone)
    assert "still being written" in out and "resuming the turn" in out
    one_line(err, "interrupted", "lost the connection to the Agent", f"pal sessions show {SESSION}")
    assert code == EXIT_UNAVAILABLE


def test_a_turn_the_agent_no_longer_keeps_is_an_interrupted_turn_saying_why(pal, quick_resume):
    def cut_and_forgotten(services: Services) -> None:
        _, rpc = services.take_stream()
        services.send(rpc, turn_events(answer_start()))
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")
        _, resumed = services.take_stream(RESUME_STREAM)
        resumed.terminate((), grpc.StatusCode.NOT_FOUND, f"turn {TURN} of session {SESSION} is not kept by this Agent")

    code, out, err = pal("run", "write me an answer", server=cut_and_forgotten)
    assert "resuming the turn" in out
    one_line(err, "interrupted", "resuming it: ", "is not kept by this Agent", f"pal sessions show {SESSION}")
    assert code == EXIT_UNAVAILABLE


def test_ctrl_c_after_a_resume_stops_the_resumed_turn(pal, quick_resume, terminal):
    def cut_resume_and_stop(services: Services) -> None:
        _, rpc = services.take_stream()
        services.send(rpc, turn_events(answer_start()))
        rpc.terminate((), grpc.StatusCode.UNAVAILABLE, "Socket closed")
        _, resumed = services.take_stream(RESUME_STREAM)
        services.send(resumed, turn_events([event(4, text_delta=pb.TextDelta(text=" and more"))]))
        assert terminal.shows("and more")  # rendered: pal waits for the next event
        ctrl_c()
        request, stop = services.take_unary(STOP)
        assert request.session_id == SESSION
        stop.terminate(pb.StopResponse(stopped=True), (), grpc.StatusCode.OK, "")
        services.send(resumed, turn_events([stream_end(5, reason=pb.STREAM_END_REASON_STOPPED)]))
        resumed.terminate((), grpc.StatusCode.OK, "")

    code, _, err = pal("run", "write me an answer", server=cut_resume_and_stop, screen=terminal)
    assert "stopping the turn" in terminal.getvalue()
    assert "Traceback" not in err and code == 130


# -- each failure status, in the user's words ---------------------------------------------------------
# (status, exit code, words the line must carry: what happened and what to do)
STATUSES = [
    (grpc.StatusCode.DEADLINE_EXCEEDED, EXIT_TEMPFAIL, ("did not answer in time", "try again")),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 1, ("limit", "delete or trim")),
    (grpc.StatusCode.PERMISSION_DENIED, EXIT_NOPERM, ("not allowed", "PALIMPSEST_TOKEN")),
    (grpc.StatusCode.UNAUTHENTICATED, EXIT_NOPERM, ("PALIMPSEST_TOKEN",)),
    (grpc.StatusCode.FAILED_PRECONDITION, 1, ("refused",)),
    (grpc.StatusCode.ABORTED, EXIT_TEMPFAIL, ("got there first", "try again")),
]
CODE_IDS = [s[0].name for s in STATUSES]


@pytest.mark.parametrize(("status", "exit_code", "words"), STATUSES, ids=CODE_IDS)
def test_a_failed_unary_call_is_one_line_with_its_exit_code(pal, status, exit_code, words):
    def fails(services: Services) -> None:
        _, rpc = services.take_unary(LIST_SESSIONS)
        rpc.terminate(None, (), status, "")

    code, out, err = pal("sessions", "list", server=fails)
    assert out == ""
    one_line(err, *words)
    assert code == exit_code


@pytest.mark.parametrize(("status", "exit_code", "words"), STATUSES[1:], ids=CODE_IDS[1:])
def test_a_server_that_explains_a_failure_is_quoted(pal, status, exit_code, words):
    """Our services' details are written for people (they name the limit, the owner, the state);
    DEADLINE_EXCEEDED is left out: its details are gRPC's, never the server's."""

    def explains(services: Services) -> None:
        _, rpc = services.take_unary(LIST_SESSIONS)
        rpc.terminate(None, (), status, "the server's own words")

    code, _, err = pal("sessions", "list", server=explains)
    one_line(err, "the server's own words")
    assert code == exit_code


@pytest.mark.parametrize(("status", "exit_code", "words"), STATUSES, ids=CODE_IDS)
@pytest.mark.parametrize("json_mode", [False, True], ids=["human", "json"])
def test_a_turn_refused_before_its_first_event_is_one_line_with_its_exit_code(pal, status, exit_code, words, json_mode):
    def refuses(services: Services) -> None:
        _, rpc = services.take_stream()
        rpc.terminate((), status, "")

    code, out, err = pal("run", *(["--json"] if json_mode else []), "hello", server=refuses)
    line = one_line(err, *words)
    assert "interrupted" not in line  # nothing had started
    assert out.strip() == "" or not json_mode
    assert code == exit_code


# -- a newer server -----------------------------------------------------------------------------------
def unknown_kind(seq: int) -> pb.AgentEvent:
    """An event whose kind this pal does not know: field 26 of the oneof, from a newer .proto."""
    # Tag (26 << 3 | 2) as a varint is 0xD2 0x01; then 2 bytes of a message holding field 1 = 1.
    newer = event(seq).SerializeToString() + bytes([0xD2, 0x01, 2, 0x08, 0x01])
    return pb.AgentEvent.FromString(newer)


def newer_server(services: Services) -> None:
    _, rpc = services.take_stream()
    rpc.send_response(event(1, model_info=pb.ModelInfo(model="qwen3.6", context_window=8192)))
    rpc.send_response(unknown_kind(2))
    rpc.send_response(event(3))  # the oneof unset: a kind that did not survive the old schema at all
    rpc.send_response(event(4, text_delta=pb.TextDelta(text="still answered\n")))
    rpc.send_response(stream_end(5, reason=42, text="still answered"))
    rpc.terminate((), grpc.StatusCode.OK, "")


def test_unknown_event_kinds_are_skipped_and_unknown_reasons_print_as_numbers(pal):
    code, out, err = pal("run", "hello", server=newer_server)
    assert "still answered" in out
    assert "turn ended (reason 42)" in out  # the end reason this pal has no name for
    assert "Traceback" not in err and code == 0


def test_json_skips_unknown_event_kinds_and_keeps_unknown_enum_numbers(pal):
    code, out, err = pal("run", "--json", "hello", server=newer_server)
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == ["1", "4", "5"]
    assert events[-1]["stream_end"]["reason"] == 42
    assert err == "" and code == 0


def test_health_prints_a_serving_status_it_does_not_know_as_its_number(pal):
    def newer_health(services: Services) -> None:
        # SessionStore, Compressor, Agent, then the Agent's Ollama entry, the OLLAMA_HOST the Agent
        # names in ListProfiles, its sandbox entry and its MCP entry.
        for _ in range(4):
            _, rpc = services.take_unary(CHECK)
            rpc.terminate(health_pb2.HealthCheckResponse(status=7), (), grpc.StatusCode.OK, "")
        _, rpc = services.take_unary(LIST_PROFILES)
        rpc.terminate(pb.ListProfilesResponse(ollama_host="http://gpu-box:11434"), (), grpc.StatusCode.OK, "")
        _, rpc = services.take_unary(CHECK)
        rpc.terminate(health_pb2.HealthCheckResponse(status=7), (), grpc.StatusCode.OK, "")
        _, rpc = services.take_unary(CHECK)  # the Agent's `mcp` entry: none, no profile names a server
        rpc.terminate(health_pb2.HealthCheckResponse(), (), grpc.StatusCode.NOT_FOUND, "unknown service")

    code, out, err = pal("health", "--json", server=newer_health)
    rows = json.loads(out)["services"]
    assert [row["status"] for row in rows] == ["7", "7", "7", "7", "7"]
    assert [row["service"] for row in rows[-2:]] == ["Ollama", "Sandbox"]
    assert rows[-2]["address"] == "http://gpu-box:11434"
    assert "Traceback" not in err and code == 1  # not SERVING is not healthy


# -- a slow first event, and Ctrl-C -------------------------------------------------------------------
class Terminal(io.StringIO):
    """pal's stdout as a terminal (so the spinner runs); `shows(text)` waits until text was written."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.Condition()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._written:
            n = super().write(text)
            self._written.notify_all()
            return n

    def shows(self, text: str) -> bool:
        with self._written:
            return self._written.wait_for(lambda: text in self.getvalue(), timeout=BOUND_S)


def ctrl_c() -> None:
    """What the terminal does on Ctrl-C, aimed at the thread that runs pal (and its handler)."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


@pytest.fixture
def terminal() -> Terminal:
    assert threading.current_thread() is threading.main_thread()  # pal's SIGINT handler needs it
    return Terminal()


def test_ctrl_c_while_waiting_for_the_first_event_cancels_the_call(pal, terminal):
    def slow(services: Services) -> None:
        _, rpc = services.take_stream()
        assert services.deadline_of(RUN_STREAM) is None  # a turn may run long: Ctrl-C ends it, not a clock
        assert terminal.shows(WAITING), "the spinner never showed"
        ctrl_c()
        rpc.cancelled()  # returns once pal cancelled the call

    code, _, err = pal("run", "hello", server=slow, screen=terminal)
    assert "turn stopped" in terminal.getvalue()
    assert "Traceback" not in err and code == 130


def test_ctrl_c_in_a_session_asks_the_agent_to_stop_and_cancels_when_stop_never_answers(pal, terminal):
    def slow_and_deaf(services: Services) -> None:
        _, turn = services.take_stream()
        assert terminal.shows(WAITING), "the spinner never showed"
        ctrl_c()
        request, stop = services.take_unary(STOP)
        assert request.session_id == SESSION
        assert services.deadline_of(STOP) == STOP_TIMEOUT_S
        services.expire(stop)
        turn.cancelled()  # the Stop that never answered ended at its deadline; the call was cancelled

    code, _, err = pal("continue", "--id", SESSION, "hello", server=slow_and_deaf, screen=terminal)
    screen = terminal.getvalue()
    assert "stopping the turn" in screen and "turn stopped" in screen
    assert "Traceback" not in err and code == 130


# -- deadlines ----------------------------------------------------------------------------------------
def test_a_unary_call_that_never_answers_ends_at_its_deadline(pal):
    def never_answers(services: Services) -> None:
        _, rpc = services.take_unary(LIST_SESSIONS)
        assert services.deadline_of(LIST_SESSIONS) == UNARY_TIMEOUT_S
        services.expire(rpc)

    code, out, err = pal("sessions", "list", server=never_answers)
    one_line(err, "the SessionStore at 127.0.0.1:50051 did not answer in time")
    assert out == "" and code == EXIT_TEMPFAIL


def test_a_health_check_that_never_answers_ends_at_its_shorter_deadline(pal):
    def never_answers(services: Services) -> None:
        for _ in range(3):  # SessionStore, Compressor, Agent; an unreachable Agent is not asked about Ollama
            _, rpc = services.take_unary(CHECK)
            assert services.deadline_of(CHECK) == HEALTH_TIMEOUT_S
            services.expire(rpc)

    code, out, err = pal("health", "--json", server=never_answers)
    rows = json.loads(out)["services"]
    assert {row["status"] for row in rows} == {"UNREACHABLE"}
    assert all("did not answer in time" in row["error"] for row in rows)
    assert err == "" and code == 1

"""A real HTTP server speaking Ollama's protocol, for tests and local runs.

Standard library only: a ThreadingHTTPServer on a background thread, so sync tests, async tests
and ``python -m ollama_sim`` all drive the same object. Everything a test may want to
assert on (requests, prompt truncation, early client disconnects) is recorded thread-safely.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from . import catalog, chat, engines, families
from .embed import embed_text
from .models import COMPLETION, THINKING, TOOLS, ModelSpec, Reply, default_models
from .prompt import closing_tokens, count_text_tokens, rendered_turns
from .records import ChatRecord, RecordedRequest

log = logging.getLogger(__name__)

# An old-runner Ollama (before 0.30.0) that ignores `truncate`; "0.30.0" or later is llama-server.
VERSION = "0.12.0"
# Ollama's own default when the client sends no options.num_ctx (small machines).
DEFAULT_NUM_CTX = 4096
# How often a paused handler re-checks for a vanished client or a stopping server.
_POLL_SECONDS = 0.05

JsonObject = dict[str, Any]
_JSON = "application/json; charset=utf-8"
Responder = Callable[[Mapping[str, Any]], Reply]


class _ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


class _Stopping(Exception):
    """The simulator is shutting down; abandon the answer quietly."""


class OllamaSimulator:
    """Ollama on 127.0.0.1: ``start()``, point a client at ``url``, ``stop()`` (or ``with``)."""

    def __init__(
        self,
        models: Mapping[str, ModelSpec] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        responder: Responder | None = None,
        version: str = VERSION,
    ) -> None:
        self.models: dict[str, ModelSpec] = dict(models) if models is not None else default_models()
        self.version = version
        self._address = (host, port)
        self._responder: Responder = responder or chat.default_reply
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._replies: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._chats: list[ChatRecord] = []
        self._refusals = 0
        # Per model, the rendered turns of the last prompt read: what the prompt cache holds.
        self._prompt_cache: dict[str, list[str]] = {}
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._embed_status: int | None = None
        self._embed_delay = 0.0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def engine(self) -> str:
        """The engine the reported version stands for: engines.RUNNERS or engines.LLAMA_SERVER."""
        return engines.engine_for(self.version)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_SECONDS},
            name=f"ollama-sim:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        # Idle keep-alive connections would otherwise hold handler threads (and clients) open.
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _shutdown_quietly(connection)
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server, self._thread = None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._address[0]}:{self.port}"

    # -- scripting ---------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue answers for the next /api/chat requests, consumed in order."""
        with self._lock:
            self._replies.extend(replies)

    def set_responder(self, responder: Responder | None) -> None:
        """Answer unscripted requests with ``responder(body)`` (None: the default echo)."""
        with self._lock:
            self._responder = responder or chat.default_reply

    def set_embed_fault(self, status: int | None = None, delay: float = 0.0) -> None:
        """/api/embed answers `status` with an error (an overloaded or broken Ollama), or only
        after `delay` seconds (a slow one); both None/0: answers normally again."""
        with self._lock:
            self._embed_status, self._embed_delay = status, delay

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        with self._lock:
            return len(self._replies)

    # -- observations ------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def bodies(self, path: str = "/api/chat") -> list[Any]:
        """Parsed bodies of the requests made to one path, in arrival order."""
        return [r.body for r in self.requests if r.path == path]

    @property
    def chats(self) -> list[ChatRecord]:
        with self._lock:
            return list(self._chats)

    @property
    def truncations(self) -> int:
        """How many prompts were silently cut to fit num_ctx."""
        return sum(1 for c in self.chats if c.truncated)

    @property
    def refusals(self) -> int:
        """How many chat requests were refused with HTTP 400 as over the context window."""
        with self._lock:
            return self._refusals

    @property
    def disconnects(self) -> int:
        """How many chat answers the client abandoned by closing the connection."""
        return sum(1 for c in self.chats if c.disconnected)

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until ``predicate()`` holds; it is re-checked whenever a record changes.

        Disconnects are noticed by the handler thread after the client has gone, so tests
        asserting them should wait rather than read the counter immediately.
        """
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def clear(self) -> None:
        """Forget recorded requests, chat records and unconsumed scripted replies."""
        with self._lock:
            self._requests.clear()
            self._chats.clear()
            self._replies.clear()
            self._refusals = 0
            self._prompt_cache.clear()

    # -- used by the handler -----------------------------------------------------------------

    def resolve(self, name: str) -> ModelSpec | None:
        """Ollama treats "m" and "m:latest" as the same model."""
        for candidate in (name, name.removesuffix(":latest"), f"{name}:latest"):
            if candidate in self.models:
                return self.models[candidate]
        return None

    def _record_request(self, path: str, body: Any) -> None:
        with self._changed:
            self._requests.append(RecordedRequest(path, body))
            self._changed.notify_all()

    def _next_reply(self, body: Mapping[str, Any]) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
            responder = self._responder
        return responder(body)

    def _refused(self) -> None:
        with self._changed:
            self._refusals += 1
            self._changed.notify_all()

    def _cached_tokens(self, model: str, texts: list[str], counts: list[int]) -> int:
        """The head of this prompt still cached from the model's last one; this prompt is cached next."""
        with self._lock:
            previous = self._prompt_cache.get(model, [])
            self._prompt_cache[model] = texts
        return engines.common_prefix_tokens(previous, texts, counts)

    def _open_chat(self, record: ChatRecord) -> None:
        with self._changed:
            self._chats.append(record)
            self._changed.notify_all()

    def _update_chat(self, record: ChatRecord, *, completed: bool = False, disconnected: bool = False) -> None:
        with self._changed:
            record.completed = record.completed or completed
            record.disconnected = record.disconnected or disconnected
            self._changed.notify_all()

    def _track(self, connection: socket.socket, alive: bool) -> None:
        with self._lock:
            if alive:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)


def _shutdown_quietly(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the other side


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # tests fire many concurrent requests

    def __init__(self, address: tuple[str, int], sim: OllamaSimulator) -> None:
        self.sim = sim
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up is routine for a test server, not worth a traceback on stderr.
        # socketserver calls this from inside its except block, so exc_info is the live error.
        log.debug("ollama-sim: connection error from %s", client_address, exc_info=True)  # noqa: LOG014


def _dumps(obj: JsonObject) -> bytes:
    # Compact, like Ollama's Go encoder.
    return json.dumps(obj, separators=(",", ":")).encode()


def _error(status: int, message: str) -> tuple[int, JsonObject]:
    return status, {"error": message}


def _reason(status: int) -> str:
    """Default error text for a scripted status; 499 and friends are not in HTTPStatus."""
    try:
        return HTTPStatus(status).phrase.lower()
    except ValueError:
        return f"status {status}"


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so clients keep connections alive; streams use chunked transfer encoding.
    protocol_version = "HTTP/1.1"
    # Ollama's Go server sets TCP_NODELAY on every connection. Without it, a chunk written right
    # after the headers on a kept-alive connection waits for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    server: _Server

    @property
    def sim(self) -> OllamaSimulator:
        return self.server.sim

    def setup(self) -> None:
        super().setup()
        self.sim._track(self.connection, alive=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # flushing to a client that already left
        finally:
            self.sim._track(self.connection, alive=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("ollama-sim: " + format, *args)

    # -- routing -----------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        # Clients probe liveness with HEAD /.
        self._send_text(HTTPStatus.OK if self.path == "/" else HTTPStatus.NOT_FOUND, "")

    def do_GET(self) -> None:
        self.sim._record_request(self.path, None)
        if self.path == "/":
            self._send_text(HTTPStatus.OK, "Ollama is running")
        elif self.path == "/api/tags":
            self._send_json(HTTPStatus.OK, self._tags())
        elif self.path == "/api/version":
            self._send_json(HTTPStatus.OK, {"version": self.sim.version})
        else:
            self._send_text(HTTPStatus.NOT_FOUND, "404 page not found")

    def do_POST(self) -> None:
        body = self._read_json()
        self.sim._record_request(self.path, body)
        routes: dict[str, Callable[[JsonObject], None]] = {
            "/api/chat": self._chat,
            "/api/show": self._show,
            "/api/embed": self._respond_with(self._embed),
        }
        route = routes.get(self.path)
        if route is None:
            self._send_text(HTTPStatus.NOT_FOUND, "404 page not found")
        elif not isinstance(body, dict):
            self._send_json(*_error(HTTPStatus.BAD_REQUEST, "invalid JSON request body"))
        else:
            route(body)

    def _respond_with(self, build: Callable[[JsonObject], tuple[int, JsonObject]]) -> Callable[[JsonObject], None]:
        return lambda body: self._send_json(*build(body))

    # -- simple endpoints ----------------------------------------------------------------------

    def _tags(self) -> JsonObject:
        return catalog.tags(self.sim.models)

    def _show(self, body: JsonObject) -> None:
        name = str(body.get("model") or body.get("name") or "")
        spec = self.sim.resolve(name)
        if spec is None:
            self._send_json(*_error(HTTPStatus.NOT_FOUND, f"model '{name}' not found"))
            return
        self._send_bytes(HTTPStatus.OK, _JSON, catalog.show_payload(spec, bool(body.get("verbose"))))

    def _embed(self, body: JsonObject) -> tuple[int, JsonObject]:
        name = str(body.get("model") or "")
        with self.sim._lock:
            status, delay = self.sim._embed_status, self.sim._embed_delay
        try:
            self._pause(delay)
        except (_ClientGone, _Stopping):  # the client gave up waiting: nobody reads an answer
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": "client gone"}
        if status is not None:
            return _error(status, "embedding failed (scripted)")
        spec = self.sim.resolve(name)
        if spec is None:
            return _error(HTTPStatus.NOT_FOUND, f"model '{name}' not found")
        raw = body.get("input", [])
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            return _error(HTTPStatus.BAD_REQUEST, "invalid input type")
        return HTTPStatus.OK, {
            "model": name,
            "embeddings": [embed_text(text, spec.embedding_length) for text in inputs],
            "total_duration": chat.LOAD_DURATION_NS,
            "load_duration": chat.LOAD_DURATION_NS,
            "prompt_eval_count": sum(count_text_tokens(text) for text in inputs),
        }

    # -- /api/chat ---------------------------------------------------------------------------

    def _chat(self, body: JsonObject) -> None:
        started = time.monotonic_ns()
        name = str(body.get("model") or "")
        problem = self._chat_problem(name, body)
        if problem is not None:
            self._send_json(*problem)
            return
        reply = self.sim._next_reply(body)
        if reply.fails_upfront:
            status = reply.http_status or HTTPStatus.INTERNAL_SERVER_ERROR
            self._send_json(*_error(status, reply.error or _reason(status)))
            return
        record = self._evaluate_prompt(name, body)
        if isinstance(record, str):
            self.sim._refused()
            self._send_json(*_error(HTTPStatus.BAD_REQUEST, record))
            return
        self.sim._open_chat(record)
        think = bool(body.get("think"))
        planned = chat.plan_messages(reply, think)
        answer = self._stream if record.stream else self._answer_once
        try:
            answer(name, reply, planned, record, started)
            self.sim._update_chat(record, completed=True)
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            self.sim._update_chat(record, disconnected=True)
            self.close_connection = True
        except _Stopping:
            self.close_connection = True

    def _chat_problem(self, name: str, body: JsonObject) -> tuple[int, JsonObject] | None:
        """The 4xx Ollama gives before generating anything, or None."""
        if not name:
            return _error(HTTPStatus.BAD_REQUEST, "model is required")
        spec = self.sim.resolve(name)
        if spec is None:
            return _error(HTTPStatus.NOT_FOUND, f"model '{name}' not found")
        messages = body.get("messages", [])
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _error(HTTPStatus.BAD_REQUEST, "messages must be a list of objects")
        options = body.get("options") or {}
        if not isinstance(options, dict) or not isinstance(options.get("num_ctx", 0), int):
            return _error(HTTPStatus.BAD_REQUEST, "options.num_ctx must be an integer")
        if body.get("think") and not spec.supports(THINKING):
            return _error(HTTPStatus.BAD_REQUEST, f'"{name}" does not support thinking')
        if body.get("tools") and not spec.supports(TOOLS):
            return _error(HTTPStatus.BAD_REQUEST, f'"{name}" does not support tools')
        if not spec.supports(COMPLETION):
            return _error(HTTPStatus.BAD_REQUEST, f'"{name}" does not support chat')
        return None

    def _evaluate_prompt(self, name: str, body: JsonObject) -> ChatRecord | str:
        """Count the prompt and fit it into num_ctx as the reported version's engine does; the
        refusal's error text when the engine refuses it."""
        spec = self.sim.resolve(name)
        assert spec is not None  # checked by _chat_problem
        options = body.get("options") or {}
        # Ollama clamps a num_ctx beyond what the model was trained on (a log line, nothing more).
        num_ctx = min(int(options.get("num_ctx") or DEFAULT_NUM_CTX), spec.context_length)
        template, count = families.counting(spec)  # the model's own turn markers and vocabulary
        rendered = rendered_turns(body.get("messages") or [], body.get("tools"), template, count)
        turns, closing = [engines.Turn(role, tokens) for role, _, tokens in rendered], closing_tokens(template, count)
        truncate = body.get("truncate", True) is not False
        engine = self.sim.engine
        if engine == engines.LLAMA_SERVER:
            num_keep = options.get("num_keep", engines.DEFAULT_NUM_KEEP)
            fit = engines.fit_llama_server(
                turns,
                closing,
                num_ctx,
                truncate,
                context_shift=spec.context_shift,
                num_keep=num_keep if isinstance(num_keep, int) else 0,
            )
        else:
            fit = engines.fit_runners(turns, closing, num_ctx, truncate, self.sim.version)
        if fit.refusal is not None:
            return fit.refusal
        cached = 0
        if engine == engines.LLAMA_SERVER:
            kept = [rendered[i] for i in fit.kept_turns]
            cached = self.sim._cached_tokens(name, [text for _, text, _ in kept], [t for _, _, t in kept])
        return ChatRecord(
            model=name,
            stream=body.get("stream", True) is not False,
            prompt_tokens=fit.prompt_tokens,
            num_ctx=num_ctx,
            # llama-server reports cache_n + prompt_n: the whole prompt it read, cached head included.
            prompt_eval_count=fit.kept_tokens,
            truncated=fit.truncated,
            engine=engine,
            dropped_messages=fit.dropped_messages,
            cached_tokens=min(cached, fit.kept_tokens),
        )

    def _final_fields(self, reply: Reply, planned: list[JsonObject], record: ChatRecord, started: int) -> JsonObject:
        metrics = chat.final_metrics(
            record.prompt_eval_count,
            chat.eval_tokens(planned),
            time.monotonic_ns() - started,
            record.cached_tokens,
        )
        return {"done_reason": reply.done_reason, **metrics}

    def _stream(self, name: str, reply: Reply, planned: list[JsonObject], record: ChatRecord, started: int) -> None:
        self._start_stream()
        self._pause(reply.first_chunk_delay)
        limit = len(planned) if reply.error_after_chunks is None else min(reply.error_after_chunks, len(planned))
        for index, message in enumerate(planned[:limit]):
            if index:
                self._pause(reply.chunk_delay)
            self._send_line(chat.chunk(name, message))
        if reply.error_after_chunks is not None:
            # Once streaming has begun the status is already 200: the error is the last line.
            self._send_line({"error": reply.error or "simulated failure during generation"})
        else:
            final = chat.chunk(name, chat.assistant_message(), done=True)
            self._send_line({**final, **self._final_fields(reply, planned, record, started)})
        self._end_stream()

    def _answer_once(
        self, name: str, reply: Reply, planned: list[JsonObject], record: ChatRecord, started: int
    ) -> None:
        # Generation takes as long as the stream would have; the client just sees the end.
        self._pause(reply.first_chunk_delay + reply.chunk_delay * max(0, len(planned) - 1))
        if reply.error_after_chunks is not None:
            self._send_json(*_error(HTTPStatus.INTERNAL_SERVER_ERROR, reply.error or "simulated failure"))
            return
        answer = chat.chunk(name, chat.merge_messages(planned), done=True)
        self._send_json(HTTPStatus.OK, {**answer, **self._final_fields(reply, planned, record, started)})

    # -- I/O helpers -------------------------------------------------------------------------

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            return json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def _send_bytes(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send_json(self, status: int, obj: JsonObject) -> None:
        self._send_bytes(status, _JSON, _dumps(obj))

    def _send_text(self, status: int, text: str) -> None:
        self._send_bytes(status, "text/plain; charset=utf-8", text.encode())

    def _start_stream(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send_line(self, obj: JsonObject) -> None:
        """One NDJSON line as one HTTP chunk, so the client sees it immediately."""
        if self._client_gone():
            raise _ClientGone
        line = _dumps(obj) + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """True when the client closed its end (readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _pause(self, seconds: float) -> None:
        """Sleep, but notice a client hanging up or the simulator stopping while we wait."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.sim._stopping.is_set():
                raise _Stopping
            readable, _, _ = select.select([self.connection], [], [], min(remaining, _POLL_SECONDS))
            if readable:
                if self._client_gone():
                    raise _ClientGone
                # Pipelined bytes, not a hang-up: keep waiting without spinning.
                time.sleep(min(remaining, _POLL_SECONDS))

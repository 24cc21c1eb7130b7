"""The one Ollama HTTP client, shared by the Agent and the Compressor (httpx.AsyncClient)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from palimpsest.shared.errors import FailedPrecondition, NotFound, PalimpsestError, Unavailable

log = logging.getLogger("palimpsest.ollama")

LARGE_BODY_BYTES = 1 << 20  # an answer this large is parsed in a thread


class OllamaStreamError(Unavailable):
    """Ollama reported an error after the stream had begun (a final `{"error": …}` line)."""


class ContextRefused(FailedPrecondition):
    """Ollama refused the prompt as longer than the model's context window (HTTP 400 to a request
    sent with ``truncate: false``): proof that it does not fit, where it would otherwise have lost
    its oldest messages without a word."""


# How each engine words that refusal: llama-server's, Ollama's own where a model has no context
# shift, and the old runners' (which honour `truncate` since v0.12.6).
CONTEXT_REFUSALS = (
    "exceeds the available context size",
    "longer than the context length",
    "input length exceeds the context length",
)


def is_context_refusal(status: int, message: str) -> bool:
    lowered = message.lower()
    return status == 400 and any(text in lowered for text in CONTEXT_REFUSALS)


@dataclass(frozen=True)
class ModelFacts:
    name: str
    context_length: int
    capabilities: frozenset[str]

    @property
    def vision(self) -> bool:
        return "vision" in self.capabilities

    @property
    def tools(self) -> bool:
        return "tools" in self.capabilities

    @property
    def thinking(self) -> bool:
        return "thinking" in self.capabilities

    def usable_window(self, requested: int) -> int:
        """The num_ctx a call gets: what was asked for, at most what the model was trained on
        (Ollama clamps a larger one with only a log line; 0: unknown, the request stands)."""
        return min(requested, self.context_length) if self.context_length > 0 else requested


@dataclass
class ChatResult:
    """Everything one /api/chat call produced, accumulated over all chunks."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    done_reason: str = ""
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    model: str = ""
    elapsed_seconds: float = 0.0  # the call as its caller waited for it, request to last chunk

    def absorb(self, chunk: dict[str, Any]) -> None:
        message = chunk.get("message") or {}
        self.content += message.get("content") or ""
        self.thinking += message.get("thinking") or ""
        self.tool_calls.extend(message.get("tool_calls") or [])
        self.model = chunk.get("model") or self.model
        if chunk.get("done"):
            self.done_reason = chunk.get("done_reason") or "stop"
            self.prompt_eval_count = chunk.get("prompt_eval_count")
            self.eval_count = chunk.get("eval_count")


def _not_running(host: str) -> Unavailable:
    return Unavailable(
        f"Ollama is not answering at {host} (OLLAMA_HOST): start it with `ollama serve`, "
        "or point OLLAMA_HOST at a running Ollama"
    )


def _error_for(status: int, body: str, model: str, host: str) -> PalimpsestError:
    try:
        message = json.loads(body).get("error") or body
    except (ValueError, AttributeError):
        message = body
    if status == 404:
        return NotFound(f"model '{model}' is not available in Ollama at {host}: run `ollama pull {model}`")
    if is_context_refusal(status, str(message)):
        return ContextRefused(
            f"Ollama refused the prompt for model '{model}' as longer than its context window: {message}"
        )
    if status == 400:
        return FailedPrecondition(f"Ollama refused the request for model '{model}': {message}")
    return Unavailable(f"Ollama at {host} answered {status}: {message}")


# A model re-pulled under its name (another context length, new capabilities) is seen within this
# long: cached facts older than it are read again in the background, never on a turn's path.
FACTS_TTL_S = 60.0


class OllamaClient:
    def __init__(
        self, host: str, *, timeout: float = 600.0, connect_timeout: float = 5.0, facts_ttl_s: float = FACTS_TTL_S
    ) -> None:
        self.host = host.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.host, timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._facts: dict[str, tuple[ModelFacts, float]] = {}  # by model: the facts, when read
        self._facts_lock = asyncio.Lock()
        self._facts_ttl_s = facts_ttl_s
        self._refreshing: dict[str, asyncio.Task] = {}

    async def aclose(self) -> None:
        for task in self._refreshing.values():
            task.cancel()
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], model: str) -> dict[str, Any]:
        try:
            response = await self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise _not_running(self.host) from exc
        if response.status_code != 200:
            raise _error_for(response.status_code, response.text, model, self.host)
        # A verbose /api/show (a model's whole vocabulary, ~13 MB) takes Python ~0.1 s to parse: in
        # a thread, so a tokenizer being built never stalls the sessions this replica serves.
        data = (
            response.json()
            if len(response.content) < LARGE_BODY_BYTES
            else await asyncio.to_thread(json.loads, response.content)
        )
        if "error" in data:
            raise _error_for(500, response.text, model, self.host)
        return data

    async def version(self) -> str:
        try:
            response = await self._http.get("/api/version", timeout=3.0)
        except httpx.TransportError as exc:
            raise _not_running(self.host) from exc
        return response.json().get("version", "")

    async def model_facts(self, model: str) -> ModelFacts:
        """Context length and capabilities from /api/show, cached per model; read again in the
        background once older than the TTL (the cached facts answer meanwhile)."""
        cached = self._facts.get(model)
        if cached is None:
            async with self._facts_lock:
                if model not in self._facts:
                    self._facts[model] = (await self._read_facts(model), time.monotonic())
            return self._facts[model][0]
        facts, read_at = cached
        if time.monotonic() - read_at > self._facts_ttl_s and model not in self._refreshing:
            task = asyncio.get_running_loop().create_task(self._refresh_facts(model))
            self._refreshing[model] = task
            task.add_done_callback(lambda _: self._refreshing.pop(model, None))
        return facts

    async def _refresh_facts(self, model: str) -> None:
        try:
            self._facts[model] = (await self._read_facts(model), time.monotonic())
        except PalimpsestError as exc:  # the facts last read stay; tried again after the TTL
            self._facts[model] = (self._facts[model][0], time.monotonic())
            log.info("model facts of %s not read again: %s", model, exc)

    async def _read_facts(self, model: str) -> ModelFacts:
        data = await self._post("/api/show", {"model": model}, model)
        info = data.get("model_info") or {}
        arch = info.get("general.architecture", "")
        length = info.get(f"{arch}.context_length") or next(
            (v for k, v in info.items() if k.endswith(".context_length")), 0
        )
        return ModelFacts(model, int(length or 0), frozenset(data.get("capabilities") or ()))

    async def show(self, model: str, *, verbose: bool = False) -> dict[str, Any]:
        """/api/show; ``verbose`` fills the GGUF tokenizer arrays (about 13 MB for a 248k vocabulary)."""
        body: dict[str, Any] = {"model": model}
        if verbose:
            body["verbose"] = True
        return await self._post("/api/show", body, model)

    async def digest(self, model: str) -> str:
        """The model's digest from /api/tags ("" when Ollama does not list it): what names one exact
        set of weights and vocabulary, so a re-pulled model is never counted with its old tokenizer."""
        try:
            response = await self._http.get("/api/tags", timeout=10.0)
        except httpx.TransportError as exc:
            raise _not_running(self.host) from exc
        if response.status_code != 200:
            raise _error_for(response.status_code, response.text, model, self.host)
        wanted = {model, model if ":" in model else f"{model}:latest"}
        try:
            listed = response.json().get("models") or []
        except (ValueError, AttributeError):
            raise Unavailable(f"Ollama at {self.host} answered /api/tags with something that is not its JSON") from None
        for entry in listed:
            if isinstance(entry, dict) and (entry.get("name") in wanted or entry.get("model") in wanted):
                return str(entry.get("digest") or "")
        return ""

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> list[list[float]]:
        """/api/embed: one vector per text, in order. ``truncate`` (Ollama's default, said
        explicitly): a text longer than the model's window is cut, not refused, so one long chunk
        never blocks the others. A short ``timeout`` of its own: an embedding sits on a search's
        path, where a slow embedder must cost little."""
        try:
            response = await self._http.post(
                "/api/embed", json={"model": model, "input": list(texts), "truncate": True}, timeout=timeout
            )
        except httpx.TransportError as exc:  # timeouts included
            raise _not_running(self.host) from exc
        if response.status_code != 200:
            raise _error_for(response.status_code, response.text, model, self.host)
        try:
            vectors = response.json()["embeddings"]
        except (ValueError, KeyError, TypeError):
            raise Unavailable(f"Ollama at {self.host} answered /api/embed without embeddings") from None
        if not isinstance(vectors, list) or len(vectors) != len(texts):
            raise Unavailable(
                f"Ollama at {self.host} answered {len(texts)} texts with a different number of embeddings"
            )
        return vectors

    @staticmethod
    def chat_body(
        model: str,
        messages: Sequence[dict[str, Any]],
        *,
        num_ctx: int,
        tools: Sequence[dict[str, Any]] | None = None,
        think: bool | str | None = None,
        stream: bool = True,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        # num_ctx always goes out: Ollama's own default is small and silently truncates. And
        # truncate: false, so a prompt over it is refused (HTTP 400, ContextRefused) instead of losing
        # its oldest messages unseen; Ollama before v0.12.6 ignores it (its cut is detected from
        # prompt_eval_count, palimpsest/shared/reports.py).
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": stream,
            "truncate": False,
            "options": {**(options or {}), "num_ctx": num_ctx},
        }
        if tools:
            body["tools"] = list(tools)
        if think is not None:
            body["think"] = think
        return body

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yields each NDJSON chunk. Closing the generator closes the HTTP connection."""
        model = body.get("model", "")
        try:
            async with self._http.stream("POST", "/api/chat", json={**body, "stream": True}) as response:
                if response.status_code != 200:
                    raise _error_for(
                        response.status_code, (await response.aread()).decode(errors="replace"), model, self.host
                    )
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        chunk = json.loads(line)
                    except ValueError:
                        raise OllamaStreamError(
                            f"Ollama at {self.host} sent a line that is not JSON: {line[:200]!r}"
                        ) from None
                    if "error" in chunk:
                        raise OllamaStreamError(f"Ollama stopped with an error mid-stream: {chunk['error']}")
                    yield chunk
        except httpx.TransportError as exc:
            raise _not_running(self.host) from exc

    async def chat(self, body: dict[str, Any]) -> ChatResult:
        """One non-streamed call (summaries, planning)."""
        data = await self._post("/api/chat", {**body, "stream": False}, body.get("model", ""))
        result = ChatResult()
        result.absorb({**data, "done": True})
        return result

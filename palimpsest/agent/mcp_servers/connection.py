"""One MCP server as an Agent replica reaches it, through the official SDK's `Client`: a stdio
process it starts, or a streamable-HTTP endpoint.

A supervisor task owns the connection (the SDK's task groups must be entered and left in one task):
it connects, lists the tools, then waits until the connection is lost or the Agent stops; a lost or
failed connection is tried again after a back-off that doubles from 1 s to 60 s. Calls come from
turns' tasks and never wait for more than their deadline: on a server that is down they fail at once
with why and when it is tried again. A change of the server's tool list (its
`notifications/tools/list_changed`, on the connection or, from 2026-07-28 servers, on a
`subscriptions/listen` stream) is read again at most once per REFRESH_GAP_S, however many arrive."""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from typing import Any, Callable

import httpx2
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from palimpsest.agent.mcp_servers.config import MIN_CONNECT_S, McpServerConfig
from palimpsest.agent.mcp_servers.schemas import Malformed, check_tool_name, description_of, parameters

log = logging.getLogger("palimpsest.agent.mcp")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
# A connection that stayed up this long was healthy: its next failure starts the back-off afresh.
STABLE_S = 60.0
# Between two listings of a server's tools: a flood of list_changed notifications costs one per gap.
REFRESH_GAP_S = 0.5
MAX_LIST_PAGES = 100  # a server whose tools/list never stops paging is cut here
CLOSE_S = 10.0  # the SDK's own stdio shutdown is bounded at about 6 s (stdin closed, SIGTERM, SIGKILL)
CLIENT_INFO = types.Implementation(name="palimpsest-agent", version="0.1.0")


class State(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"  # tried again at `retry_at`
    STOPPED = "stopped"  # no longer configured, or the Agent is stopping


@dataclass(frozen=True)
class ServerTool:
    """One tool as the server lists it, its schema already as Ollama takes it."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool


class CallFailed(Exception):
    """A call that brought no result back; the message is for the model."""


def backoff(failures: int) -> float:
    """Seconds before the next try after `failures` failures in a row."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** max(0, failures - 1))


def describe(exc: BaseException) -> str:
    """Why a connection failed, in a line."""
    if isinstance(exc, FileNotFoundError):
        return f"the command was not found: {exc.filename or exc}"
    if isinstance(exc, PermissionError):
        return f"the command may not be run: {exc.filename or exc}"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, MCPError):
        return "the connection closed" if exc.code == CONNECTION_CLOSED else f"the server said: {exc.message}"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe(e) for e in exc.exceptions))
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpConnection:
    """The connection to one configured server, shared by every profile that names it."""

    def __init__(self, config: McpServerConfig, on_change: Callable[[], None]) -> None:
        self.config = config
        self.state = State.CONNECTING
        self.error = ""
        self.retry_at = 0.0  # monotonic time of the next try (FAILED)
        self.tools: tuple[ServerTool, ...] = ()  # replaced, never changed: a turn keeps the set it took
        self.skipped: dict[str, str] = {}  # the server's tools left out, and why
        self.listings = 0  # tools/list round trips made (the flood test counts them)
        self._on_change = on_change
        self._client: Client | None = None
        self._first_attempt = asyncio.Event()  # the first connection attempt is over, either way
        self._attempt_over = asyncio.Event()  # the current attempt is over (READY or FAILED)
        self._lost = asyncio.Event()
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._warned: set[tuple[str, str]] = set()
        self._task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp server {self.config.name}")

    async def close(self) -> None:
        """Stop the supervisor: the connection closes (a stdio server's stdin first, then its process
        tree is ended), and nothing of it stays running."""
        self._stop.set()
        self._lost.set()
        task, self._task = self._task, None
        if task is None:
            return
        if self.state is State.CONNECTING:
            task.cancel()  # a server that hangs at connect is not waited for (the SDK still ends its process)
        done, _ = await asyncio.wait({task}, timeout=CLOSE_S)
        if not done:
            task.cancel()
            await asyncio.wait({task})  # the SDK's shutdown of a process is bounded and survives the cancel
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            log.error("MCP server %s: its supervisor failed: %s", self.config.name, describe(failure))
        self.tools, self.state = (), State.STOPPED

    async def first_attempt(self, timeout: float) -> None:
        """Until the first attempt to connect is over (ready or failed), at most `timeout` seconds."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self._first_attempt.wait(), timeout)

    def _set(self, state: State, error: str = "", retry_in: float = 0.0) -> None:
        self.state, self.error = state, error
        self.retry_at = time.monotonic() + retry_in if retry_in else 0.0
        if state is State.CONNECTING:
            self._attempt_over.clear()
        else:
            self._attempt_over.set()
            self._first_attempt.set()
        self._on_change()

    async def _supervise(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._set(State.CONNECTING)
            connected_at = 0.0
            try:
                connected_at = await self._connection()
                reason = "the connection was lost (the server exited, closed it or stopped answering)"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 — any failure of a server is a reason to try again
                reason = describe(exc)
            if self._stop.is_set():
                break
            if connected_at and time.monotonic() - connected_at >= STABLE_S:
                failures = 0
            failures += 1
            delay = backoff(failures)
            (log.warning if failures == 1 else log.info)(
                "MCP server %s (%s): %s; trying again in %.0f s", self.config.name, self.config.target, reason, delay
            )
            self._set(State.FAILED, reason, retry_in=delay)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        self.tools = ()
        self._set(State.STOPPED, "no longer configured")

    async def _connection(self) -> float:
        """One connection, from connecting to its loss (or the Agent's stop); when it was READY.
        Raises what made connecting fail."""
        self._lost.clear()  # (in the tick the supervisor saw no stop: a close() cannot fall in between)
        self._changed.clear()
        async with AsyncExitStack() as stack:
            client = Client(
                await self._transport(stack),
                mode="auto",
                message_handler=self._on_message,
                cache=None,
                client_info=CLIENT_INFO,
                read_timeout_seconds=self.config.timeout_s,
            )
            async with asyncio.timeout(max(self.config.timeout_s, MIN_CONNECT_S)):
                await stack.enter_async_context(client)
                await self._list(client)
            self._client = client
            connected_at = time.monotonic()
            log.info("MCP server %s (%s) ready: %d tool(s)", self.config.name, self.config.target, len(self.tools))
            self._set(State.READY)
            helpers = [asyncio.create_task(self._refresh_on_change(client)), asyncio.create_task(self._listen(client))]
            try:
                await self._lost.wait()  # (close() sets it too)
            finally:
                self._client = None
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                try:
                    await stack.aclose()  # the server's end: its process stopped, its HTTP session deleted
                except Exception as exc:  # noqa: BLE001 — a connection that broke may not close cleanly
                    log.debug("MCP server %s closed with %s", self.config.name, describe(exc))
        return connected_at

    async def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.command:
            # The server gets only what its entry gives, over the SDK's short list of harmless
            # variables (HOME, LOGNAME, PATH, SHELL, TERM, USER): none of the Agent's own settings.
            return StdioServerParameters(command=config.command[0], args=list(config.command[1:]), env=dict(config.env))
        # The SDK's way to send headers: a client of our own. No read timeout: the listen stream may stay
        # quiet for hours, and every call has its own deadline.
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=dict(config.headers), timeout=httpx2.Timeout(MIN_CONNECT_S, read=None))
        )
        return streamable_http_client(config.url, http_client=http)

    # -- the tool list ---------------------------------------------------------------------------
    async def _on_message(self, message: Any) -> None:
        """Everything the server sends unasked: a tool-list change marks the list for reading."""
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()
        elif isinstance(message, Exception):
            log.debug("MCP server %s sent something unreadable: %s", self.config.name, describe(message))

    async def _list(self, client: Client) -> None:
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self.listings += 1
        self._apply(listed)

    def _apply(self, listed: list[Any]) -> None:
        tools: dict[str, ServerTool] = {}
        skipped: dict[str, str] = {}
        for tool in listed:
            try:
                name = check_tool_name(tool.name)
                if name in tools:
                    raise Malformed("listed twice")
                params = parameters(tool.input_schema)
            except Malformed as exc:
                skipped[str(tool.name)] = str(exc)
                if (str(tool.name), str(exc)) not in self._warned:  # once, not at every listing
                    self._warned.add((str(tool.name), str(exc)))
                    log.warning("MCP server %s: tool %r left out: %s", self.config.name, tool.name, exc)
                continue
            annotations = tool.annotations
            tools[name] = ServerTool(
                name=name,
                description=description_of(tool.description, tool.title),
                parameters=params,
                read_only=bool(annotations is not None and annotations.read_only_hint is True),
            )
        self.tools, self.skipped = tuple(tools.values()), skipped
        self._on_change()

    async def _refresh_on_change(self, client: Client) -> None:
        """Read the tool list again when it changed (or a call timed out: a server that cannot list
        its tools either is lost, and restarted)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    await self._list(client)
            except Exception as exc:  # noqa: BLE001 — whatever it is, this connection no longer works
                log.warning("MCP server %s could not list its tools: %s", self.config.name, describe(exc))
                self._lost.set()
                return
            await asyncio.sleep(REFRESH_GAP_S)  # rate limit: what arrives meanwhile is read once after it

    async def _listen(self, client: Client) -> None:
        """Hold a `subscriptions/listen` stream open on a 2026-07-28 connection (without one such a
        server sends no change notifications); its events reach `_on_message` too."""
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _ in subscription:
                        pass
            except ListenNotSupportedError:
                return  # an older server: its notifications come on the connection itself
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    self._lost.set()
                else:
                    log.info(
                        "MCP server %s does not stream changes (%s): its tools are read at connect only",
                        self.config.name,
                        exc.message,
                    )
                return
            except SubscriptionLost as exc:
                if isinstance(exc.__cause__, MCPError) and exc.__cause__.code == CONNECTION_CLOSED:
                    self._lost.set()
                    return
            except TimeoutError:  # no acknowledgment in time: the refresh says whether the server still works
                pass
            self._changed.set()  # no replay: what changed while no stream was open is read again
            await asyncio.sleep(REFRESH_GAP_S)

    # -- calls -----------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        """The server's CallToolResult, or CallFailed saying why there is none, within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                if self.state is State.CONNECTING:
                    await self._attempt_over.wait()
                client = self._client
                if self.state is not State.READY or client is None:
                    raise CallFailed(self._unavailable())
                return await client.call_tool(tool, arguments)
        except CallFailed:
            raise
        except TimeoutError:
            self._changed.set()  # is it the tool or the whole server? the refresh finds out
            raise CallFailed(f"no answer from MCP server {self.config.name} within {timeout:g} s") from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost.set()
                raise CallFailed(
                    f"MCP server {self.config.name} closed the connection; it is being restarted"
                ) from None
            if exc.code == REQUEST_TIMEOUT:  # the SDK's own clock for the same deadline
                self._changed.set()
                raise CallFailed(f"no answer from MCP server {self.config.name} within {timeout:g} s") from None
            raise CallFailed(f"MCP server {self.config.name} answered with an error: {exc.message}") from None
        except (OSError, ConnectionError) as exc:
            self._lost.set()
            raise CallFailed(f"MCP server {self.config.name} could not be reached: {describe(exc)}") from None
        except Exception as exc:  # noqa: BLE001 — a result the SDK refused (schema, shape): the model hears why
            log.warning("MCP server %s: call of %s failed: %s", self.config.name, tool, describe(exc))
            raise CallFailed(f"MCP server {self.config.name}: {describe(exc)}") from None

    def _unavailable(self) -> str:
        if self.state is State.FAILED:
            wait = math.ceil(max(0.0, self.retry_at - time.monotonic()))
            return f"MCP server {self.config.name} is not available ({self.error}); it is tried again in {wait} s"
        if self.state is State.STOPPED:
            return f"MCP server {self.config.name} is no longer configured"
        return f"MCP server {self.config.name} is not connected"

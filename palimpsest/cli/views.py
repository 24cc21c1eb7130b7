"""Static views for people: session tables, a session's history, the model's context, profiles, health."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from palimpsest.cli.render import arguments_line, preview_of, shorten
from palimpsest.v1 import agent_pb2, common_pb2, session_store_pb2

ROLE_STYLES = {"user": "bold green", "assistant": "bold blue", "system": "bold magenta", "tool": "bold cyan"}


def ago(stamp: Timestamp, now: datetime | None = None) -> str:
    """`5m ago` style for recent times, the date for older ones."""
    if not stamp.seconds and not stamp.nanos:
        return "—"
    when: datetime = stamp.ToDatetime(tzinfo=UTC)
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)}m ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h ago"
    if seconds < 7 * 86400:
        return f"{int(seconds // 86400)}d ago"
    return when.astimezone().strftime("%Y-%m-%d")


def sessions_table(
    sessions: Iterable[common_pb2.SessionSummary], snippets: dict[str, tuple[int, str]] | None = None
) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("", width=1)
    table.add_column("id", style="cyan", no_wrap=True)
    table.add_column("name")
    table.add_column("profile", style="dim")
    table.add_column("msgs", justify="right")
    table.add_column("active", style="dim", no_wrap=True)
    table.add_column("matches" if snippets is not None else "preview", overflow="ellipsis")
    for s in sessions:
        if snippets is not None:
            count, snippet = snippets.get(s.id, (0, ""))
            last = f"{count}× {shorten(' '.join(snippet.split()), 80)}" if count else ""
        else:
            last = shorten(" ".join(s.preview.split()), 60)
        table.add_row(
            "*" if s.pinned else "",
            s.id,
            s.name or Text("(unnamed)", style="dim"),
            s.profile_id,
            str(s.display_message_count),
            ago(s.last_active),
            last,
        )
    return table


def session_header(session: common_pb2.Session) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    rows = [
        ("id", session.id),
        ("profile", session.profile_id),
        ("model", " ".join(x for x in (session.provider, session.model) if x) or "—"),
        ("owner", session.owner or "(none: admin only)"),
        ("created", ago(session.created_at)),
        ("active", ago(session.last_active)),
        ("messages", messages_line(session)),
        (
            "context",
            f"{session.context_token_count:,} tokens"
            if session.context_token_count
            else "not measured yet (the next turn measures it)"
            if session.display_message_count
            else "empty",
        ),
        ("revision", str(session.revision)),
    ]
    if session.pinned:
        rows.append(("pinned", "yes"))
    if session.untrusted_ingested or session.episode_untrusted:
        flags = [
            n
            for n, on in (
                ("untrusted content", session.untrusted_ingested),
                ("episode untrusted", session.episode_untrusted),
            )
            if on
        ]
        rows.append(("trust", ", ".join(flags)))
    for ref in session.external_refs:
        rows.append(("ref", f"{ref.kind}: {ref.uri}" + (" (read-only)" if ref.read_only else "")))
    for label, value in rows:
        grid.add_row(label, value)
    return Panel(grid, title=session.name or "(unnamed session)", title_align="left", border_style="blue")


def shared_header(shared: session_store_pb2.GetSharedResponse) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    for label, value in (
        ("profile", shared.profile_id),
        ("created", ago(shared.created_at)),
        ("active", ago(shared.last_active)),
        ("shown", f"{len(shared.messages)} message(s)" + (", older ones before them" if shared.has_more else "")),
    ):
        grid.add_row(label, value)
    return Panel(
        grid,
        title=f"shared · {shared.name or '(unnamed session)'}",
        title_align="left",
        subtitle="read-only",
        border_style="blue",
    )


def messages_line(session: common_pb2.Session) -> str:
    """The display history's size, in the terms its numbered entries use: markers of a compression are
    rows of it, and summaries (context only) take numbers of their own, so #N may pass the count."""
    shown = list(session.messages)
    markers = sum(1 for m in shown if m.is_compression)
    line = (
        f"{session.display_message_count - markers:,}"
        if len(shown) == session.display_message_count
        else (f"{session.display_message_count:,}")
    )
    if markers and len(shown) == session.display_message_count:
        line += f" + {markers} compression marker{'s' if markers > 1 else ''}"
    last = max((m.seq for m in shown), default=0)
    if last > session.display_message_count:
        line += (
            f" · numbered #1–#{last} by their place in the session: the numbers missing here are the "
            "summaries written for the model (pal context shows the current one)"
        )
    return line


def message_view(message: common_pb2.Message, *, brief: bool = False, show_thinking: bool = False) -> RenderableType:
    """One message as a labelled block; compression markers become a rule where the context was rewritten."""
    if message.is_compression:
        return Rule(Text(f"context compressed here · {shorten(message.content, 80)}", style="yellow"), style="yellow")
    label = Text(f"#{message.seq} ", style="dim")
    label.append(message.role, style=ROLE_STYLES.get(message.role, "bold"))
    flags = [
        name
        for name, on in (
            ("summary", message.is_summary),
            ("plan", message.is_plan),
            ("recall", message.is_recall),
            ("archived", message.archived),
        )
        if on
    ]
    if message.role == "tool" and message.name:
        flags.insert(0, message.name)
    if message.token_count:
        flags.append(f"{message.token_count:,} tokens")
    if message.images:
        flags.append(f"{len(message.images)} image(s)")
    if flags:
        label.append("  " + " · ".join(flags), style="dim")
    parts: list[RenderableType] = [label]
    if show_thinking and message.thinking:
        parts.append(Text(preview_of(message.thinking) if brief else message.thinking, style="dim italic"))
    content = message.content
    if brief:
        content = preview_of(content, lines=3, chars=240)
    elif message.role == "tool":
        content = preview_of(content)
    if content:
        parts.append(Text(content, style="dim" if message.role == "tool" else ""))
    for call in message.tool_calls:
        parts.append(Text(f"→ {call.name}({arguments_line(call.arguments_json)})", style="cyan"))
    for path in message.files:
        parts.append(Text(f"📎 {path}", style="dim"))
    return Group(*parts, Text(""))


def context_view(session: common_pb2.Session, *, brief: bool = False) -> RenderableType:
    context = list(session.context)
    summaries = sum(1 for m in context if m.is_summary)
    head = Text(f"{len(context)} messages in the model's context of {session.id}", style="bold")
    head.append(f" · {session.context_token_count:,} tokens as last measured", style="dim")
    if summaries:
        stand = "1 summary stands" if summaries == 1 else f"{summaries} summaries stand"
        head.append(f" · {stand} for older history", style="yellow")
    return Group(head, Text(""), *(message_view(m, brief=brief, show_thinking=True) for m in context))


def profiles_table(response: agent_pb2.ListProfilesResponse) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("", "id", "name", "model", "window", "think", "tools"):
        table.add_column(column, no_wrap=True)
    table.add_column("description")
    for p in response.profiles:
        table.add_row(
            "*" if p.id == response.default_profile_id else "",
            Text(p.id, style="cyan"),
            p.name,
            p.model,
            f"{p.context_window:,}" if p.context_window else "—",
            "yes" if p.think_enabled else "no",
            str(len(p.agent_tools)),
            p.description,
        )
    return table


def mcp_state(server: agent_pb2.McpServerStatus) -> str:
    """An MCP server's state in words: ready, connecting, or failed with why and when it is tried again."""
    if server.state == agent_pb2.MCP_SERVER_STATE_READY:
        return "ready"
    if server.state == agent_pb2.MCP_SERVER_STATE_FAILED:
        again = f", restarting in {max(1, round(server.retry_in_seconds))} s" if server.retry_in_seconds else ""
        return f"failed: {server.error}{again}"
    return "connecting"


def mcp_servers_view(response: agent_pb2.ListProfilesResponse) -> RenderableType | None:
    """Each profile's MCP servers, their state and the tools they give the model; None when no
    profile names one."""
    lines: list[RenderableType] = []
    for p in response.profiles:
        for server in p.mcp_servers:
            line = Text(f"{p.id} · ", style="dim")
            line.append(server.name, style="cyan")
            line.append(f" ({server.target}): ", style="dim")
            line.append(
                mcp_state(server),
                style="green"
                if server.state == agent_pb2.MCP_SERVER_STATE_READY
                else "yellow"
                if server.state == agent_pb2.MCP_SERVER_STATE_CONNECTING
                else "red",
            )
            lines.append(line)
            if server.tools:
                lines.append(Text(f"    {len(server.tools)} tool(s): {', '.join(server.tools)}", style="dim"))
            for skipped in server.skipped_tools:
                lines.append(Text(f"    left out: {skipped}", style="yellow"))
    return Group(Text(""), Text("MCP servers", style="bold"), *lines) if lines else None


def health_table(rows: list[dict[str, str]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("service", "address", "status", "detail"):
        table.add_column(column)
    for row in rows:
        style = "green" if row["status"] == "SERVING" else "red"
        table.add_row(row["service"], row["address"], Text(row["status"], style=style), row.get("error", ""))
    return table


OUTCOME_STYLES = {"ok": "green", "error": "red", "refused": "yellow", "stopped": "magenta"}


def byte_size(count: int) -> str:
    """`812 B`, `3.4 KB`, `1.2 MB`."""
    if count < 1024:
        return f"{count:,} B"
    if count < 1024 * 1024:
        return f"{count / 1024:,.1f} KB"
    return f"{count / 1024 / 1024:,.1f} MB"


def duration(seconds: float) -> str:
    """`12 ms` under a second, `3.4 s` from there."""
    if seconds < 0.001:
        return "<1 ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def tool_runs_table(runs: Iterable[session_store_pb2.ToolRun]) -> Table:
    """A session's audit log, oldest first: a sub-agent's runs marked ↳, a failure's reason under its arguments."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("#", style="dim", justify="right")
    table.add_column("time", style="dim", no_wrap=True)
    table.add_column("tool", style="cyan", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("took", justify="right", no_wrap=True)
    table.add_column("in", justify="right", no_wrap=True)
    table.add_column("out", justify="right", no_wrap=True)
    table.add_column("arguments", overflow="fold")
    for run in runs:
        outcome = (
            session_store_pb2.ToolRunOutcome.Name(run.outcome).removeprefix("TOOL_RUN_OUTCOME_").lower()
            if run.outcome in session_store_pb2.ToolRunOutcome.values()
            else str(run.outcome)
        )
        detail = Text(arguments_line(run.arguments_json))
        if run.error:
            detail.append("\n" + shorten(" ".join(run.error.split()), 160), style=OUTCOME_STYLES.get(outcome, "red"))
        when = run.started_at.ToDatetime(tzinfo=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            str(run.seq),
            when,
            ("↳ " if run.is_subagent else "") + run.tool,
            Text(outcome, style=OUTCOME_STYLES.get(outcome, "")),
            duration(run.duration_seconds),
            byte_size(run.bytes_in),
            byte_size(run.bytes_out),
            detail,
        )
    return table

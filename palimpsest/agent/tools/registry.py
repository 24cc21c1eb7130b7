"""The tool registry: the built-in tools, users' custom tools, and `execute`, the one way a tool runs.

`execute` is the boundary between the model and the tools: arguments the model got wrong come back
as an error result it can read and correct, a call the taint rule forbids (``base.refusal``) is
answered with why, and a tool that fails becomes an error result plus a log line. Nothing a model
sends can raise out of it (cancellation excepted: Stop must work).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
from collections.abc import Iterable
from typing import Any

from palimpsest.agent.mcp_servers.config import PREFIX as MCP_PREFIX
from palimpsest.agent.mcp_servers.config import is_mcp_name
from palimpsest.agent.tools.base import Tool, ToolContext, ToolResult, refusal
from palimpsest.agent.tools.content_publish import ContentPublishTool
from palimpsest.agent.tools.files import FILE_TOOLS
from palimpsest.agent.tools.image_view import ImageViewTool
from palimpsest.agent.tools.memory import MemoryTool
from palimpsest.agent.tools.memory_search import MemorySearchTool
from palimpsest.agent.tools.plan import PlanTool
from palimpsest.agent.tools.run_command import RunCommandTool
from palimpsest.agent.tools.scratchpad import ScratchpadTool
from palimpsest.agent.tools.session_search import SessionSearchTool
from palimpsest.agent.tools.share_file import ShareFileTool
from palimpsest.agent.tools.spawn_agent import SpawnAgentTool
from palimpsest.agent.tools.switch_profile import SwitchProfileTool
from palimpsest.agent.tools.todo import TodoTool
from palimpsest.shared.errors import InvalidArgument, PalimpsestError

log = logging.getLogger("palimpsest.agent.tools")

BUILTIN: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        PlanTool(),
        TodoTool(),
        SpawnAgentTool(),
        MemorySearchTool(),
        SessionSearchTool(),
        ImageViewTool(),
        SwitchProfileTool(),
        ShareFileTool(),
        ContentPublishTool(),
        MemoryTool(),
        ScratchpadTool(),
        *FILE_TOOLS,
        RunCommandTool(),
    )
}

# Custom tools already warned about for saying nothing of their reach (once each per process).
_SILENT_REACH: set[str] = set()

# Error text from a failing tool is cut here: enough to act on, never a wall of traceback.
ERROR_CHARS = 1_000


# -- building a tool set -----------------------------------------------------------------------
def load_custom(path: str) -> Tool:
    """A user's tool from "package.module:attribute" (a Tool class, instantiated with no arguments,
    or a Tool instance)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidArgument("custom_tools", f"{path!r} is not a 'module:attribute' path")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument("custom_tools", f"cannot load {path!r}: {exc}") from None
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 — any constructor failure is a configuration error
            raise InvalidArgument("custom_tools", f"cannot instantiate {path!r}: {exc}") from None
    if not isinstance(obj, Tool) or not inspect.iscoroutinefunction(obj.run):
        raise InvalidArgument(
            "custom_tools",
            f"{path!r} is not a tool: it needs name, description, parameters and an async run(args, ctx)",
        )
    if not isinstance(obj.name, str) or not obj.name or not isinstance(obj.parameters, dict):
        raise InvalidArgument("custom_tools", f"{path!r} needs a non-empty name and a JSON-schema dict parameters")
    if is_mcp_name(obj.name):
        raise InvalidArgument(
            "custom_tools",
            f"{path!r} is named {obj.name!r}: names starting with {MCP_PREFIX} are the MCP servers' tools",
        )
    return obj


def tools_for(
    names: Iterable[str], custom: Iterable[str] = (), exclude: Iterable[str] = (), mcp: dict[str, Tool] | None = None
) -> dict[str, Tool]:
    """The tools a profile asks for, in its order, then its custom tools, then `mcp` (the MCP tools
    it offers), minus `exclude`.

    Custom tools are always included (they are the profile's extras) and may also be named in
    `names`; a custom tool with a built-in's name replaces the built-in. Unknown names are a
    configuration error: InvalidArgument("tools", …); MCP names (mcp__…) are not, as a server's
    tools come and go (the profile's check made sure they name one of its servers)."""
    extras: dict[str, Tool] = {}
    for path in custom:
        tool = load_custom(path)
        extras[tool.name] = tool
    available = {**BUILTIN, **extras}
    excluded = set(exclude)
    chosen: dict[str, Tool] = {}
    unknown = []
    for name in names:
        if is_mcp_name(name):
            continue  # offered through `mcp`
        if name not in available:
            unknown.append(name)
        elif name not in excluded:
            chosen[name] = available[name]
    if unknown:
        raise InvalidArgument(
            "tools", f"unknown tool(s) {', '.join(map(repr, unknown))}; known: {', '.join(available)}"
        )
    for name, tool in (*extras.items(), *(mcp or {}).items()):
        if name not in excluded:
            chosen.setdefault(name, tool)
    return chosen


# -- checking the model's arguments ------------------------------------------------------------
_TYPE_NAMES = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
}


def _coerce(value: Any, expected: str) -> tuple[bool, Any]:
    """(ok, value): the value as the schema type, forgiving the usual model slips ("5" for 5)."""
    if expected == "string":
        if isinstance(value, str):
            return True, value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, str(value)
        return False, value
    if expected == "integer":
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return True, int(value.strip())
        return False, value
    if expected == "number":
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int | float):
            return True, value
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if expected == "boolean":
        if isinstance(value, bool):
            return True, value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return True, value.strip().lower() == "true"
        return False, value
    if expected == "array":
        if isinstance(value, list):
            return True, value
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                return False, value
            return isinstance(parsed, list), parsed
        return False, value
    if expected == "object":
        return isinstance(value, dict), value
    return True, value  # a type this check does not know: leave it to the tool


def check_arguments(tool: Tool, args: Any) -> tuple[dict[str, Any] | None, str]:
    """(arguments ready for the tool, "") or (None, what is wrong) against the tool's schema."""
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None, "the arguments are not valid JSON"
    if not isinstance(args, dict):
        return None, "the arguments must be a JSON object"
    schema = tool.parameters or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    problems = []
    for name in schema.get("required") or []:
        if args.get(name) is None or args.get(name) == "":
            problems.append(f"'{name}' is required")
    checked = dict(args)
    for name, value in args.items():
        spec = properties.get(name)
        if spec is None or value is None:
            continue
        types = spec.get("type")
        types = types if isinstance(types, list) else [types] if types else []
        if types:
            for expected in types:
                ok, coerced = _coerce(value, expected)
                if ok:
                    checked[name] = value = coerced
                    break
            else:
                wanted = " or ".join(_TYPE_NAMES.get(t, str(t)) for t in types)
                problems.append(f"'{name}' must be {wanted}, got {type(value).__name__}")
                continue
        if "enum" in spec and value not in spec["enum"]:
            problems.append(f"'{name}' must be one of {', '.join(map(str, spec['enum']))}, got {value!r}")
    if problems:
        return None, "; ".join(problems)
    return checked, ""


# -- running -----------------------------------------------------------------------------------
def _failure(tool_name: str, text: str) -> ToolResult:
    if len(text) > ERROR_CHARS:
        text = text[:ERROR_CHARS] + "…"
    return ToolResult(content=f"{tool_name} failed: {text}", is_error=True, untrusted=False)


async def execute(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
    """Run one tool call. Always returns a ToolResult; raises only CancelledError."""
    checked, problem = check_arguments(tool, args)
    if checked is None:
        properties = ", ".join((tool.parameters or {}).get("properties") or {}) or "none"
        return ToolResult(
            content=f"Invalid arguments for {tool.name}: {problem}. Parameters: {properties}.",
            is_error=True,
            untrusted=False,
        )
    refused = refusal(tool, checked, ctx)
    if refused:  # judged on every call: the conversation may have been tainted earlier in this batch
        log.info("tool %s refused in a tainted conversation (session %s)", tool.name, ctx.session_id or "-")
        if not hasattr(tool, "reach") and not hasattr(tool, "reach_of") and tool.name not in _SILENT_REACH:
            _SILENT_REACH.add(tool.name)
            log.warning(
                "custom tool %s says nothing of its reach, so it counts as acting outside the "
                "conversation and is refused once outside content is in it; if it only reads, or acts "
                'on nothing outside Palimpsest, give it reach = "engine" (or "session")',
                tool.name,
            )
        return ToolResult(content=refused, is_error=True, untrusted=False, metadata={"refused": "untrusted content"})
    try:
        result = await tool.run(checked, ctx)
    except asyncio.CancelledError:
        raise
    except PalimpsestError as exc:  # a store call's failure too: the Agent's channels raise them
        log.warning("tool %s failed: %s", tool.name, exc)
        return _failure(tool.name, f"{exc.code.name}: {exc}")
    except Exception as exc:  # noqa: BLE001 — a broken tool must not end the turn
        log.exception("tool %s raised", tool.name)
        return _failure(tool.name, f"{type(exc).__name__}: {exc}")
    if isinstance(result, ToolResult):
        return result
    if isinstance(result, str):  # lenient with custom tools that return plain text
        return ToolResult(content=result)
    log.error("tool %s returned %s instead of a ToolResult", tool.name, type(result).__name__)
    return _failure(tool.name, f"the tool returned {type(result).__name__} instead of a result")

"""The plan tool: a two-phase planner the agent calls for multi-step work.

Phase 1 classifies the request (task, goal, unknowns, complexity, …); phase 3 writes milestones and
numbered steps, each with the executor that will carry it out. (The source's phase 2, a structured
review, was retired: it rarely changed a plan.) Both calls are non-streamed and never ask for
extended reasoning, so a thinking model cannot spill its reasoning into the structured answer.

Parsing and prompt building are plain functions over text, tested without a server; `build_plan`
runs the pipeline, and `PlanTool` / `run_subagent_planning` are its two entry points.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import role_and_content, shorten, text_arg
from palimpsest.agent.tools.scratchpad import load_notes
from palimpsest.agent.tools.todo import load_todo, replace_todo
from palimpsest.agent.tools.todo import render as render_todo

log = logging.getLogger("palimpsest.agent.plan")

COMPLEXITIES = ("simple", "medium", "complex")
# Steps a plan of each complexity should have (the prompt asks for it, cap_steps enforces the top).
DEPTH = {"simple": (1, 3), "medium": (5, 9), "complex": (8, 20)}
MAX_STEPS = 20
DEFAULT_COMPLEXITY = "medium"
# The request the planner reads: the newest ~20k chars of the conversation, original task pinned.
REQUEST_WINDOW_CHARS = 20_000
PINNED_TASK_CHARS = 4_000
# Raw model output kept in a planning log entry (the store keeps the newest 20 entries).
LOG_TEXT_CHARS = 8_000
SUBAGENT_FOLLOW_UP = "Plan is ready. Execute it now."

_LIST_FIELDS = ("unknowns", "resources", "rules", "subtasks", "commitments")
_FIELDS = ("task", "goal", "complexity", *_LIST_FIELDS)


# -- data --------------------------------------------------------------------------------------
@dataclass
class Analysis:
    """Phase 1's classification of the request."""

    task: str = ""
    goal: str = ""
    complexity: str = DEFAULT_COMPLEXITY
    unknowns: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    subtasks: list[str] = field(default_factory=list)
    commitments: list[str] = field(default_factory=list)
    # A sub-agent judged its subtask trivial: no plan.
    direct: bool = False
    raw: str = ""


@dataclass(frozen=True)
class Step:
    number: int
    text: str
    executor: str = "SELF"  # TOOL, AGENT or SELF
    target: str = ""  # the tool name or profile id
    milestone: str = ""

    @property
    def executor_label(self) -> str:
        return f"{self.executor}: {self.target}" if self.target else self.executor

    def render(self) -> str:
        return f"{self.text} — {self.executor_label}"


@dataclass
class PlanOutcome:
    analysis: Analysis
    steps: list[Step]
    text: str = ""
    direct: bool = False


# -- parsing -----------------------------------------------------------------------------------
_MARKUP = "*_#>`"
_NAMES = r"(TASK|GOAL|UNKNOWNS?|RESOURCES?|RULES|KNOWLEDGE RULES|COMPLEXITY|SUBTASKS?|COMMITMENTS?)"
# Capitalised headings may sit behind a bullet; a "Goal:" in another case only at the start of a line,
# so "- goal: …" inside a SUBTASKS list stays an item.
_HEADER = re.compile(r"^[\s*_#>\-]*" + _NAMES + r"[\s*_]*:[\s*_]*(.*)$")
_HEADER_ANY_CASE = re.compile(r"^[\s*_#>]*" + _NAMES + r"[\s*_]*:[\s*_]*(.*)$", re.IGNORECASE)
_DIRECT_LINE = re.compile(r"^[\s*_#`]*DIRECT[\s*_.!`]*$", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+")
_EMPTY_ITEMS = {"", "-", "none", "n/a", "na", "nothing", "none.", "no"}
_COMPLEXITY_WORDS = {
    "simple": "simple",
    "trivial": "simple",
    "medium": "medium",
    "moderate": "medium",
    "complex": "complex",
    "autonomous": "complex",
}


def _clean(text: str) -> str:
    return text.strip().strip(_MARKUP).strip()


def _field_name(header: str) -> str:
    name = header.lower().replace("knowledge ", "")
    return name if name in _FIELDS else name + "s"


def _complexity_of(value: str) -> str:
    for word in re.findall(r"[a-z]+", value.lower()):
        if word in _COMPLEXITY_WORDS:
            return _COMPLEXITY_WORDS[word]
    return DEFAULT_COMPLEXITY


def parse_analysis(text: str) -> Analysis:
    """The fields of a phase-1 answer; lenient about markdown, bullets and missing fields."""
    collected: dict[str, list[str]] = {name: [] for name in _FIELDS}
    current = ""
    direct = False
    for line in text.splitlines():
        if _DIRECT_LINE.match(line):
            direct = True
            continue
        header = _HEADER.match(line) or _HEADER_ANY_CASE.match(line)
        if header:
            current = _field_name(header.group(1))
            line = header.group(2)
        if current and _clean(line):
            collected[current].append(line)
    analysis = Analysis(raw=text, direct=direct)
    analysis.task = " ".join(_clean(x) for x in collected["task"])
    analysis.goal = " ".join(_clean(x) for x in collected["goal"])
    complexity_text = " ".join(collected["complexity"])
    if re.search(r"\bDIRECT\b", complexity_text):
        analysis.direct = True
    analysis.complexity = _complexity_of(complexity_text)
    for name in _LIST_FIELDS:
        items = [_clean(_BULLET.sub("", x)) for x in collected[name]]
        setattr(analysis, name, [x for x in items if x.lower() not in _EMPTY_ITEMS])
    return analysis


_STEP_LINE = re.compile(r"^[\s*_>\-]*(?:step\s*)?(\d{1,3})\s*[.):][\s*_]*(.+)$", re.IGNORECASE)
_MILESTONE_LINE = re.compile(
    r"^[\s*_#>\-]*milestone\b\s*(?:\d+|[A-Z]\b)?[.)]?[\s*_]*[:\-—–]?[\s*_]*(.*)$", re.IGNORECASE
)
_STEPS_HEADER = re.compile(r"^[\s*_#>]*(?:STEPS|EXECUTION PLAN|PLAN)[\s*_]*:?[\s*_]*$", re.IGNORECASE)
# TOOL: name / AGENT: profile in any case (the colon makes them unambiguous); SELF only in capitals,
# so "self-check" in a description is not read as an executor.
_EXECUTOR = re.compile(
    r"[\[(]?\s*\b(?P<kind>(?i:TOOL|AGENT))\s*:\s*`?(?P<target>[A-Za-z0-9_.:\-]+)`?\s*[\])]?"
    r"|[\[(]?\s*\bSELF\b\s*[\])]?"
)
_TRAILING = re.compile(r"[\s—–\-:|,;→]+$")
_LEADING = re.compile(r"^[\s—–\-:|,;→]+")


def _step_from(text: str, milestone: str) -> Step | None:
    executor, target = "SELF", ""
    matches = list(_EXECUTOR.finditer(text))
    if matches:
        last = matches[-1]
        if last.group("kind"):
            executor, target = last.group("kind").upper(), last.group("target").rstrip(".:")
        text = text[: last.start()] + text[last.end() :]
    text = _LEADING.sub("", _TRAILING.sub("", text.replace("**", "").replace("__", ""))).strip()
    if not text:
        return None
    return Step(0, text, executor, target, milestone)


def parse_steps(text: str) -> list[Step]:
    """The numbered steps of a phase-3 answer, numbered 1… in order, each with its milestone."""
    steps: list[Step] = []
    milestone = ""
    for line in text.splitlines():
        if _STEPS_HEADER.match(line):
            steps, milestone = [], ""  # anything numbered above was an overview, not the steps
            continue
        step_line = _STEP_LINE.match(line)
        if step_line:
            step = _step_from(step_line.group(2), milestone)
            if step:
                steps.append(step)
            continue
        heading = _MILESTONE_LINE.match(line)
        if heading:
            milestone = _clean(_TRAILING.sub("", heading.group(1)))
    return [replace(s, number=n) for n, s in enumerate(steps, 1)]


def cap_steps(steps: Sequence[Step], complexity: str) -> list[Step]:
    """At most the complexity's depth (simple 3, medium 9, complex 20), never more than 20."""
    limit = min(DEPTH.get(complexity, (1, MAX_STEPS))[1], MAX_STEPS)
    return [replace(s, number=n) for n, s in enumerate(steps[:limit], 1)]


# -- prompts -----------------------------------------------------------------------------------
def windowed_request(conversation: Sequence[Any], task: str = "", limit: int = REQUEST_WINDOW_CHARS) -> str:
    """The conversation as the planner reads it: the newest `limit` chars, the first request pinned."""
    turns = [
        (role, content.strip())
        for role, content in map(role_and_content, conversation)
        if role != "system" and content.strip()
    ]
    if task and not (turns and turns[-1] == ("user", task)):
        turns.append(("user", task))
    lines = [f"{role.upper()}: {content}" for role, content in turns]
    whole = "\n\n".join(lines)
    if len(whole) <= limit:
        return whole
    original = next((content for role, content in turns if role == "user"), "")
    pinned = f"ORIGINAL TASK (pinned): {shorten(original, min(PINNED_TASK_CHARS, limit // 4))}\n\n"
    recent = whole[-max(0, limit - len(pinned) - 40) :]
    return pinned + "[… earlier conversation omitted …]\n\n" + recent


def request_limit(window_tokens: int) -> int:
    """~20k chars, less in a small window: about 2 chars per window token leaves room for the answer."""
    return max(4_000, min(REQUEST_WINDOW_CHARS, 2 * window_tokens)) if window_tokens else REQUEST_WINDOW_CHARS


def revision_brief(reason: str, updated_goal: str, todo_text: str, notes: Sequence[dict[str, str]] = ()) -> str:
    """What a re-plan is told besides the conversation: why, the goal if it moved, the todo, and
    the scratchpad's findings and errors."""
    parts = [f"Why the plan must change: {reason}"]
    if updated_goal:
        parts.append(f"Updated goal: {updated_goal}")
    parts.append(f"Progress so far:\n{todo_text}")
    if notes:
        parts.append("Scratchpad findings and errors:\n" + "\n".join(f"- [{n['kind']}] {n['text']}" for n in notes))
    return "\n".join(parts)


def analysis_prompt(*, is_subagent: bool, revision: str = "") -> str:
    prompt = (
        "You are the analysis stage of an agent's planner. Do not solve the task and do not call tools: "
        "only classify it. Answer in exactly this layout, one field per heading, lists as '- item':\n\n"
        "TASK: the request in one sentence\n"
        "GOAL: what must be true when the work is finished\n"
        "UNKNOWNS: facts still missing (or '- none')\n"
        "RESOURCES: tools, files, people or earlier sessions that will help\n"
        "RULES: constraints the user set and facts the work must respect\n"
        "COMPLEXITY: simple | medium | complex\n"
        "SUBTASKS: the main parts of the work\n"
        "COMMITMENTS: what the user was promised and must receive\n\n"
        "simple: one or two actions with an obvious path. medium: several dependent actions. "
        "complex: many actions, research or delegation, or a costly mistake if done wrong."
    )
    if is_subagent:
        prompt += (
            "\n\nYou are planning for a sub-agent. If its subtask is trivial (one obvious action), "
            "answer with the single word DIRECT instead, and no plan will be made."
        )
    if revision:
        prompt += (
            "\n\nThis is a REVISION: an earlier plan no longer fits. Analyse what remains, keep the "
            "finished work, and do not repeat it."
        )
    return prompt


def plan_prompt(
    complexity: str, tools: Sequence[tuple[str, str]], *, can_delegate: bool, profile_id: str, revision: bool = False
) -> str:
    low, high = DEPTH.get(complexity, DEPTH[DEFAULT_COMPLEXITY])
    executors = ["TOOL: <tool name> — one call of one of the tools listed below"]
    if can_delegate:
        executors.append(
            f"AGENT: <profile id> — a bounded subtask of three or more tool calls, handed to a "
            f"sub-agent with spawn_agent (this agent's profile is {profile_id!r})"
        )
    executors.append("SELF — reasoning, synthesis or writing you do directly")
    tool_lines = "\n".join(f"- {name}: {about}" for name, about in tools) or "- (no tools)"
    return (
        (
            "Revise the execution plan: the steps still to do, given the progress so far. "
            if revision
            else "Write the execution plan for the analysed task. "
        )
        + "Do not carry it out.\n\nLayout:\n"
        "MILESTONE: <an intermediate result worth checking>\n"
        "1. <one action> — <executor>\n"
        "2. <one action> — <executor>\n"
        "MILESTONE: <the next result>\n"
        "3. …\n\n"
        "Executors:\n" + "\n".join(f"- {e}" for e in executors) + "\n\n"
        "Rules:\n"
        "- Number the steps continuously across milestones.\n"
        f"- This task is {complexity}: write {low} to {high} steps, and never more than {MAX_STEPS}.\n"
        "- One action per step. If a step's description lists several things joined by commas or 'and', "
        "split it into one step per thing.\n"
        "- The last step delivers the result to the user.\n\n"
        f"Tools:\n{tool_lines}"
    )


def planning_tools(tool_schemas: Sequence[dict[str, Any]]) -> tuple[list[tuple[str, str]], bool]:
    """(name, first sentence of description) of the tools a step may use, and whether spawn_agent is there."""
    tools, can_delegate = [], False
    for entry in tool_schemas:
        fn = entry.get("function") or {}
        name = fn.get("name", "")
        if name == "spawn_agent":
            can_delegate = True
        if name and name not in ("plan", "todo", "scratchpad", "spawn_agent"):
            about = (fn.get("description") or "").split(". ")[0]
            tools.append((name, shorten(about, 140)))
    return tools, can_delegate


def render_plan(analysis: Analysis, steps: Sequence[Step], *, revision: bool = False) -> str:
    title = "Revised plan" if revision else "Plan"
    lines = [f"{title} ({analysis.complexity}, {len(steps)} step{'s' if len(steps) != 1 else ''})"]
    if analysis.goal or analysis.task:
        lines.append(f"Goal: {analysis.goal or analysis.task}")
    milestone = None
    for step in steps:
        if step.milestone != milestone and step.milestone:
            lines += ["", f"Milestone: {step.milestone}"]
        milestone = step.milestone
        lines.append(f"{step.number}. {step.render()}")
    return "\n".join(lines)


def follow_up(complexity: str, *, is_subagent: bool) -> str:
    """What the agent should do with the plan: sub-agents execute; complex work waits for the user."""
    if is_subagent:
        return SUBAGENT_FOLLOW_UP
    if complexity == "complex":
        return (
            "This is a complex task. Present the plan to the user briefly and WAIT for the user's "
            "confirmation before carrying out any step: end your turn after presenting it."
        )
    return (
        "The plan is in the todo list. Proceed now with step 1, marking each step in_progress when you "
        "start it and done when it is finished."
    )


# -- the pipeline ------------------------------------------------------------------------------
async def _chat(ctx: ToolContext, system: str, user: str, think: bool | None) -> str:
    body = ctx.ollama.chat_body(
        ctx.profile.model,
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        num_ctx=ctx.window or ctx.settings.ollama_num_ctx,
        think=think,
        stream=False,
        options={"temperature": 0.2},  # classification and step lists: little room for creativity
    )
    return (await ctx.ollama.chat(body)).content


async def _think_flag(ctx: ToolContext) -> bool | None:
    """False for a model that can think (it would otherwise reason aloud), nothing for one that cannot."""
    facts = await ctx.ollama.model_facts(ctx.profile.model)
    return False if facts.thinking else None


async def _store_log(ctx: ToolContext, entry: dict[str, Any]) -> None:
    if not ctx.session_id or ctx.update_session is None:
        return
    try:
        await ctx.update_session(planning_log=entry)
    except Exception:  # noqa: BLE001 — a debug log must never fail the plan
        log.warning("could not store the planning log of session %s", ctx.session_id, exc_info=True)


async def build_plan(ctx: ToolContext, *, task: str = "", reason: str = "", updated_goal: str = "") -> PlanOutcome:
    """Analyse, then plan; fills the todo, emits the planning events and logs the run.

    A sub-agent may be answered DIRECT (no plan, nothing changed)."""
    revision = ""
    if reason:
        revision = revision_brief(reason, updated_goal, render_todo(await load_todo(ctx)), await load_notes(ctx))
    request = windowed_request(ctx.conversation, task, request_limit(ctx.window))
    think = await _think_flag(ctx)

    ctx.events.planning_status("Re-planning: analyzing what changed…" if reason else "Analyzing the request…")
    analysis_input = f"REQUEST:\n{request}" + (f"\n\nREVISION:\n{revision}" if revision else "")
    analysis_text = await _chat(
        ctx, analysis_prompt(is_subagent=ctx.is_subagent, revision=revision), analysis_input, think
    )
    analysis = parse_analysis(analysis_text)
    entry: dict[str, Any] = {
        "at": datetime.now(UTC).isoformat(),
        "kind": "replan" if reason else "plan",
        "subagent": ctx.is_subagent,
        "model": ctx.profile.model,
        "reason": reason,
        "analysis": shorten(analysis_text, LOG_TEXT_CHARS),
    }
    if analysis.direct and ctx.is_subagent:
        ctx.events.planning_status("Simple subtask: no plan needed")
        await _store_log(ctx, {**entry, "direct": True})
        return PlanOutcome(analysis, [], direct=True)

    ctx.events.planning_status("Writing the execution plan…")
    tools, can_delegate = planning_tools(ctx.tool_schemas)
    plan_input = f"{analysis_input}\n\nANALYSIS:\n{analysis_text.strip()}"
    plan_text = await _chat(
        ctx,
        plan_prompt(
            analysis.complexity, tools, can_delegate=can_delegate, profile_id=ctx.profile.id, revision=bool(reason)
        ),
        plan_input,
        think,
    )
    steps = cap_steps(parse_steps(plan_text), analysis.complexity)
    if not steps:  # an answer without numbered steps still leaves the agent one honest step
        steps = [Step(1, analysis.task or "Carry out the request", "SELF")]
    rendered = render_plan(analysis, steps, revision=bool(reason))

    if analysis.goal:
        ctx.state.goal = analysis.goal
    labels = [s.render() for s in steps]
    await replace_todo(ctx, labels)
    ctx.events.plan_ready(rendered, labels, analysis.complexity)
    await _store_log(
        ctx,
        {
            **entry,
            "direct": False,
            "complexity": analysis.complexity,
            "plan": shorten(plan_text, LOG_TEXT_CHARS),
            "steps": labels,
        },
    )
    return PlanOutcome(analysis, steps, rendered)


class PlanTool:
    name = "plan"
    reach = Reach.SESSION  # its own session and the model only: a clamped sub-agent keeps it
    description = (
        "Make a step-by-step plan before a non-trivial, multi-step task; it also fills the todo list. "
        "Call it again with a `reason` to revise the plan when it no longer fits (the todo and the scratchpad go "
        "with it)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "The task to plan, if it is not the user's latest request."},
            "reason": {"type": "string", "description": "Only to re-plan: why the current plan no longer fits."},
            "updated_goal": {"type": "string", "description": "Only to re-plan: the goal, if it changed."},
        },
        "required": [],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        outcome = await build_plan(
            ctx,
            task=text_arg(args, "task"),
            reason=text_arg(args, "reason"),
            updated_goal=text_arg(args, "updated_goal"),
        )
        if outcome.direct:
            return ToolResult(
                content="This subtask is simple enough to do directly: no plan was made. Do it now.", untrusted=False
            )
        steps = [s.render() for s in outcome.steps]
        complexity = outcome.analysis.complexity
        # The loop appends metadata["plan"] right after this result as an assistant message (is_plan),
        # so the plan reaches the model once, as its own words, instead of twice.
        content = (
            f"{follow_up(complexity, is_subagent=ctx.is_subagent)}\n\nThe plan ({complexity}, "
            f"{len(steps)} step{'s' if len(steps) != 1 else ''}) follows as your own message; "
            "its steps are now the todo list."
        )
        return ToolResult(
            content=content,
            untrusted=False,
            metadata={"plan": outcome.text, "steps": steps, "complexity": outcome.analysis.complexity},
        )


async def run_subagent_planning(ctx: ToolContext, task: str) -> str | None:
    """A sub-agent's automatic plan before its loop (profile.subagent_planning_enabled).

    Returns the plan text to put in the sub-agent's context (follow it with SUBAGENT_FOLLOW_UP), or None:
    planning is off, the subtask was judged DIRECT, or planning failed (logged; the sub-agent goes on)."""
    if not ctx.profile.subagent_planning_enabled:
        return None
    try:
        outcome = await build_plan(ctx, task=task)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 — planning helps a sub-agent; it must not stop it
        log.warning("sub-agent planning failed; the sub-agent runs without a plan", exc_info=True)
        return None
    return None if outcome.direct else outcome.text

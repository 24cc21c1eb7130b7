"""Opening a turn: everything that can fail with a plain status before its stream begins (the request
checked, the profile and model found, a new session created, the turn's files stored), and the Turn
it then runs, with what it answers."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import suppress
from types import MappingProxyType
from typing import Any

from palimpsest.agent.attachments import check_request, store_attachments
from palimpsest.agent.client_tools import ClientTool, client_tools_from_proto
from palimpsest.agent.conversation import StoredConversation
from palimpsest.agent.events import EventSink
from palimpsest.agent.profiles import PROVIDER, Profile, ProfileRegistry
from palimpsest.agent.runtime import SessionRuntime
from palimpsest.agent.subagent import run_subagent
from palimpsest.agent.tools.registry import BUILTIN, tools_for
from palimpsest.agent.turn import Turn
from palimpsest.agent.turn_context import AgentDeps, TurnContext, TurnInput
from palimpsest.shared.auth import vouching_metadata
from palimpsest.shared.errors import InvalidArgument, PalimpsestError, Unavailable
from palimpsest.shared.external_refs import refs_from_proto
from palimpsest.shared.session_reads import whole_context
from palimpsest.shared.settings import Settings
from palimpsest.shared.workspace_paths import BadPath, workspace_path
from palimpsest.v1 import agent_pb2 as pb
from palimpsest.v1 import common_pb2
from palimpsest.v1 import session_store_pb2 as store_pb

MAX_TEXT_CHARS = 1_000_000
# The two calls that run a turn (RunStream streams its events, Run answers with its text).
TurnRequest = pb.RunStreamRequest | pb.RunRequest


def validate_turn(request: TurnRequest) -> None:
    if not (request.text.strip() or request.images or request.attachments or request.inline_attachments):
        raise InvalidArgument("text", "a turn needs text, images or files")
    if len(request.text) > MAX_TEXT_CHARS:
        raise InvalidArgument("text", f"at most {MAX_TEXT_CHARS} characters")
    if request.hidden and request.images:
        raise InvalidArgument("images", "hidden turns carry machine payloads, not images")
    refs_from_proto(request.external_refs)  # checked here: a bad ref must not cost a turn half run
    check_request(request)
    turn_cwd(request.cwd)


def turn_client_tools(request: TurnRequest, profile: Profile, settings: Settings) -> tuple[list[ClientTool], int]:
    """The client's tools for the turn, and how long one call waits for its answer."""
    wait = request.client_tool_timeout_seconds
    if not 0 <= wait <= settings.client_tool_max_timeout_s:
        raise InvalidArgument(
            "client_tool_timeout_seconds",
            f"0 (the default, {settings.client_tool_timeout_s} s) to "
            f"{settings.client_tool_max_timeout_s} s (PALIMPSEST_CLIENT_TOOL_MAX_TIMEOUT_SECONDS)",
        )
    if not request.client_tools:
        return [], wait
    taken = {*BUILTIN, *tools_for((), profile.custom_tools)}  # built-ins, and the profile's custom tools
    return client_tools_from_proto(request.client_tools, taken), wait


def turn_cwd(raw: str) -> str:
    """A turn's working folder, as a workspace path ("" for the workspace itself)."""
    try:
        return workspace_path(raw, allow_root=True) if raw else ""
    except BadPath as exc:
        raise InvalidArgument("cwd", str(exc)) from None


def session_changes(session: common_pb2.Session, profile: Profile, request: TurnRequest) -> dict[str, Any]:
    """The UpdateSession fields a turn writes before anything else: what it runs on, where that
    differs from what the session last ran on; the refs the request adds (a new session got them
    at its creation, and adding them again changes nothing); the taint of pasted images and
    uploaded files (content from outside, as a tool's output is), before they are stored."""
    changes: dict[str, Any] = {}
    if profile.id != session.profile_id:
        changes["profile_id"] = profile.id
    if (session.provider, session.model) != (PROVIDER, profile.model):
        changes.update(provider=PROVIDER, model=profile.model)
    stored = {(r.kind, r.uri, r.created_by) for r in session.external_refs}
    if any((r.kind, r.uri, r.created_by) not in stored for r in request.external_refs):
        changes["add_external_refs"] = list(request.external_refs)
    if (request.images or request.attachments or request.inline_attachments) and not session.untrusted_ingested:
        changes["mark_untrusted_ingested"] = True
    return changes


def other_model_hint(profiles: ProfileRegistry, profile: Profile) -> str:
    """When a resumed session's model is not the one its profile names now: how to move it on."""
    configured = profiles.profiles.get(profile.id)
    if configured is None or configured.model == profile.model:
        return ""
    return (
        f" (the model this session last ran on), or continue it on the profile's model "
        f"{configured.model!r} by passing profile_id={profile.id!r}"
    )


async def open_turn(
    deps: AgentDeps,
    sessions: SessionRuntime[Turn],
    publish: Callable[[pb.AgentEvent], None],
    request: TurnRequest,
    metadata: tuple[tuple[str, str], ...],
) -> tuple[Turn, TurnInput]:
    """The turn, and what it answers (the request checked first: validate_turn)."""
    warm = None
    if request.session_id:
        warm = sessions.take_warm(request.session_id, metadata)
        # Else the CONTEXT view: the turn starts from it without loading the session again.
        session = warm or await whole_context(deps.store.GetSession, request.session_id)
        profile = (
            deps.profiles.get(request.profile_id)
            if request.profile_id
            else deps.profiles.resumed(session.profile_id, session.provider, session.model)
        )
    else:
        profile = deps.profiles.get(request.profile_id)
    client_tools, client_wait = turn_client_tools(request, profile, deps.settings)
    try:
        facts = await deps.ollama.model_facts(profile.model)
    except Unavailable as exc:
        raise Unavailable(
            f"{exc}; then `ollama pull {profile.model}` for profile {profile.id!r}"
            + other_model_hint(deps.profiles, profile)
        ) from None
    if not request.session_id:
        session = (
            await deps.store.CreateSession(
                store_pb.CreateSessionRequest(
                    profile_id=profile.id,
                    provider=PROVIDER,
                    model=profile.model,
                    external_refs=request.external_refs,
                )
            )
        ).session
    files = await turn_files(deps, request, session.id)
    if request.inline_attachments:  # storing them moved the session on (its taint): start from the store
        session, warm = await whole_context(deps.store.GetSession, session.id), None
    settings = deps.settings
    conversation = StoredConversation(
        deps.store,
        session.id,
        vouching_metadata(settings.auth_enabled, settings.jwt_secret),
        timeout=settings.rpc_timeout_s,
    )
    conversation.adopt(session)
    conversation.from_cache = warm is not None
    sink = EventSink(session.id, publish=publish, turn_id=uuid.uuid4().hex)
    turn = Turn(
        TurnContext(
            deps,
            conversation,
            profile,
            sink,
            metadata,
            facts,
            spawn=run_subagent,
            opened_generation=sessions.generation(session.id),
            session_changes=MappingProxyType(session_changes(session, profile, request)),
        )
    )
    return turn, TurnInput(
        request.text,
        list(request.images),
        request.hidden,
        files,
        cwd=turn_cwd(request.cwd),
        client_tools=client_tools,
        client_tool_timeout_s=client_wait,
    )


async def turn_files(deps: AgentDeps, request: TurnRequest, session_id: str) -> list[str]:
    """The turn's files, stored before the stream begins so a refusal is the call's status. A
    session made for this turn goes again when its files are refused: nothing stays of it."""
    if not (request.attachments or request.inline_attachments):
        return []
    try:
        return await store_attachments(deps.store, session_id, request)
    except BaseException:
        if not request.session_id:
            with suppress(PalimpsestError):
                await deps.store.DeleteSession(store_pb.DeleteSessionRequest(session_id=session_id))
        raise

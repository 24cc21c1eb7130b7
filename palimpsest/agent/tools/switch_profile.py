"""switch_profile: move this session to another agent profile (model, instructions, tools).

The tool records the switch (the profile and its model) in the session and in the turn's state; the loop reloads the profile
and its tools after the tool batch. The profile must exist: the tool reads the configured
profiles file itself (PALIMPSEST_PROFILES through ctx.settings) so a typo never lands in the
session, where it would break the session's next turn.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from palimpsest.agent.profiles import PROVIDER, Profile, ProfileRegistry
from palimpsest.agent.tools.base import Reach, ToolContext, ToolResult
from palimpsest.agent.tools.common import ToolInputError, error, text_arg

log = logging.getLogger("palimpsest.agent.tools")

_PROFILE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


async def configured_profiles(ctx: ToolContext) -> dict[str, Profile] | None:
    """The profiles as configured now; None when the file cannot be read (the loop will judge)."""
    try:
        registry = await asyncio.to_thread(ProfileRegistry.load, ctx.settings.profiles_path)
    except Exception:  # noqa: BLE001 — a broken file is the loop's to report, not this tool's
        log.warning("could not read the profiles file %r", ctx.settings.profiles_path, exc_info=True)
        return None
    return registry.profiles


class SwitchProfileTool:
    name = "switch_profile"
    reach = Reach.ENGINE  # the session's profile: nothing outside Palimpsest
    description = (
        "Switch this conversation to another agent profile (its model, instructions and tools apply from your "
        "next step on). Use it when the user asks for it or the task clearly needs that profile."
    )
    parameters = {
        "type": "object",
        "properties": {"profile_id": {"type": "string", "description": "The id of the profile to switch to."}},
        "required": ["profile_id"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            profile_id = text_arg(args, "profile_id", required=True)
        except ToolInputError as exc:
            return error(f"switch_profile: {exc}")
        if not _PROFILE_ID.match(profile_id):
            return error(f"switch_profile: {profile_id!r} is not a profile id (letters, digits, '_', '-', '.')")
        if ctx.is_subagent:
            return error("switch_profile: a sub-agent cannot switch its parent's profile.")
        if profile_id == ctx.profile.id:
            return ToolResult(content=f"Already using profile {profile_id}.", untrusted=False)
        profiles = await configured_profiles(ctx)
        if profiles is not None and profile_id not in profiles:
            return error(f"switch_profile: no profile {profile_id!r}. Configured: {', '.join(profiles)}.")
        target = profiles.get(profile_id) if profiles else None
        if ctx.session_id and ctx.update_session is not None:
            # The profile and its model in one write: a session resumes on the model it last ran
            # on, so a switch that recorded only the profile would resume on the old model. Model
            # "" (the file unreadable just now): the profile's own model, whatever it is then.
            await ctx.update_session(profile_id=profile_id, provider=PROVIDER, model=target.model if target else "")
        ctx.state.switched_profile = profile_id
        about = f" ({target.name}: {target.description})" if target else ""
        return ToolResult(
            content=f"Switched to profile {profile_id}{about}. Its model, instructions and tools "
            "apply from the next step.",
            untrusted=False,
        )

"""A size check's dry run, kept for the Compress the Agent sends next."""

from __future__ import annotations

from dataclasses import dataclass, field

from palimpsest.compressor.pricing import Knobs, Pricing
from palimpsest.compressor.stages import Staged
from palimpsest.v1 import common_pb2

# The dry run's reads kept for the Compress that follows: a few sessions, none above this size.
DRY_RUN_SESSIONS = 8
DRY_RUN_KEEP_BYTES = 4 * 1024 * 1024


@dataclass
class DryRun:
    """What a size check's dry run read and planned, for the Compress the Agent sends next: that
    Compress names the revision read, and plans nothing the dry run planned already."""

    session: common_pb2.Session
    pricing: Pricing
    knobs: Knobs
    window: int
    prompt_tokens: int
    plans: dict[int, Staged] = field(default_factory=dict)  # by keep_recent_messages

    def plan_for(
        self, keep: int, pricing: Pricing, knobs: Knobs, window: int, prompt_tokens: int, prune: bool
    ) -> Staged | None:
        if keep not in self.plans or (knobs, window, prompt_tokens) != (self.knobs, self.window, self.prompt_tokens):
            return None
        staged = self.plans[keep]
        return staged if pricing.plans_like(self.pricing) and staged.pruned_stage == prune else None

"""A turn's compressions: one run when a size check asks, what it keeps verbatim, and the post-turn
pass (a new session's title, then a compression on the real count)."""

from __future__ import annotations

from palimpsest.agent.stages.upkeep import (
    compress as run_compression,
)
from palimpsest.agent.stages.upkeep import (
    compress_after_turn,
    pruning_request,
    recalled_for_request,
    title_session,
    worth_pruning_after,
)
from palimpsest.agent.turn_base import TurnBase
from palimpsest.agent.turn_context import END
from palimpsest.shared.prose_weight import prune_sizes
from palimpsest.v1 import compressor_pb2 as cpb


class TurnCompression(TurnBase):
    """The compression side of a turn."""

    async def compress(self, reason: cpb.CompressionReason, current_tokens: int, keep_recent_messages: int = 0) -> bool:
        """Run one compression (see stages.upkeep.compress); a failure is logged and the turn goes on."""
        return await run_compression(
            self.deps.compressor,
            self.conv,
            self.sink,
            cpb.CompressRequest(
                session_id=self.session_id,
                reason=reason,
                model=self.on.profile.model,
                window=self.on.window,
                keep_recent_messages=keep_recent_messages,
                settings=self.on.profile.compression_settings(),
                current_tokens=current_tokens,
                expected_revision=self.conv.revision,
                prompt_head=self._prompt_head(),
                tool_schemas=self.on.tool_schemas_json(),
            ),
        )

    def _pruning_request(self, in_loop: bool = False) -> cpb.CompressRequest:
        """TURN_END: after the turn, or between a tool loop's iterations (the turn owns the session)."""
        revision = self.conv.revision if in_loop else None
        return pruning_request(self.session_id, self.on.profile, self.on.window, self.last_prompt_tokens, revision)

    def _worth_pruning(self, in_loop: bool = False) -> bool:
        """A TURN_END prune is on and would free min_freed (a cheap test: a turn of short results
        costs no Compressor call, on the loop's path before its next model call least of all)."""
        min_chars = int(self.settings.compression_min_freed * self.on.window * 2)  # ~2 characters a token
        return self.settings.compression_prune_after_turn and worth_pruning_after(
            self.conv.context, min_chars, prune_sizes(self.on.window), in_loop=in_loop
        )

    async def shed_recall(self, prompt_tokens: int) -> bool:
        """Before a mid-turn compression: a TURN_END prune told the next prompt's size, which leaves
        out the excerpts recalled for the loop's request when that keeps the prompt under the
        trigger (see stages.shed_recall). Whether it did anything (the conversation is reloaded)."""
        on = self._compression_on() and self.settings.compression_prune_after_turn
        if not (on and recalled_for_request(self.conv.context)):
            return False
        request = self._pruning_request(in_loop=True)
        request.next_prompt_tokens = prompt_tokens
        return await run_compression(self.deps.compressor, self.conv, self.sink, request)

    async def prune_loop_results(self, iteration: int) -> None:
        """The loop's older results to previews before its next call: a loop does not fill the window."""
        if iteration and self._compression_on() and self._worth_pruning(in_loop=True):
            await run_compression(self.deps.compressor, self.conv, self.sink, self._pruning_request(True))

    def _midturn_keep(self) -> int:
        return max(12, 2 * self._keep_recent())

    def _keep_for(self, iteration: int) -> int:
        """Messages a compression keeps verbatim: the pre-turn plan keeps whole turns (0 here), a
        mid-turn one the newest messages of the long turn under way."""
        return 0 if iteration == 0 else self._midturn_keep()

    async def post_turn(self) -> None:
        """After stream_end, off the client's path: a new session's title, then a compression on the
        real count, or because the last prompt came back truncated (the Compressor knows from the
        session's flag)."""
        answered = self.result.reason == END.STREAM_END_REASON_COMPLETED and self.result.text.strip()
        if self.first_words and answered and self.settings.session_titles:
            await title_session(
                self.deps.ollama,
                self.conv,
                self.sink,
                model=self.on.profile.model,
                window=self.on.window,
                thinking=self.on.facts.thinking,
                goal=self.state.goal,
                answer=self.result.text,
                first_words=self.first_words,
            )
        if not self._compression_on() or self.result.reason == END.STREAM_END_REASON_UNSPECIFIED:
            return
        if self._worth_pruning():
            # The turn's tool results, and old long prose, to previews: later turns do not carry them whole.
            pruned = await compress_after_turn(self.deps.compressor, self.sink, self._pruning_request())
            self.compressed_after = self.compressed_after or pruned
            if pruned and not self.prompt_cut and not self.conv.flagged_cut:
                return  # the prompt shrank: the next turn's size check judges the rest
        if (
            self.last_trigger
            and self.last_prompt_tokens < self.last_trigger
            and not self.prompt_cut
            and not self.conv.flagged_cut
        ):
            return  # the last prompt was under the trigger and whole: the Compressor would say so
        compressed = await compress_after_turn(
            self.deps.compressor,
            self.sink,
            cpb.CompressRequest(
                session_id=self.session_id,
                reason=cpb.COMPRESSION_REASON_POSTTURN,
                model=self.on.profile.model,
                window=self.on.window,
                keep_recent_messages=self._midturn_keep(),
                only_if_over_threshold=True,
                current_tokens=self.last_prompt_tokens,
                settings=self.on.profile.compression_settings(),
                prompt_head=self._prompt_head(),
                tool_schemas=self.on.tool_schemas_json(),
            ),
        )
        self.compressed_after = self.compressed_after or compressed

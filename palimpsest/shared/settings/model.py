"""Settings of the model and of compression: Ollama, the window, and the Compressor's defaults.

A compression setting a profile may override is named after its CompressionSettings field
(compressor.proto): field ``compression_<name>``, variable ``PALIMPSEST_COMPRESSION_<NAME>``, profile
key ``compression_<name>``; ``palimpsest.compressor.pricing.Knobs`` applies the overrides by that name.
"""

from __future__ import annotations

from dataclasses import dataclass

from palimpsest.shared.settings.declare import setting
from palimpsest.shared.settings.paths import normalize_ollama_host


@dataclass(frozen=True)
class ModelSettings:
    """Model and compression"""

    ollama_host: str = setting(
        "OLLAMA_HOST",
        "http://127.0.0.1:11434",
        "Ollama (`host`, `host:port` and `0.0.0.0` accepted, as Ollama does)",
        convert=normalize_ollama_host,
    )
    ollama_num_ctx: int = setting(
        "PALIMPSEST_CONTEXT_WINDOW",
        8192,
        "the window when a profile sets none; always sent to Ollama as `num_ctx`, at most the model's trained "
        "context (a larger window, here or in a profile, is clamped with a warning and "
        "`model_info.requested_context_window`)",
        old=("OLLAMA_NUM_CTX",),
        least=1,
    )
    compression_enabled: bool = setting(
        "PALIMPSEST_COMPRESSION_ENABLED",
        True,
        "compression on or off",
        old=("CONTEXT_COMPRESSION_ENABLED",),
    )
    compression_threshold: float = setting(
        "PALIMPSEST_COMPRESSION_THRESHOLD",
        0.90,
        "compress at this share of the window, in real tokens (never above the size check's limit)",
        old=("CONTEXT_COMPRESSION_THRESHOLD",),
    )
    compression_target: float = setting(
        "PALIMPSEST_COMPRESSION_TARGET",
        0.65,
        "after compressing, the prompt (kept region, summary, system prompt and tool schemas) fits this share "
        "of the window — lower when the conversation's own turns need more room: a compression leaves four "
        "turns of the size its newest six had (tool results at the size they arrived) before the trigger, and "
        "a summary goes to 0.6 of the target, so the room an LLM call makes lasts; when it cannot (the newest "
        "turn alone is larger), the `context_compressed` event's `shortfall` says why, beside "
        "`tokens_before`, `tokens_after` and `target_tokens` (also in the compression's record and the "
        "`compressor.compressed` log line)",
        old=("CONTEXT_COMPRESSION_TARGET",),
    )
    compression_min_freed: float = setting(
        "PALIMPSEST_COMPRESSION_MIN_FREED",
        0.05,
        "an automatic compression that would free less than this share of the window is not run "
        "(FAILED_PRECONDITION, nothing changes): an LLM call that frees a few hundred tokens buys a turn at "
        "most. A forced compaction, or a prompt over the limit or cut by Ollama, only needs to free "
        "something. A profile sets it with `compression_min_freed`",
        old=("CONTEXT_COMPRESSION_MIN_FREED",),
    )
    compression_prune_tool_results: bool = setting(
        "PALIMPSEST_COMPRESSION_PRUNE_TOOL_RESULTS",
        True,
        "the first stage of every compression: replace each tool result (1,200+ characters) older than the "
        "newest tool call — older iterations of the turn under way included — by its first 300 characters and "
        "a pointer, and the long arguments (1,200+ characters) of older calls by their first 200 characters "
        "per string; a critical result (of `critical_tools`, or marked critical by its tool) keeps 4,000 "
        "characters, or its first and last 2,000. When that alone leaves the headroom (below), no summary "
        "runs (no LLM call); otherwise the summary covers only what remains over it. Long requests and answers "
        "older than the newest turn (1,000+ characters, a CJK text counted three times) are condensed to their "
        "first 300 and last 150 characters (a third of that in CJK) and a pointer; a request the user marked "
        "important is not. The result and prose sizes (not the arguments' or a critical result's) are for a "
        "window of 16,384 tokens or more; a smaller one scales them to its share (8,192: half, a result of "
        "600+ characters keeps 150; 4,096 or less: a quarter). The "
        "display history keeps every byte; `memory_search` finds the pruned text. A "
        "profile sets it with `compression_prune_tool_results` (it governs every pruning stage, "
        "`PALIMPSEST_COMPRESSION_PRUNE_AFTER_TURN`'s too); a forced compaction always summarizes",
        old=("CONTEXT_COMPRESSION_PRUNE_TOOL_RESULTS",),
    )
    compression_prune_after_turn: bool = setting(
        "PALIMPSEST_COMPRESSION_PRUNE_AFTER_TURN",
        True,
        "the Agent asks the Compressor (`COMPRESSION_REASON_TURN_END`, no LLM call) to prune a turn's tool "
        "results and long call arguments as soon as the turn ends, and a tool loop's older results before its "
        "next call, whatever the prompt's size; after the turn, old long requests and answers are condensed too "
        "(as above). Each part runs only when it frees `PALIMPSEST_COMPRESSION_MIN_FREED` of the window. Inside "
        "a loop whose next call's size check reaches the trigger, the excerpts recalled for its request go first "
        "(whatever they free) when that keeps the prompt under it, rather than a compression. A "
        "result is then sent whole to the call that reads it, and as a preview after: the turns that follow do "
        "not fill the window with it, so compressions (and summaries) come less often. `false`: results stay "
        "whole until a compression needs the room",
    )
    compression_index_memory: bool = setting(
        "PALIMPSEST_COMPRESSION_INDEX_MEMORY",
        True,
        "the Compressor writes what each compression drops as memory chunks (what `memory_search` and the "
        "recall before a turn find); `false`: compressions index nothing (the display history still keeps "
        "every message, and chunks indexed before stay searchable). A profile turns it off for its sessions "
        'with `"compression_index_memory": false`',
        old=("PALIMPSEST_MEMORY_SEARCH_ENABLED",),
    )
    compression_keep_recent: int = setting(
        "PALIMPSEST_COMPRESSION_KEEP_RECENT",
        4,
        "turns kept verbatim (mid-turn: `max(12, 2 × this)` messages)",
        old=("CONTEXT_KEEP_RECENT",),
        least=0,
    )
    compression_summary_temperature: float = setting(
        "PALIMPSEST_COMPRESSION_SUMMARY_TEMPERATURE",
        0.3,
        "summarizer temperature",
        old=("CONTEXT_SUMMARY_TEMPERATURE",),
        least=0,
    )
    compression_summary_max_tokens: int = setting(
        "PALIMPSEST_COMPRESSION_SUMMARY_MAX_TOKENS",
        6000,
        "summarizer output cap; the summary's input is cut to leave it this much of the summary's `num_ctx` "
        "(at most a quarter), and `num_predict` is lowered so prompt and summary always fit. A summary is "
        "asked for a twelfth of what it condenses (a tool result weighed at 200 tokens at most; at least 96 "
        "tokens, at most a sixteenth of the window, in words), with `num_predict` twice that",
        unit="tokens",
        old=("CONTEXT_SUMMARY_MAX_TOKENS",),
        least=1,
    )
    compression_summarizer_window: int = setting(
        "PALIMPSEST_COMPRESSION_SUMMARIZER_WINDOW",
        0,
        "`num_ctx` of summaries written by a separate `summarizer_model` (capped at that model's context "
        "length). Summaries by the conversation's own model always use the conversation's window: another "
        "`num_ctx` makes Ollama reload the model",
        old=("CONTEXT_SUMMARIZER_NUM_CTX",),
        least=0,
        default_doc="`0` (= `PALIMPSEST_CONTEXT_WINDOW`)",
    )
    compression_message_token_budget: int = setting(
        "PALIMPSEST_COMPRESSION_MESSAGE_TOKEN_BUDGET",
        0,
        "one message bigger than this is head/tail-cut in the view the model gets",
        old=("CONTEXT_MESSAGE_TOKEN_BUDGET",),
        least=0,
        default_doc="`0` (= window / 6)",
    )
    output_reserve_tokens: int = setting(
        "PALIMPSEST_OUTPUT_RESERVE_TOKENS",
        2048,
        "headroom for the answer in the size check, capped at a quarter of the window",
        unit="tokens",
        old=("OUTPUT_RESERVE_TOKENS",),
        least=0,
    )
    image_tokens_fallback: int = setting(
        "PALIMPSEST_IMAGE_TOKENS",
        1024,
        "price of an image whose header cannot be read (readable ones: by area)",
        unit="tokens",
        old=("CONTEXT_IMAGE_TOKENS",),
        least=1,
    )

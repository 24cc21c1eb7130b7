"""Both Ollama engines under the 300-turn conversation: the old runners (a prompt over num_ctx
loses its head) and llama-server (0.30.0 on: old messages dropped, or with `truncate: false` the
prompt refused), for a model counted exactly and one counted without its vocabulary."""

from __future__ import annotations

from bench import _common
from bench.agent import WINDOW, DenseOutputTool, _dense_log_tokens, _long_path

NEEDS_POSTGRES = True
# The simulator's engine follows the version it reports (ollama_sim/engines.py).
ENGINES = {"runners (0.12.0)": "0.12.0", "llama-server (0.30.2)": "0.30.2"}
PATHS = {
    "exact": "Qwen 3.6, its vocabulary served: exact counts",
    "calibrated": "no vocabulary served (as for a family we cannot count): calibrated prices",
}
# Three tokens a character each to the simulator's tokenizer, where a count without the model's
# vocabulary starts at about half a token: outputs our count underestimates until it has learned them.
GLYPHS = "ꙮ𝔘𝔙𝔚ꙭ"


class GlyphOutputTool(DenseOutputTool):
    """The long run's tool, whose dense outputs are text in a script three tokens a character."""

    async def run(self, args: dict, ctx):
        from palimpsest.agent.tools.base import ToolResult

        if args.get("kind") != "dense":
            return await super().run(args, ctx)
        turn = int(args["topic"].rsplit("-", 1)[-1])
        chars = _dense_log_tokens(turn)  # 300–3,000 characters: 900–9,000 tokens, before the view's cut
        return ToolResult(content="".join(GLYPHS[(i * 7 + turn) % len(GLYPHS)] for i in range(chars)))


async def run(args) -> str:
    rows = []
    for engine, version in ENGINES.items():
        for path, what, tool in [
            *((p, w, "bench.agent:DenseOutputTool") for p, w in PATHS.items()),
            (
                "calibrated",
                "no vocabulary, dense outputs in a script of 3 tokens a character",
                "bench.engines:GlyphOutputTool",
            ),
        ]:
            stats: dict = {}
            row, _ = await _long_path(args.server, args.quick, path, version, stats, tool)
            turns, highest = row[1], stats["highest"]
            rows.append(
                [
                    engine,
                    what,
                    turns,
                    stats["lost"],
                    stats["cut"],
                    stats["dropped"],
                    stats["refusals"],
                    stats["too_large"],
                    highest,
                ]
            )
    turns = rows[0][2]
    return (
        f"The {turns}-turn conversation of `bench agent` (an {WINDOW}-token window, large and dense tool "
        "outputs, images) on each engine the simulator models, chosen by the Ollama version it reports; the "
        "third model's dense outputs are 300–3,000 characters in a script the simulator counts at 3 tokens a "
        "character, which a count without the model's vocabulary underestimates until its calibration has "
        "learned it. "
        "Every request says `truncate: false`, which the old runners ignore. *Turns lost*: turns that did "
        "not end COMPLETED. *Prompts cut*: chat prompts the simulator cut (the runners' front cut, or "
        "llama-server's dropped messages or context shift); *messages dropped*: whole messages llama-server "
        "left out; *refused*: HTTP 400 refusals of a prompt over the window (each answered by compressing or "
        "halving the largest tool result and one retry). *Highest real prompt ÷ limit*: the simulator's "
        f"count of the largest chat prompt over the size check's limit ({WINDOW - 2048}).\n\n"
        + _common.table(
            [
                "engine",
                "model",
                "turns",
                "turns lost",
                "prompts cut",
                "messages dropped",
                "refused",
                "ended CONTEXT_TOO_LARGE",
                "highest real prompt ÷ limit",
            ],
            rows,
        )
    )

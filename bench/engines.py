"""Both Ollama engines under the 300-turn conversation: the old runners (a prompt over num_ctx
loses its head) and llama-server (0.30.0 on: old messages dropped, or with `truncate: false` the
prompt refused), for a model counted exactly and one counted without its vocabulary."""

from __future__ import annotations

from bench import _common
from bench.agent import WINDOW, _long_path

NEEDS_POSTGRES = True
# The simulator's engine follows the version it reports (ollama_sim/engines.py).
ENGINES = {"runners (0.12.0)": "0.12.0", "llama-server (0.30.2)": "0.30.2"}
PATHS = {"exact": "Qwen 3.6, its vocabulary served: exact counts",
         "calibrated": "no vocabulary served (as for a family we cannot count): calibrated prices"}


async def run(args) -> str:
    rows = []
    for engine, version in ENGINES.items():
        for path, what in PATHS.items():
            stats: dict = {}
            row, _ = await _long_path(args.server, args.quick, path, version, stats)
            turns, highest = row[1], row[7]
            rows.append([engine, what, turns, stats["lost"], stats["cut"], stats["dropped"], stats["refusals"],
                         stats["too_large"], highest])
    turns = rows[0][2]
    return (f"The {turns}-turn conversation of `bench agent` (an {WINDOW}-token window, large and dense tool "
            "outputs, images) on each engine the simulator models, chosen by the Ollama version it reports. "
            "Every request says `truncate: false`, which the old runners ignore. *Turns lost*: turns that did "
            "not end COMPLETED. *Prompts cut*: chat prompts the simulator cut (the runners' front cut, or "
            "llama-server's dropped messages or context shift); *messages dropped*: whole messages llama-server "
            "left out; *refused*: HTTP 400 refusals of a prompt over the window (each answered by compressing or "
            "halving the largest tool result and one retry). *Highest real prompt ÷ limit*: the simulator's "
            f"count of the largest chat prompt over the size check's limit ({WINDOW - 2048}).\n\n"
            + _common.table(["engine", "model", "turns", "turns lost", "prompts cut", "messages dropped",
                             "refused", "ended CONTEXT_TOO_LARGE", "highest real prompt ÷ limit"], rows))

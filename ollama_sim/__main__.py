"""Run the simulator standalone: ``python -m ollama_sim --port 11434``."""

from __future__ import annotations

import argparse
import signal
import threading

from .engines import LLAMA_SERVER_SINCE
from .server import VERSION, OllamaSimulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ollama_sim",
        description="Serve a simulated Ollama API (/api/chat, /api/show, /api/embed, /api/tags, /api/version) "
        "for tests, the demo and the benchmarks; point OLLAMA_HOST at it.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port",
        type=int,
        default=11434,
        help="port to listen on (default: %(default)s, Ollama's own; 0 picks a free one)",
    )
    since = ".".join(map(str, LLAMA_SERVER_SINCE))
    parser.add_argument(
        "--version",
        default=VERSION,
        dest="ollama_version",
        help="the Ollama version /api/version reports, which chooses the engine modelled: before "
        f"{since} Ollama's own runners (a prompt over num_ctx loses its head), {since} or later "
        "llama-server (old messages dropped; `truncate: false` refused with HTTP 400) "
        "(default: %(default)s)",
    )
    args = parser.parse_args(argv)

    stop = threading.Event()
    # SIGTERM as well as Ctrl-C, so process managers can stop it cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with OllamaSimulator(host=args.host, port=args.port, version=args.ollama_version) as sim:
        print(
            f"Ollama simulator {sim.version} ({sim.engine}) listening on {sim.url} (models: {', '.join(sim.models)})",
            flush=True,
        )
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

"""Run the simulator standalone: ``python -m ollama_sim --port 11434``."""

from __future__ import annotations

import argparse
import signal
import threading

from .server import OllamaSimulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ollama_sim",
        description="Serve a simulated Ollama API (/api/chat, /api/show, /api/embed, /api/tags, /api/version) "
                    "for tests, the demo and the benchmarks; point OLLAMA_HOST at it.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=11434,
                        help="port to listen on (default: %(default)s, Ollama's own; 0 picks a free one)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    # SIGTERM as well as Ctrl-C, so process managers can stop it cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with OllamaSimulator(host=args.host, port=args.port) as sim:
        print(f"Ollama simulator listening on {sim.url} (models: {', '.join(sim.models)})", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

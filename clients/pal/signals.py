"""Ctrl-C always reaches pal's main thread.

The kernel hands a process-wide SIGINT to any thread that does not block it, and gRPC runs threads
of its own. When one of them takes it, Python only notes the signal; a main thread blocked reading
the terminal never wakes to act on it, so a second Ctrl-C seemed ignored until the next key. So
SIGINT is blocked in every thread (threads inherit the mask of the one that starts them), one small
thread waits for it, and forwards it to the main thread as SIGUSR1, which interrupts that read. The
SIGUSR1 handler runs whatever SIGINT handler is installed at that moment.
"""

from __future__ import annotations

import signal
import threading


def _run_sigint_handler(signum: int, frame) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    elif handler == signal.SIG_DFL:
        raise KeyboardInterrupt


def route_sigint_to_main_thread() -> None:
    """Call first thing, before any gRPC channel exists (its threads must inherit the mask)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    main = threading.main_thread().ident
    assert main is not None  # the main thread is running: it has an ident
    signal.signal(signal.SIGUSR1, _run_sigint_handler)

    def forward() -> None:
        while True:
            signal.sigwait({signal.SIGINT})
            signal.pthread_kill(main, signal.SIGUSR1)

    threading.Thread(target=forward, name="pal-sigint", daemon=True).start()

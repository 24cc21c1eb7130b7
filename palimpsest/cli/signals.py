"""Ctrl-C always reaches pal's main thread.

The kernel hands a process-wide SIGINT to any thread that does not block it, and gRPC runs threads
of its own. When one of them takes it, Python only notes the signal; a main thread blocked reading
the terminal never wakes to act on it, so a second Ctrl-C seemed ignored until the next key. So
SIGINT is blocked in every thread (threads inherit the mask of the one that starts them), one small
thread waits for it, and forwards it to the main thread as SIGUSR1, which interrupts that read. The
SIGUSR1 handler runs whatever SIGINT handler is installed at that moment.

One SIGUSR1 is not always enough: landing after readline printed its prompt but before it waits on
the terminal, it is noted and nothing looks at the note until the next key (Ctrl-C at a fresh
prompt then seemed ignored; seen under load). So each Ctrl-C is numbered and sent again until the
main thread has handled it, and a repeat of one already handled does nothing.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# How often a Ctrl-C not yet handled by the main thread is sent to it again.
RESEND_S = 0.05

_taken = 0  # Ctrl-Cs the forwarding thread took
_handled = 0  # the last of them the main thread handled
_handled_now = threading.Condition()


def _run_sigint_handler(signum: int, frame: FrameType | None) -> None:
    global _handled
    with _handled_now:
        if _handled >= _taken:
            return  # a repeat of a Ctrl-C already handled
        _handled = _taken
        _handled_now.notify_all()
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
        global _taken
        while True:
            signal.sigwait({signal.SIGINT})
            with _handled_now:
                _taken += 1
                number = _taken
                while _handled < number:
                    signal.pthread_kill(main, signal.SIGUSR1)
                    _handled_now.wait(RESEND_S)

    threading.Thread(target=forward, name="pal-sigint", daemon=True).start()

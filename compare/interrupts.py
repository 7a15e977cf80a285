"""Ctrl-C and SIGTERM in a run: what they stop, and what they wait for.

SIGTERM (a job's time limit, ``kill``) stops a run the way Ctrl-C does: a
``KeyboardInterrupt`` in the main thread.  While an op's pages are being
written both wait (``deferred``): the pages of what ran are written whole,
results.json, results.csv, throughput.png, report.md and the capture's index
alike, and the interrupt is raised once they are.  The writes take seconds;
SIGKILL still stops everything at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, while the block runs."""
    if not _main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred(say=None):
    """Ctrl-C and SIGTERM wait until the block is done, then raise KeyboardInterrupt.  ``say(text)``,
    if given, tells the user that the interrupt was received and what it waits for."""
    if not _main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum, frame):
        if not received and say is not None:
            say("interrupt received: writing the pages of what ran first")
        received.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt(f"signal {received[0]}")

"""One status line on stderr while a sweep runs, and a word when a step takes long."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

LONG_STEP_S = 10.0  # a step (a first call: compile, autotune) running this long is announced


class Progress:
    def __init__(self, stream=None, enabled: bool = True, statuses: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.statuses = statuses  # False: messages and notes only (a worker of a split sweep)
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self._open_line = False
        self._lock = threading.Lock()  # lines come from a timer thread too (``long_step``)

    def status(self, text: str, detail: bool = False) -> None:
        """Replace the status line.  When stderr is not a terminal each status is a
        line of its own, and ``detail`` ones (every timing round...) are left out."""
        if not self.enabled or not self.statuses or (detail and not self.tty):
            return
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        with self._lock:
            if self.tty:
                self.stream.write("\r\033[K" + line[:160])
                self._open_line = True
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """A line that stays (a table, a warning)."""
        with self._lock:
            if self._open_line:
                self.stream.write("\r\033[K")
                self._open_line = False
            self.stream.write(text + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A line that stays, left out with the progress display (``--quiet``)."""
        if self.enabled:
            self.message(text)

    def close(self) -> None:
        with self._lock:
            if self._open_line:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._open_line = False


@contextlib.contextmanager
def long_step(progress: Progress, what: str, why: str, after_s: float | None = None):
    """Announce ``what`` once it has run ``after_s`` seconds (saying ``why`` it may), and then how long it took.

    The block yields a list; strings appended to it (what the step turned out to do: Triton
    autotuning a kernel) are added to the closing line."""
    after_s = LONG_STEP_S if after_s is None else after_s
    details: list[str] = []
    start = time.monotonic()
    timer = threading.Timer(after_s, lambda: progress.note(f"{what}: still running after {after_s:.0f} s ({why})"))
    timer.daemon = True
    timer.start()
    try:
        yield details
    finally:
        timer.cancel()
        elapsed = time.monotonic() - start
        if elapsed >= after_s:
            extra = f": {'; '.join(details)}" if details else ""
            progress.note(f"{what}: took {elapsed:.1f} s{extra}")

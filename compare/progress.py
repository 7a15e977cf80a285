"""One status line on stderr while a sweep runs."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self._open_line = False

    def status(self, text: str, detail: bool = False) -> None:
        """Replace the status line.  When stderr is not a terminal each status is a
        line of its own, and ``detail`` ones (every timing round...) are left out."""
        if not self.enabled or (detail and not self.tty):
            return
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
            self._open_line = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that stays (a table, a warning)."""
        if self._open_line:
            self.stream.write("\r\033[K")
            self._open_line = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open_line:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._open_line = False

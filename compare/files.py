"""Writing a run folder's files whole: what every page, JSON and captured file of a run is written through."""

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` whole: a temporary file first, then renamed over it, so that a reader (or a second
    worker of a split sweep writing the same file) never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise

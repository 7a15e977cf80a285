"""Where a run writes, and how readers find the newest complete report.

    <root>/runs/<UTC time>-<pid>/<op>/...   everything one run wrote, never touched again
    <root>/<op>     -> runs/<run>/<op>      the newest *complete* report of the op
    <root>/latest   -> runs/<run>           the newest run that finished every op it was asked for

A run writes only inside its own folder (the pid keeps two runs started in
the same second apart).  A link is repointed only after what it names is
complete, by creating the new link under a temporary name and renaming it
over the old one: ``rename`` is atomic, so a reader sees the old target or
the new one, never a missing or half-written one, whatever happens to the
run (Ctrl-C, a crash, a concurrent run finishing first).
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path


def new_run_dir(root: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    path = Path(root) / "runs" / f"{stamp}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def repoint(link: Path, target: Path) -> bool:
    """Make ``link`` a relative symlink to ``target``, atomically.  False (and nothing
    changed) when ``link`` exists and is not a symlink: a real folder is never replaced."""
    link = Path(link)
    if link.exists() and not link.is_symlink():
        return False
    rel = os.path.relpath(target, link.parent)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(rel, tmp)
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)  # no stray link left behind; the old one is untouched
        raise
    return True

"""What ``TORCH_LOGS`` says while a compiled variant compiles, collected in-process.

``inductor_logs()`` attaches one handler to the logging artifacts below for the length of a
block (the build and first call of a compiled variant) and keeps what they say; nothing goes
to stderr, and every logger is left as it was.

* ``output_code``: the module Inductor generated (``Output code: ...``) and the file it is
  kept in (``Output code written to: <path>``); ``modules_from`` turns them into modules;
* the stages that explain it, one file each beside output_code.py (``STAGES``): the graph
  Dynamo traced, the graph after AOT autograd and the post-grad passes, the scheduler's fusion
  decisions, why Dynamo recompiled, where it broke the graph.

Warm caches.  On an FX-graph-cache hit Inductor does not lower the graph again, so the
post-grad graph and the fusion decisions are not logged; the output code still is (or its
path).  So the stages a cold compile logged are kept, keyed by the output-code file's name
(a hash of the code), under ``stage_cache_dir()``, and a warm run reads them back
(``"source": "kept from the compile that made it"``); where none were kept (a cache warmed
before this existed) the index says so and how to see them (a fresh compile).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

LOG_CODE = "Output code: \n"
LOG_PATH = "Output code written to: "

# artifact -> (file beside output_code.py, what it holds)
STAGES = {
    "graph_code": ("graph.py", "the graph Dynamo traced (TORCH_LOGS=graph_code)"),
    "post_grad_graphs": ("post_grad_graph.py", "after AOT autograd and Inductor's post-grad passes (TORCH_LOGS=post_grad_graphs)"),
    "fusion": ("fusion.txt", "the scheduler's fusion decisions: candidates, fused pairs, rounds (TORCH_LOGS=fusion)"),
    "recompiles": ("recompiles.txt", "why Dynamo compiled the function again: the guards that failed (TORCH_LOGS=recompiles)"),
    "graph_breaks": ("graph_breaks.txt", "where and why Dynamo broke the graph (TORCH_LOGS=graph_breaks)"),
}  # fmt: skip
LOWERED = ("post_grad_graphs", "fusion")  # logged only when Inductor lowers the graph (not on a cache hit)
ARTIFACTS = ("output_code", *STAGES)
# Artifacts whose emitting code asks torch._logging whether they are on before it logs.
_ASKED_FOR = ("recompiles",)


class Collector(logging.Handler):
    """Everything the artifacts say in a block: output code and its paths, and each stage's messages."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.codes: list[str] = []
        self.paths: list[str] = []
        self.stages: dict[str, list[str]] = {name: [] for name in STAGES}

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to fix
            return
        if msg.startswith(LOG_CODE):  # the output_code artifact says one of two things
            code = msg[len(LOG_CODE) :]
            if code not in self.codes:
                self.codes.append(code)
        elif msg.startswith(LOG_PATH):
            path = msg[len(LOG_PATH) :].strip()
            if path not in self.paths:
                self.paths.append(path)
        else:
            artifact = (record.name or "").rpartition(".__")[2]
            if artifact in self.stages:
                self.stages[artifact].append(msg)


def artifact_loggers(names=ARTIFACTS) -> list[logging.Logger]:
    """The loggers of the artifacts ``names`` (each module that logs one has its own)."""
    import torch._dynamo.guards  # noqa: F401 - these modules define the artifact loggers
    import torch._dynamo.output_graph  # noqa: F401
    import torch._dynamo.symbolic_convert  # noqa: F401
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.graph  # noqa: F401
    import torch._inductor.scheduler  # noqa: F401

    found = [n for n in list(logging.root.manager.loggerDict) if n.rpartition(".__")[2] in names and ".__" in n]
    return [logging.getLogger(n) for n in found]


@contextlib.contextmanager
def _artifacts_asked_for():
    """Turn on, in torch._logging's own state, the artifacts whose code checks it before logging."""
    added = []
    with contextlib.suppress(Exception):
        from torch._logging._internal import log_state

        added = [n for n in _ASKED_FOR if n not in log_state.artifact_names]
        log_state.artifact_names.update(added)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            from torch._logging._internal import log_state

            log_state.artifact_names.difference_update(added)


@contextlib.contextmanager
def inductor_logs(names=ARTIFACTS):
    """Collect the artifacts ``names`` while the block runs; stderr sees nothing of them."""
    collector = Collector()
    loggers = artifact_loggers(names)
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.addHandler(collector)
    try:
        with _artifacts_asked_for():
            yield collector
    finally:
        for lg, level, propagate in saved:
            lg.removeHandler(collector)
            lg.setLevel(level)
            lg.propagate = propagate


def modules_from(collector: Collector) -> list[tuple[str, str, str | None]]:
    """(code, how it was obtained, file path) of every module the block compiled."""
    out = [(code, "log", None) for code in collector.codes]
    if out:
        paths = collector.paths
        return [(code, how, paths[i] if i < len(paths) else None) for i, (code, how, _) in enumerate(out)]
    for path in collector.paths:  # the code was not logged: read the module the log names
        try:
            out.append((Path(path).read_text(), "cached module file", path))
        except OSError:
            pass
    return out


# --------------------------------------------------------------------------
# The stages of one compile, kept for the warm runs that do not log them.
# --------------------------------------------------------------------------


def stage_cache_dir() -> Path:
    """Where the stages of cold compiles are kept: ``$TK_CACHE_DIR/inductor-stages`` (default ~/.cache/tk)."""
    root = os.environ.get("TK_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tk")
    return Path(root) / "inductor-stages"


def _key(paths: list[str]) -> str | None:
    """The key of a compile: its output-code files' names (hashes of the code), or None without a file."""
    return "-".join(sorted(Path(p).stem for p in paths)) or None


def remember(paths: list[str], stages: dict[str, str]) -> None:
    """Keep the lowering stages a cold compile logged (best effort: a read-only home only loses them)."""
    key, kept = _key(paths), {k: v for k, v in stages.items() if k in LOWERED and v}
    if key is None or not kept:
        return
    with contextlib.suppress(OSError):
        folder = stage_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, folder / f"{key}.json")


def recall(paths: list[str]) -> dict[str, str]:
    """The lowering stages kept for a compile with these output-code files, or {}."""
    key = _key(paths)
    if key is None:
        return {}
    try:
        return json.loads((stage_cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return {}


def stage_texts(collector: Collector) -> tuple[dict[str, str], dict[str, str]]:
    """({stage: text}, {stage: how it was obtained or why it is missing}) for one compile."""
    texts = {name: "\n\n".join(msgs).strip() + "\n" for name, msgs in collector.stages.items() if msgs}
    how = {name: "log" for name in texts}
    lowered = any(name in texts for name in LOWERED)
    if lowered:
        remember(collector.paths, texts)
    else:
        for name, text in recall(collector.paths).items():
            texts[name], how[name] = text, "kept from the compile that made it (Inductor's cache had the graph)"
    for name in STAGES:
        if name in texts:
            continue
        if name in LOWERED and collector.paths:
            how[name] = ("not logged: Inductor's FX-graph cache had this graph from an earlier process; "
                         "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 compiles it afresh")  # fmt: skip
        elif name == "recompiles":
            how[name] = "none: no recompilation while it compiled (each shape compiles after torch._dynamo.reset())"
        elif name == "graph_breaks":
            how[name] = "none: one graph"
        else:
            how[name] = "not logged"
    return texts, how

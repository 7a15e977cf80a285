"""``--configs``: tk's kernel under each configuration its op declares, per case: the view of Triton's
``perf_report``, time and throughput against the block sizes, warps and stages.

Which configurations a call has, and how to run one, is the op's (``OpSpec.configs``; matmul's are its
autotuner's candidates for the kernel the call takes, each with its tile fixed); the sweep here is
generic.  A case's configurations run as a case's variants do (``runner.sweep_case``): checked against
the float64 answer, timed in interleaved rounds, their throughput derived, the fastest correct one
marked.  One that fails (more shared memory than the GPU has, for its stages) is a failed row and the
others go on.  On a CPU they run in Triton's interpreter: their times are no performance figure, and
every page says so, as for tk.  The records go to the report's ``configs`` list (report.md's "Kernel
configurations", configs.png); the op's own comparison runs first, as without the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from . import runner
from .selection import UsageError
from .variants import Variant


def configurable(specs: dict) -> list[str]:
    """The ops (and models) whose spec declares configurations of tk's kernel."""
    return sorted(name for name, spec in specs.items() if spec.configs is not None)


def check(names: list[str], specs: dict) -> None:
    """A UsageError unless every op of the run declares configurations, naming the ops that do."""
    missing = [name for name in names if specs[name].configs is None]
    if missing:
        ops = ", ".join(configurable(specs)) or "none"
        verb = "has" if len(missing) == 1 else "have"
        raise UsageError(f"--configs: {', '.join(missing)} {verb} no configurable kernel (ops with one: {ops})")


def sweep(sweep, settings: runner.Settings, limits: dict, progress, on_records: Callable[[list[dict]], None]) -> None:
    """Every case of the op's sweep, each configuration a record handed to ``on_records`` case by case."""
    # tk's launches, compiled levels and traces are the comparison's, taken before: not again per configuration.
    settings = replace(settings, capture=None, profile_dir=None)
    for dtype, shape in sweep.cases():
        on_records(sweep_case(sweep.spec, dtype, shape, settings, limits, progress))


def sweep_case(spec, dtype: torch.dtype, shape: tuple, settings: runner.Settings, limits: dict, progress) -> list[dict]:
    """The records of one case's configurations.  Which configurations a call has can depend on its inputs (a
    matmul's kernel), so the inputs are made to ask, then made again by the runner, from the same seed."""
    try:
        torch.manual_seed(0)
        calls = spec.configs(*spec.make_inputs(shape, dtype, settings.device))
    except Exception as e:  # noqa: BLE001 - this case has no configurations to run; the next may
        record = runner.base_record(spec, Variant("configurations", "tk", None), dtype, shape, settings)
        record["error"] = runner.error_text("configurations", e)  # status: failed, the record's default
        return [record]
    variants = [Variant(label, "tk", call) for label, call in calls.items()]
    return runner.sweep_case(spec, variants, dtype, shape, settings, limits, progress)

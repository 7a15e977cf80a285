"""What a reader needs to know about the machine a report came from."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess

import torch


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")


def chosen_device(parser: argparse.ArgumentParser, choice: str | None) -> torch.device:
    """The device ``--device`` names, CUDA when it names none and there is one; a usage error for CUDA without one."""
    if choice == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    return torch.device(choice or ("cuda" if torch.cuda.is_available() else "cpu"))


def smi_id(visible: str | None, index: int) -> str:
    """How nvidia-smi names CUDA device ``index`` of this process: nvidia-smi ignores CUDA_VISIBLE_DEVICES, so a
    process pinned to "3" (a worker of a split sweep) must ask for 3, not 0.  Its entries are indices or UUIDs."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries[index] if index < len(entries) else str(index)


def nvidia_smi(query: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of the current GPU, or None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    gpu = smi_id(os.environ.get("CUDA_VISIBLE_DEVICES"), index)
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits", f"--id={gpu}"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def sm_clock_mhz() -> float | None:
    value = nvidia_smi("clocks.sm")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device) -> dict:
    import triton

    env = {
        "device_type": device.type,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            l2_cache_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1) or None,
            cuda=torch.version.cuda,
            driver=nvidia_smi("driver_version"),
            power_limit_w=nvidia_smi("power.limit"),
            sm_clock_max_mhz=nvidia_smi("clocks.max.sm"),
        )
    return env

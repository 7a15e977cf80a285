"""Worker processes of one process group, started once per test module, that run a test's function on every rank.

    ranks = Ranks(2)                       # two processes, gloo on the CPU; Ranks(2, "nccl") on two GPUs
    results = ranks.run(check_rows, 8)     # check_rows(rank, 8) on every rank; its results, by rank
    ranks.close()

A test module starts its ranks once (a module fixture: starting a process that imports torch and
tk costs seconds) and sends them its checks, each a module-level function ``f(rank, *args)`` of the
test module itself, which every worker imports by name (or path).  ``rank`` is a ``Rank``: its index,
the world size, a 1-D device mesh over every rank and the device.  An exception on any rank fails the
test with that rank's traceback; the ranks stay up for the next check (a check that leaves one rank
waiting in a collective ends in the process group's timeout, which fails the test too).

Every worker sets the NCCL settings multi-GPU machines need (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: no NVLink multicast) before anything
starts, whatever the backend.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import pytest
import torch.multiprocessing as mp

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVE_TIMEOUT_S = 120  # a rank left waiting in a collective fails after this
START_TIMEOUT_S = 300  # importing torch and tk in two fresh processes on two busy cores


@dataclass
class Rank:
    """What a check run on a worker is given: which rank it is and the mesh over every rank."""

    index: int
    size: int
    mesh: Any  # a 1-D DeviceMesh over every rank
    device: str  # "cpu", or "cuda:<index>"


class Ranks:
    """`world` worker processes, one process group (see the module docstring)."""

    def __init__(self, world: int = 2, backend: str = "gloo"):
        self.world = world
        context = mp.get_context("spawn")
        port = _free_port()
        self.inboxes = [context.Queue() for _ in range(world)]
        self.outbox = context.Queue()
        self.processes = [
            context.Process(target=_serve, args=(r, world, backend, port, self.inboxes[r], self.outbox), daemon=True)
            for r in range(world)
        ]
        for p in self.processes:
            p.start()
        self._collect(START_TIMEOUT_S, "start")

    def run(self, check, *args, timeout_s: float = 600) -> list:
        """``check(rank, *args)`` on every rank; the results in rank order."""
        module = sys.modules[check.__module__]
        message = (check.__module__, getattr(module, "__file__", None), check.__qualname__, args)
        for inbox in self.inboxes:
            inbox.put(message)
        return self._collect(timeout_s, check.__qualname__)

    def _collect(self, timeout_s: float, what: str) -> list:
        results, failures = {}, []
        deadline = time.monotonic() + timeout_s
        while len(results) + len(failures) < self.world:
            try:
                rank, ok, value = self.outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.processes) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.close()
                    why = f"ranks {dead} died" if dead else f"no answer in {timeout_s} s"
                    raise AssertionError(f"{what}: {why}")
                continue
            if ok:
                results[rank] = value
            else:
                failures.append(f"rank {rank}:\n{value}")
        if failures:
            raise AssertionError(f"{what} failed\n" + "\n".join(failures))
        return [results[r] for r in range(self.world)]

    def close(self) -> None:
        for inbox, p in zip(self.inboxes, self.processes):
            if p.is_alive():
                inbox.put(None)
        for p in self.processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(index: int, world: int, backend: str, port: int, inbox, outbox) -> None:
    """A worker: join the process group, then run each check sent until None comes."""
    os.environ.update(NO_MULTICAST)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        import ops  # noqa: F401  (the tk ops and their sharding rules)

        device = "cpu"
        if backend == "nccl":
            torch.cuda.set_device(index)
            device = f"cuda:{index}"
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        dist.init_process_group(backend, rank=index, world_size=world, timeout=timeout)
        rank = Rank(index, world, init_device_mesh(device.split(":")[0], (world,)), device)
    except BaseException:
        outbox.put((index, False, traceback.format_exc()))
        return
    outbox.put((index, True, None))
    try:
        while (message := inbox.get()) is not None:
            try:
                result = _check(*message[:3])(rank, *message[3])
                pickle.dumps(result)  # here, not in the queue's thread, where a failure would be lost
                outbox.put((index, True, result))
            except BaseException:
                outbox.put((index, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def _check(module_name: str, path: str | None, qualname: str):
    """The check function, from its module as the test run imported it (by name, else by path)."""
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    found = module
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def ranks_fixture(world: int = 2, backend: str = "gloo"):
    """A module-scoped pytest fixture of started Ranks (``ranks = ranks_fixture(2, "nccl")`` in a test module),
    closed after the module's last test."""

    @pytest.fixture(scope="module")
    def ranks():
        started = Ranks(world, backend)
        yield started
        started.close()

    return ranks

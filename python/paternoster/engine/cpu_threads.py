"""How many threads the engine runs, and on which cores (``--num-threads``).

The default (``num_threads`` 0, "auto") is the number of **physical cores
available to this process**, as llama.cpp and vLLM's CPU backend choose:

1. the CPUs this process may run on (``os.sched_getaffinity``; all of
   ``os.cpu_count()`` where that call does not exist);
2. grouped into physical cores by ``/sys/devices/system/cpu/cpuN/topology``
   (``physical_package_id`` + ``core_id``), so SMT (hyper-thread) siblings
   count once. Where ``/sys`` cannot be read, each CPU counts as a core;
3. capped by a cgroup CPU quota when there is one (cgroup v2 ``cpu.max``, v1
   ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, the tightest along the
   process's cgroup path): at most ``floor(quota / period)`` cores, at least 1
   (rounded down: a thread more than the quota allows is throttled mid-step);
4. when the engine runs in its own process (``paternoster serve``) and at least
   :data:`RESERVE_MIN_CORES` (8) cores are usable, one physical core is left to
   the frontend process (HTTP, ZeroMQ, tokenization, detokenization): the
   engine gets ``cores - 1`` threads and is pinned to the other cores (with
   their SMT siblings). The core left is the one holding the lowest CPU
   number (CPU 0 usually also takes interrupts). Below 8 cores the engine gets
   every core and is not pinned: one core is too large a share to give away,
   and the frontend's work is short bursts between steps.

The offline ``LLM(...)`` runs the engine in the caller's process, where the
frontend's work runs between steps on the same thread: it uses every usable
core and never changes the caller's CPU affinity.

An explicit ``--num-threads N`` (``num_threads=N``) is used as given and never
pins. With auto, the environment variable ``PATERNOSTER_NUM_THREADS`` (an int
>= 1) replaces the rule (no pinning); the test suite sets it to 1.

Torch's intra-op pool and the C++ core's pool get the same count: they run
one after the other within a step, so they share the cores without
oversubscribing them. The engine process also sets torch's inter-op pool to 1
thread.

:func:`choose_threads` is a pure function of a :class:`CpuTopology`
(:mod:`paternoster.engine.cpu_topology` reads it);
``python -m paternoster.engine.cpu_threads`` prints what it picks here and on
a few larger machines.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from paternoster.engine.cpu_topology import CpuTopology, read_topology

# Re-exported: the topology and its reading moved to cpu_topology; callers and
# tests import them from here too.
from paternoster.engine.cpu_topology import LogicalCpu as LogicalCpu
from paternoster.engine.cpu_topology import parse_cpu_max as parse_cpu_max
from paternoster.engine.cpu_topology import read_cgroup_quota as read_cgroup_quota

#: Usable physical cores from which one is left to the frontend process.
RESERVE_MIN_CORES = 8
#: Environment variable replacing the auto rule (an int >= 1; tests set 1).
NUM_THREADS_ENV = "PATERNOSTER_NUM_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """The engine's thread count and where it came from.

    Attributes:
        num_threads: threads for torch's intra-op pool and the C++ core pool (>= 1).
        source: ``"auto"``, ``"explicit"`` (``--num-threads``/``num_threads``),
            ``"env"`` (:data:`NUM_THREADS_ENV`), ``"data_parallel"`` (an
            engine's share of the cores, chosen by the frontend:
            :func:`data_parallel_threads`) or ``"tensor_parallel"`` (a
            tensor-parallel rank's share, the same split over the ranks).
        cpus: CPUs to pin the engine process to; ``None`` = do not pin.
        physical_cores: physical cores available (auto only, else 0).
        logical_cpus: CPUs available (auto only, else 0).
        cpu_quota: the cgroup quota in CPUs, when auto saw one.
        reserved_cores: physical cores left to the frontend process.
    """

    num_threads: int
    source: str
    cpus: tuple[int, ...] | None = None
    physical_cores: int = 0
    logical_cpus: int = 0
    cpu_quota: float | None = None
    reserved_cores: int = 0

    def describe(self) -> str:
        """The startup log line, e.g. ``engine threads: 15 (auto: 16 physical
        cores, 32 logical CPUs, 1 core left to the frontend, pinned to CPUs
        1-15,17-31)``."""
        pinned = "" if self.cpus is None else f", pinned to CPUs {format_cpu_list(self.cpus)}"
        if self.source == "explicit":
            return f"engine threads: {self.num_threads} (--num-threads{pinned})"
        if self.source == "env":
            return f"engine threads: {self.num_threads} ({NUM_THREADS_ENV}{pinned})"
        if self.source == "data_parallel":
            return f"engine threads: {self.num_threads} (data-parallel share{pinned})"
        if self.source == "tensor_parallel":
            return f"engine threads: {self.num_threads} per rank (tensor-parallel share{pinned})"
        parts = [f"auto: {self.physical_cores} physical cores",
                 f"{self.logical_cpus} logical CPUs"]  # fmt: skip
        if self.cpu_quota is not None:
            parts.append(f"cgroup quota {self.cpu_quota:g} CPUs")
        if self.reserved_cores:
            parts.append(f"{self.reserved_cores} core left to the frontend")
        if self.cpus is not None:
            parts.append(f"pinned to CPUs {format_cpu_list(self.cpus)}")
        return f"engine threads: {self.num_threads} ({', '.join(parts)})"


def choose_threads(topology: CpuTopology, *, reserve_frontend: bool) -> ThreadChoice:
    """The auto rule (module docstring) on a topology; pure.

    Args:
        topology: the CPUs available and the quota.
        reserve_frontend: the engine has its own process and a frontend
            process runs beside it (``paternoster serve``).
    Returns:
        The choice; ``cpus`` is set only when a core is left to the frontend.
    Raises:
        ValueError: a topology without CPUs.
    """
    cores = topology.physical_cores()
    if not cores:
        raise ValueError("the CPU topology has no CPUs")
    usable = len(cores)
    if topology.cpu_quota is not None:
        usable = max(1, min(usable, math.floor(topology.cpu_quota)))
    base = ThreadChoice(
        num_threads=usable, source="auto", physical_cores=len(cores),
        logical_cpus=len(topology.cpus), cpu_quota=topology.cpu_quota,
    )  # fmt: skip
    if not reserve_frontend or usable < RESERVE_MIN_CORES:
        return base
    n = usable - 1
    pinned = sorted(cpu for core in cores[1 : 1 + n] for cpu in core)
    return ThreadChoice(
        num_threads=n, source="auto", cpus=tuple(pinned), physical_cores=len(cores),
        logical_cpus=len(topology.cpus), cpu_quota=topology.cpu_quota, reserved_cores=1,
    )  # fmt: skip


def resolve_threads(requested: int, *, reserve_frontend: bool,
                    environ: Mapping[str, str] | None = None,
                    topology: CpuTopology | None = None) -> ThreadChoice:
    """The engine's threads for a configured ``num_threads``.

    Args:
        requested: ``num_threads`` from the config; 0 = auto.
        reserve_frontend: see :func:`choose_threads`.
        environ: where to read :data:`NUM_THREADS_ENV` (default ``os.environ``).
        topology: default: :func:`read_topology` of this process.
    Returns:
        ``requested`` as given when >= 1; else the env var's value; else the rule.
    Raises:
        ValueError: ``requested`` < 0, or the env var is not an int >= 1.
    """
    if requested < 0:
        raise ValueError(f"num_threads must be >= 1, or 0 for auto; got {requested}")
    if requested > 0:
        return ThreadChoice(num_threads=requested, source="explicit")
    env = (os.environ if environ is None else environ).get(NUM_THREADS_ENV, "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{NUM_THREADS_ENV} must be an int >= 1, got {env!r}")
        return ThreadChoice(num_threads=n, source="env")
    return choose_threads(topology or read_topology(), reserve_frontend=reserve_frontend)


def split_cores(topology: CpuTopology, num_engines: int, num_threads: int = 0, *,
                reserve_frontend: bool = True,
                flag: str = "data_parallel_size") -> list[ThreadChoice]:
    """Disjoint cores for ``num_engines`` data-parallel engine processes; pure.

    With ``num_threads`` 0 (auto) the usable physical cores (capped by the
    cgroup quota, one left to the frontend from :data:`RESERVE_MIN_CORES`
    cores, as :func:`choose_threads` decides for one engine) are split into
    ``num_engines`` runs of consecutive cores, as equal as they can be (the
    first engines get one more when they do not divide). With ``num_threads``
    T >= 1 each engine gets T cores, in order. Each engine is pinned to its
    cores' CPUs, SMT siblings included, and runs one thread per core.

    Args:
        topology: the CPUs available and the quota.
        num_engines: engine processes (>= 1).
        num_threads: threads per engine; 0 = auto.
        reserve_frontend: see :func:`choose_threads`.
        flag: the setting the errors name, as ``LLM(...)`` spells it
            (``--data-parallel-size`` on the command line; ``tensor_parallel_size`` splits
            the cores over the ranks of one engine the same way).
    Returns:
        One pinned :class:`ThreadChoice` per engine.
    Raises:
        ValueError: ``num_engines`` < 1, ``num_threads`` < 0, or the engines
            do not fit on disjoint cores (the message gives the counts).
    """
    if num_engines < 1:
        raise ValueError(f"{flag} must be >= 1, got {num_engines}")
    if num_threads < 0:
        raise ValueError(f"num_threads must be >= 1, or 0 for auto; got {num_threads}")
    cores = topology.physical_cores()
    if not cores:
        raise ValueError("the CPU topology has no CPUs")
    if num_threads > 0:
        usable, reserved, source = len(cores), 0, "explicit"
        if num_threads * num_engines > usable:
            raise ValueError(
                f"{flag}={num_engines} x num_threads={num_threads} needs "
                f"{num_engines * num_threads} physical cores, but {usable} are usable here; "
                "lower one of them (each process is pinned to cores of its own)"
            )
        sizes = [num_threads] * num_engines
    else:
        one = choose_threads(topology, reserve_frontend=reserve_frontend)
        usable, reserved, source = one.num_threads, one.reserved_cores, "auto"
        if usable < num_engines:
            raise ValueError(
                f"{flag}={num_engines} needs at least {num_engines} physical "
                f"cores (one per process), but {usable} are usable here"
            )
        base, extra = divmod(usable, num_engines)
        sizes = [base + (1 if i < extra else 0) for i in range(num_engines)]
    choices: list[ThreadChoice] = []
    start = reserved  # the reserved core is the first (lowest CPU number)
    for size in sizes:
        mine = cores[start : start + size]
        start += size
        choices.append(ThreadChoice(
            num_threads=size, source=source, cpus=tuple(sorted(c for core in mine for c in core)),
            physical_cores=len(cores), logical_cpus=len(topology.cpus),
            cpu_quota=topology.cpu_quota, reserved_cores=reserved,
        ))  # fmt: skip
    return choices


def data_parallel_threads(requested: int, num_engines: int, *,
                          environ: Mapping[str, str] | None = None,
                          topology: CpuTopology | None = None, reserve_frontend: bool = True,
                          flag: str = "data_parallel_size") -> list[ThreadChoice]:
    """Each data-parallel engine's threads and CPUs (``--data-parallel-size N``).

    ``requested`` >= 1 (``--num-threads``) or, with auto, the value of
    :data:`NUM_THREADS_ENV` is the thread count of each engine, pinned to
    disjoint cores (:func:`split_cores`); an explicit count that does not fit
    is an error, the environment variable's (a test setting) runs unpinned
    instead. Auto splits the usable cores between the engines.

    Args:
        requested: ``num_threads`` from the config; 0 = auto.
        num_engines: engine processes (>= 1).
        environ: where to read :data:`NUM_THREADS_ENV` (default ``os.environ``).
        topology: default: :func:`read_topology` of this process.
        reserve_frontend, flag: see :func:`split_cores`.
    Returns:
        One :class:`ThreadChoice` per engine.
    Raises:
        ValueError: see :func:`split_cores`; a bad :data:`NUM_THREADS_ENV`.
    """
    topology = topology or read_topology()
    if requested == 0:
        env_choice = resolve_threads(0, reserve_frontend=reserve_frontend, environ=environ,
                                     topology=topology)  # fmt: skip
        if env_choice.source == "env":
            n = env_choice.num_threads
            if n * num_engines > len(topology.physical_cores()):
                return [env_choice] * num_engines
            return [dataclasses.replace(c, source="env") for c in split_cores(
                topology, num_engines, n, reserve_frontend=reserve_frontend, flag=flag)]
    return split_cores(topology, num_engines, requested, reserve_frontend=reserve_frontend,
                       flag=flag)


# ----------------------------------------------------------------- applying


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU numbers as ranges, as Linux writes them (``[0, 1, 2, 5]`` -> ``"0-2,5"``)."""
    out: list[str] = []
    nums = sorted(set(cpus))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def pin_process(cpus: Iterable[int]) -> None:
    """Restrict every thread of this process (and the threads they start) to ``cpus``.

    Linux's affinity is per thread: each existing thread is set (threads
    started later inherit their creator's).

    Raises:
        OSError: the OS refused (e.g. a CPU outside the cgroup's cpuset).
    """
    cpu_set = set(cpus)
    os.sched_setaffinity(0, cpu_set)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpu_set)
        except ProcessLookupError:  # the thread has exited
            pass


def apply_threads(threads: ThreadChoice, who: str = "the engine") -> ThreadChoice:
    """Pin this process to ``threads.cpus`` (a refusal, e.g. a cpuset narrower
    than the affinity, is logged and the process runs unpinned), give torch's
    intra-op pool ``threads.num_threads`` threads and its inter-op pool 1.

    Returns:
        ``threads``, without ``cpus`` when pinning was refused.
    """
    import logging

    import torch

    if threads.cpus is not None:
        try:
            pin_process(threads.cpus)
        except OSError as e:
            logging.getLogger("paternoster.engine").warning(
                "cannot pin %s to CPUs %s: %s", who, format_cpu_list(threads.cpus), e)
            threads = dataclasses.replace(threads, cpus=None)
    torch.set_num_threads(threads.num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already started
        pass
    return threads


def limit_frontend_torch_threads() -> None:
    """In the frontend process: if torch was imported (the tokenizer may), keep
    its pools at 1 thread so that it leaves the cores to the engine."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _main() -> None:
    """Print the choice here and on a few larger machines (for docs/threads)."""
    here = read_topology()
    print(f"this machine: {len(here.physical_cores())} physical cores, {len(here.cpus)} CPUs"
          f"{'' if here.smt_known else ' (no /sys topology)'}, quota {here.cpu_quota}")  # fmt: skip
    for label, reserve in (("serve", True), ("LLM(...)", False)):
        print(f"  {label:9s}", choose_threads(here, reserve_frontend=reserve).describe())
    examples = [
        ("2 cores", CpuTopology.uniform(1, 2)),
        ("4 cores, SMT", CpuTopology.uniform(1, 4, 2)),
        ("8 cores", CpuTopology.uniform(1, 8)),
        ("16 cores, SMT", CpuTopology.uniform(1, 16, 2)),
        ("16 cores, SMT, cgroup quota 6 CPUs", CpuTopology.uniform(1, 16, 2, cpu_quota=6.0)),
        ("64 cores", CpuTopology.uniform(1, 64)),
        ("2 sockets x 32 cores, SMT", CpuTopology.uniform(2, 32, 2)),
    ]
    for label, topo in examples:
        print(f"{label}:")
        for name, reserve in (("serve", True), ("LLM(...)", False)):
            print(f"  {name:9s}", choose_threads(topo, reserve_frontend=reserve).describe())


if __name__ == "__main__":
    _main()

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

:func:`choose_threads` is a pure function of a :class:`CpuTopology`;
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
from pathlib import Path

#: Usable physical cores from which one is left to the frontend process.
RESERVE_MIN_CORES = 8
#: Environment variable replacing the auto rule (an int >= 1; tests set 1).
NUM_THREADS_ENV = "PATERNOSTER_NUM_THREADS"


@dataclass(frozen=True)
class LogicalCpu:
    """One CPU the OS schedules on (a hardware thread).

    Attributes:
        cpu: the OS's CPU number (``cpuN``).
        package: socket (``physical_package_id``).
        core: core within the socket (``core_id``); SMT siblings share it.
    """

    cpu: int
    package: int
    core: int


@dataclass(frozen=True)
class CpuTopology:
    """The CPUs available to a process, and its cgroup CPU quota.

    Attributes:
        cpus: the CPUs the process may run on.
        cpu_quota: the cgroup quota in CPUs (``quota / period``; 1.5 = one and
            a half CPUs' time); ``None`` when unlimited or unknown.
        smt_known: whether the core ids came from ``/sys`` (``False``: each
            CPU counts as its own core).
    """

    cpus: tuple[LogicalCpu, ...]
    cpu_quota: float | None = None
    smt_known: bool = True

    def physical_cores(self) -> list[tuple[int, ...]]:
        """The physical cores, each as its CPUs' numbers (sorted), ordered by
        their lowest CPU number."""
        groups: dict[tuple[int, int], list[int]] = {}
        for c in self.cpus:
            groups.setdefault((c.package, c.core), []).append(c.cpu)
        return sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0])

    @classmethod
    def uniform(cls, sockets: int, cores_per_socket: int, threads_per_core: int = 1,
                cpu_quota: float | None = None) -> CpuTopology:
        """A fake topology numbered as Linux numbers x86 servers: first thread
        of every core (socket by socket), then the SMT siblings.

        Raises:
            ValueError: a count below 1.
        """
        if min(sockets, cores_per_socket, threads_per_core) < 1:
            raise ValueError("sockets, cores_per_socket and threads_per_core must be >= 1")
        n_cores = sockets * cores_per_socket
        cpus = tuple(
            LogicalCpu(cpu=t * n_cores + s * cores_per_socket + k, package=s, core=k)
            for t in range(threads_per_core)
            for s in range(sockets)
            for k in range(cores_per_socket)
        )
        return cls(cpus=cpus, cpu_quota=cpu_quota)


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
                flag: str = "--data-parallel-size") -> list[ThreadChoice]:
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
        flag: the option the errors name (``--tensor-parallel-size`` splits
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
                f"{flag} {num_engines} x --num-threads {num_threads} needs "
                f"{num_engines * num_threads} physical cores, but {usable} are usable here; "
                "lower one of them (each process is pinned to cores of its own)"
            )
        sizes = [num_threads] * num_engines
    else:
        one = choose_threads(topology, reserve_frontend=reserve_frontend)
        usable, reserved, source = one.num_threads, one.reserved_cores, "auto"
        if usable < num_engines:
            raise ValueError(
                f"{flag} {num_engines} needs at least {num_engines} physical "
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
                          flag: str = "--data-parallel-size") -> list[ThreadChoice]:
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


# ------------------------------------------------------------------ reading


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        try:
            return sorted(os.sched_getaffinity(0))
        except OSError:
            pass
    return list(range(os.cpu_count() or 1))


def read_topology(sys_root: str | Path = "/sys", proc_root: str | Path = "/proc",
                  allowed: Iterable[int] | None = None) -> CpuTopology:
    """This process's CPUs, their cores and its cgroup quota; never raises
    (what cannot be read is left out: no SMT grouping, no quota).

    Args:
        sys_root: where sysfs is mounted (tests pass a fake tree).
        proc_root: where procfs is mounted.
        allowed: CPU numbers (default: this process's affinity).
    """
    sys_root, proc_root = Path(sys_root), Path(proc_root)
    cpus_allowed = sorted(allowed) if allowed is not None else _allowed_cpus()
    cpus: list[LogicalCpu] = []
    smt_known = True
    for n in cpus_allowed:
        topo = sys_root / "devices/system/cpu" / f"cpu{n}" / "topology"
        try:
            package = int((topo / "physical_package_id").read_text())
            core = int((topo / "core_id").read_text())
        except (OSError, ValueError):
            smt_known = False
            break
        cpus.append(LogicalCpu(cpu=n, package=package, core=core))
    if not smt_known:
        cpus = [LogicalCpu(cpu=n, package=0, core=n) for n in cpus_allowed]
    return CpuTopology(cpus=tuple(cpus), cpu_quota=read_cgroup_quota(sys_root, proc_root),
                       smt_known=smt_known)  # fmt: skip


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` (``"200000 100000"`` -> 2.0;
    ``"max 100000"`` or garbage -> ``None``)."""
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_cgroup_quota(sys_root: str | Path = "/sys",
                      proc_root: str | Path = "/proc") -> float | None:
    """This process's cgroup CPU quota in CPUs, the tightest along its cgroup
    path (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``);
    ``None`` when unlimited or unreadable. Never raises."""
    cg_root = Path(sys_root) / "fs/cgroup"
    text = _read(Path(proc_root) / "self/cgroup") or "0::/\n"
    quotas: list[float] = []
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        rel = Path(path.lstrip("/"))
        chain = [rel, *rel.parents] if str(rel) != "." else [Path()]
        if hier == "0" and controllers == "":
            for p in chain:
                q = parse_cpu_max(_read(cg_root / p / "cpu.max") or "max")
                if q is not None:
                    quotas.append(q)
        elif "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for p in chain:
                    quota = _read(cg_root / mount / p / "cpu.cfs_quota_us")
                    period = _read(cg_root / mount / p / "cpu.cfs_period_us")
                    if quota is not None and period is not None:
                        q = parse_cpu_max(f"{quota.strip()} {period.strip()}")
                        if q is not None:
                            quotas.append(q)
    return min(quotas) if quotas else None


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

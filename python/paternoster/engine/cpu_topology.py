"""The CPUs available to this process: which physical cores they belong to
(SMT siblings grouped by ``/sys/devices/system/cpu/cpuN/topology``) and the
cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``).

:class:`CpuTopology` is what :mod:`paternoster.engine.cpu_threads` decides
from; :func:`read_topology` reads it for this process (tests pass fake
``/sys`` and ``/proc`` trees), :meth:`CpuTopology.uniform` builds one for a
machine that is not this one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


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

"""The engine's default thread count (auto) on fake topologies, reading /sys
and cgroup files from fake trees, and how configs resolve ``num_threads``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paternoster import _core
from paternoster.config import CacheConfig, EngineConfig, ModelConfig
from paternoster.engine.cpu_threads import (
    NUM_THREADS_ENV,
    CpuTopology,
    LogicalCpu,
    choose_threads,
    format_cpu_list,
    parse_cpu_max,
    read_cgroup_quota,
    read_topology,
    resolve_threads,
)
from paternoster.entrypoints.engine_args import build_engine_config

uniform = CpuTopology.uniform


@pytest.fixture
def restore_threads():
    threads, core_threads = torch.get_num_threads(), _core.get_num_threads()
    yield
    torch.set_num_threads(threads)
    _core.set_num_threads(core_threads)


# ------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("topology", "serve", "llm"),
    [
        (uniform(1, 1), 1, 1),
        (uniform(1, 2), 2, 2),
        (uniform(1, 2, 2), 2, 2),  # SMT siblings count once
        (uniform(1, 4), 4, 4),
        (uniform(1, 4, 2), 4, 4),
        (uniform(1, 7, 2), 7, 7),  # below 8 cores: nothing left to the frontend
        (uniform(1, 8), 7, 8),
        (uniform(1, 16), 15, 16),
        (uniform(1, 16, 2), 15, 16),
        (uniform(1, 64), 63, 64),
        (uniform(2, 32, 2), 63, 64),
        (uniform(1, 16, 2, cpu_quota=6.0), 6, 6),  # the quota caps the cores
        (uniform(1, 16, 2, cpu_quota=6.9), 6, 6),  # rounded down
        (uniform(1, 16, 2, cpu_quota=0.5), 1, 1),  # at least 1
        (uniform(1, 16, 2, cpu_quota=10.0), 9, 10),
        (uniform(1, 4, cpu_quota=32.0), 4, 4),  # a quota above the cores changes nothing
    ],
)
def test_auto_thread_count(topology, serve, llm):
    assert choose_threads(topology, reserve_frontend=True).num_threads == serve
    assert choose_threads(topology, reserve_frontend=False).num_threads == llm


def test_small_machines_and_in_process_engines_are_never_pinned():
    for topo in (uniform(1, 2), uniform(1, 4, 2), uniform(1, 7)):
        assert choose_threads(topo, reserve_frontend=True).cpus is None
    for topo in (uniform(1, 16), uniform(2, 32, 2)):
        choice = choose_threads(topo, reserve_frontend=False)
        assert choice.cpus is None and choice.reserved_cores == 0


def test_serve_pins_the_engine_off_the_frontends_core_with_its_siblings():
    choice = choose_threads(uniform(1, 16, 2), reserve_frontend=True)
    # CPU 0 and its sibling 16 are the frontend's; the engine has the rest.
    assert choice.cpus == tuple(range(1, 16)) + tuple(range(17, 32))
    assert choice.reserved_cores == 1 and choice.physical_cores == 16
    assert choice.logical_cpus == 32
    two_sockets = choose_threads(uniform(2, 32, 2), reserve_frontend=True)
    assert two_sockets.cpus is not None
    assert 0 not in two_sockets.cpus and 64 not in two_sockets.cpus
    assert len(two_sockets.cpus) == 2 * 63
    quota = choose_threads(uniform(1, 16, cpu_quota=10.0), reserve_frontend=True)
    assert quota.cpus == tuple(range(1, 10))


def test_cores_are_grouped_by_package_and_core_id():
    # Two sockets whose cores have the same core_ids are different cores.
    topo = CpuTopology(cpus=(LogicalCpu(0, 0, 0), LogicalCpu(1, 1, 0), LogicalCpu(2, 0, 0)))
    assert topo.physical_cores() == [(0, 2), (1,)]
    assert choose_threads(topo, reserve_frontend=False).num_threads == 2
    with pytest.raises(ValueError, match="no CPUs"):
        choose_threads(CpuTopology(cpus=()), reserve_frontend=False)


def test_the_log_line_says_how_the_count_was_chosen():
    auto = choose_threads(uniform(1, 16, 2), reserve_frontend=True).describe()
    assert auto == ("engine threads: 15 (auto: 16 physical cores, 32 logical CPUs, "
                    "1 core left to the frontend, pinned to CPUs 1-15,17-31)")  # fmt: skip
    small = choose_threads(uniform(1, 2, cpu_quota=1.5), reserve_frontend=True).describe()
    assert small == ("engine threads: 1 (auto: 2 physical cores, 2 logical CPUs, "
                     "cgroup quota 1.5 CPUs)")  # fmt: skip
    explicit = resolve_threads(4, reserve_frontend=True).describe()
    assert explicit == "engine threads: 4 (--num-threads)"
    env = resolve_threads(0, reserve_frontend=True, environ={NUM_THREADS_ENV: "3"})
    assert env.describe() == f"engine threads: 3 ({NUM_THREADS_ENV})"


def test_format_cpu_list():
    assert format_cpu_list([]) == ""
    assert format_cpu_list([5, 0, 1, 2]) == "0-2,5"
    assert format_cpu_list([3]) == "3"


# ------------------------------------------------------------------- resolving


def test_explicit_counts_are_kept_and_env_replaces_auto():
    topo = uniform(1, 16)
    explicit = resolve_threads(3, reserve_frontend=True, environ={NUM_THREADS_ENV: "9"},
                               topology=topo)  # fmt: skip
    assert (explicit.num_threads, explicit.source, explicit.cpus) == (3, "explicit", None)
    env = resolve_threads(0, reserve_frontend=True, environ={NUM_THREADS_ENV: " 2 "},
                          topology=topo)  # fmt: skip
    assert (env.num_threads, env.source, env.cpus) == (2, "env", None)
    auto = resolve_threads(0, reserve_frontend=True, environ={}, topology=topo)
    assert (auto.num_threads, auto.source) == (15, "auto")
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match=NUM_THREADS_ENV):
            resolve_threads(0, reserve_frontend=True, environ={NUM_THREADS_ENV: bad})
    with pytest.raises(ValueError, match="num_threads"):
        resolve_threads(-1, reserve_frontend=True, environ={})


def test_auto_on_this_machine_is_at_least_one():
    for reserve in (True, False):
        choice = resolve_threads(0, reserve_frontend=reserve, environ={})
        assert choice.source == "auto" and choice.num_threads >= 1


def test_build_engine_config_defaults_to_auto_and_keeps_explicit_counts():
    assert build_engine_config("/m").num_threads == 0
    assert build_engine_config("/m", num_threads=None).num_threads == 0
    assert build_engine_config("/m", num_threads=6).num_threads == 6
    with pytest.raises(ValueError, match="num_threads"):
        build_engine_config("/m", num_threads=-2)
    for bad in ("x", 1.5, True):
        with pytest.raises(ValueError, match="num_threads must be an int"):
            build_engine_config("/m", num_threads=bad)
    cfg = EngineConfig(model=ModelConfig(model="m"))
    assert cfg.num_threads == 0
    assert EngineConfig.from_dict(cfg.to_dict()).num_threads == 0
    assert EngineConfig.from_dict({"model": {"model": "m"}}).num_threads == 0


def _scripted_engine(num_threads: int):
    from paternoster.engine.core import EngineCore

    from .test_runner_interface import ScriptedRunner

    config = EngineConfig(model=ModelConfig(model="scripted"),
                          cache=CacheConfig(block_size=4, num_kv_blocks=32),
                          num_threads=num_threads)  # fmt: skip
    return EngineCore(config, ScriptedRunner())


def test_engine_core_resolves_auto_and_reports_its_threads(monkeypatch, restore_threads):
    monkeypatch.delenv(NUM_THREADS_ENV, raising=False)
    engine = _scripted_engine(0)
    n = engine.info["num_threads"]
    assert n >= 1 and engine.config.num_threads == n and engine.threads.source == "auto"
    assert engine.threads.cpus is None  # in-process: never pinned
    assert torch.get_num_threads() == n and _core.get_num_threads() == n
    explicit = _scripted_engine(2)
    assert explicit.info["num_threads"] == 2 and explicit.threads.source == "explicit"
    assert torch.get_num_threads() == 2 and _core.get_num_threads() == 2
    monkeypatch.setenv(NUM_THREADS_ENV, "1")
    assert _scripted_engine(0).info["num_threads"] == 1


def test_engine_process_resolves_before_building_the_engine(monkeypatch, restore_threads):
    from paternoster.engine.process import _configure_threads

    cfg = EngineConfig(model=ModelConfig(model="m"))
    monkeypatch.setenv(NUM_THREADS_ENV, "1")
    assert _configure_threads(cfg).num_threads == 1
    assert _configure_threads(EngineConfig(model=ModelConfig(model="m"), num_threads=3)
                              ).num_threads == 3  # fmt: skip
    assert torch.get_num_threads() == 3


# ---------------------------------------------------------------- reading /sys


def _fake_sys(root: Path, cpus: dict[int, tuple[int, int]]) -> None:
    for n, (package, core) in cpus.items():
        topo = root / "devices/system/cpu" / f"cpu{n}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")


def test_read_topology_groups_smt_siblings(tmp_path):
    _fake_sys(tmp_path / "sys", {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)})
    (tmp_path / "proc").mkdir()
    topo = read_topology(tmp_path / "sys", tmp_path / "proc", allowed=[0, 1, 2, 3])
    assert topo.smt_known and topo.physical_cores() == [(0, 2), (1, 3)]
    assert topo.cpu_quota is None
    # Affinity limited to one thread of each core: still two cores.
    assert len(read_topology(tmp_path / "sys", tmp_path / "proc", allowed=[0, 1])
               .physical_cores()) == 2  # fmt: skip


def test_read_topology_without_sys_counts_each_cpu(tmp_path):
    topo = read_topology(tmp_path / "nothing", tmp_path / "nothing", allowed=[0, 1, 2])
    assert not topo.smt_known and len(topo.physical_cores()) == 3


def test_parse_cpu_max():
    assert parse_cpu_max("200000 100000\n") == 2.0
    assert parse_cpu_max("150000 100000") == 1.5
    assert parse_cpu_max("max 100000") is None
    assert parse_cpu_max("-1 100000") is None  # cgroup v1: no quota
    assert parse_cpu_max("") is None and parse_cpu_max("x y") is None


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "sys/fs/cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self/cgroup").write_text("0::/a/b\n")
    (cg / "a/b").mkdir(parents=True)
    (cg / "a/b/cpu.max").write_text("max 100000\n")
    assert read_cgroup_quota(tmp_path / "sys", proc) is None
    (cg / "a/cpu.max").write_text("300000 100000\n")
    assert read_cgroup_quota(tmp_path / "sys", proc) == 3.0
    (cg / "cpu.max").write_text("400000 100000\n")  # a container's root
    assert read_cgroup_quota(tmp_path / "sys", proc) == 3.0


def test_cgroup_v1_quota(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "sys/fs/cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self/cgroup").write_text("4:memory:/x\n2:cpu,cpuacct:/docker/c1\n0::/\n")
    d = cg / "cpu,cpuacct/docker/c1"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert read_cgroup_quota(tmp_path / "sys", proc) is None
    (d / "cpu.cfs_quota_us").write_text("250000\n")
    assert read_cgroup_quota(tmp_path / "sys", proc) == 2.5


def test_the_frontend_keeps_torch_at_one_thread(restore_threads):
    from paternoster.engine.cpu_threads import limit_frontend_torch_threads

    torch.set_num_threads(2)
    limit_frontend_torch_threads()
    assert torch.get_num_threads() == 1

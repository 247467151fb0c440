"""Data-parallel placement: disjoint cores per engine (CPU), one GPU each (CUDA)."""

from __future__ import annotations

import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.cpu_threads import (
    NUM_THREADS_ENV,
    CpuTopology,
    LogicalCpu,
    data_parallel_threads,
    split_cores,
)
from paternoster.frontend.placement import place_engines


def _disjoint(choices) -> bool:
    seen: set[int] = set()
    for c in choices:
        if seen & set(c.cpus):
            return False
        seen |= set(c.cpus)
    return True


def test_auto_splits_every_core_when_no_core_is_reserved():
    choices = split_cores(CpuTopology.uniform(1, 4), 2)
    assert [c.cpus for c in choices] == [(0, 1), (2, 3)]
    assert [c.num_threads for c in choices] == [2, 2]


def test_auto_leaves_the_first_core_to_the_frontend_on_big_machines():
    # 16 cores with SMT: CPU k and k+16 are siblings; core 0 goes to the frontend.
    choices = split_cores(CpuTopology.uniform(1, 16, 2), 3)
    assert [c.num_threads for c in choices] == [5, 5, 5]
    assert choices[0].cpus == (1, 2, 3, 4, 5, 17, 18, 19, 20, 21)
    assert all(0 not in c.cpus and 16 not in c.cpus for c in choices)
    assert _disjoint(choices)


def test_uneven_split_gives_the_first_engines_one_more():
    choices = split_cores(CpuTopology.uniform(1, 5), 2)
    assert [c.cpus for c in choices] == [(0, 1, 2), (3, 4)]


def test_cgroup_quota_caps_the_cores_shared_out():
    choices = split_cores(CpuTopology.uniform(1, 8, cpu_quota=4.5), 2)
    assert [c.cpus for c in choices] == [(0, 1), (2, 3)]


def test_cores_follow_the_topology_not_cpu_numbers():
    # Two cores whose SMT siblings are numbered next to each other.
    topo = CpuTopology(cpus=(LogicalCpu(0, 0, 0), LogicalCpu(1, 0, 0),
                             LogicalCpu(2, 0, 1), LogicalCpu(3, 0, 1)))  # fmt: skip
    assert [c.cpus for c in split_cores(topo, 2)] == [(0, 1), (2, 3)]


def test_explicit_threads_per_engine_are_pinned_when_they_fit():
    choices = split_cores(CpuTopology.uniform(1, 8), 2, num_threads=3)
    assert [c.cpus for c in choices] == [(0, 1, 2), (3, 4, 5)]
    assert all(c.source == "explicit" and c.num_threads == 3 for c in choices)


def test_explicit_threads_that_do_not_fit_are_an_error():
    with pytest.raises(ValueError, match="needs 6 physical cores, but 4 are usable"):
        split_cores(CpuTopology.uniform(1, 4), 2, num_threads=3)


def test_more_engines_than_cores_is_an_error():
    with pytest.raises(ValueError, match="needs at least 3 physical cores.*2 are usable"):
        split_cores(CpuTopology.uniform(1, 2), 3)


def test_env_thread_count_pins_when_it_fits_and_runs_unpinned_otherwise():
    env = {NUM_THREADS_ENV: "1"}
    fits = data_parallel_threads(0, 2, environ=env, topology=CpuTopology.uniform(1, 2))
    assert [(c.cpus, c.source) for c in fits] == [((0,), "env"), ((1,), "env")]
    over = data_parallel_threads(0, 4, environ=env, topology=CpuTopology.uniform(1, 2))
    assert [(c.num_threads, c.cpus) for c in over] == [(1, None)] * 4


def test_place_engines_sets_each_engines_threads_and_cpus():
    config = EngineConfig(ModelConfig("m"))
    placed = place_engines(config, 2, environ={}, topology=CpuTopology.uniform(1, 2))
    assert [(p.config.num_threads, p.config.cpus) for p in placed] == [(1, (0,)), (1, (1,))]
    assert all(p.env == {} for p in placed)
    # The per-engine config survives the trip to the engine process.
    again = EngineConfig.from_dict(placed[1].config.to_dict())
    assert again.cpus == (1,) and again.num_threads == 1


def test_one_engine_is_left_alone():
    config = EngineConfig(ModelConfig("m"))
    [only] = place_engines(config, 1, environ={}, topology=CpuTopology.uniform(1, 2))
    assert only.config == config and only.env == {}


def test_cuda_engines_get_one_gpu_each():
    config = EngineConfig(ModelConfig("m", device="cuda"))
    placed = place_engines(config, 2, environ={}, cuda_device_count=lambda: 4)
    assert [p.env for p in placed] == [{"CUDA_VISIBLE_DEVICES": "0"},
                                       {"CUDA_VISIBLE_DEVICES": "1"}]  # fmt: skip
    visible = place_engines(config, 2, environ={"CUDA_VISIBLE_DEVICES": "3,5,6"},
                            cuda_device_count=lambda: 0)  # fmt: skip
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in visible] == ["3", "5"]
    assert all(p.config.model.device == "cuda" for p in placed)


def test_fewer_gpus_than_engines_is_an_error():
    config = EngineConfig(ModelConfig("m", device="cuda"))
    with pytest.raises(ValueError, match="needs 2 GPUs .* but 1 is visible"):
        place_engines(config, 2, environ={}, cuda_device_count=lambda: 1)
    with pytest.raises(ValueError, match="--device cuda:1"):
        place_engines(EngineConfig(ModelConfig("m", device="cuda:1")), 2, environ={},
                      cuda_device_count=lambda: 4)  # fmt: skip


def test_bad_sizes_are_refused():
    config = EngineConfig(ModelConfig("m"))
    with pytest.raises(ValueError, match="data_parallel_size must be >= 1"):
        place_engines(config, 0)
    with pytest.raises(ValueError, match="cpus must be"):
        EngineConfig(ModelConfig("m"), cpus=())

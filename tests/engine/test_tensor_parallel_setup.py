"""Tensor-parallel serving, before any process starts: each rank's threads
and cores, the group's backend (NCCL on ``cuda``), and the clear
``ValueError`` for what it does not run (a ``cuda:N`` device, too few GPUs,
dummy weights, GGUF, quantized or MoE checkpoints, heads that do not split,
data parallel x tensor parallel)."""

from __future__ import annotations

import json

import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.cpu_threads import CpuTopology
from paternoster.engine.tensor_parallel import check_model, plan_ranks, rank0_threads
from paternoster.entrypoints.engine_args import build_engine_config


def _config(n: int = 2, num_threads: int = 0, model: str = "m") -> EngineConfig:
    return EngineConfig(ModelConfig(model), num_threads=num_threads, tensor_parallel_size=n)


def test_auto_splits_the_cores_between_the_ranks_each_pinned_to_its_own():
    planned = plan_ranks(_config(), reserve_frontend=False, pin_rank0=True, environ={},
                         topology=CpuTopology.uniform(1, 4))
    assert planned.rank_threads == ((2, (0, 1)), (2, (2, 3)))
    assert planned.num_threads == 2
    assert rank0_threads(planned).describe() == (
        "engine threads: 2 per rank (tensor-parallel share, pinned to CPUs 0-1)")


def test_serve_leaves_a_core_to_the_frontend_and_the_offline_llm_leaves_rank_0_unpinned():
    topology = CpuTopology.uniform(1, 16, 2)  # CPUs k and k + 16 are SMT siblings
    served = plan_ranks(_config(), reserve_frontend=True, pin_rank0=True, environ={},
                        topology=topology)
    assert [n for n, _ in served.rank_threads] == [8, 7]
    cpus = [set(c) for _, c in served.rank_threads]
    assert not cpus[0] & cpus[1] and not {0, 16} & (cpus[0] | cpus[1])
    offline = plan_ranks(_config(), reserve_frontend=False, pin_rank0=False, environ={},
                         topology=topology)
    assert offline.rank_threads[0] == (8, ()) and len(offline.rank_threads[1][1]) == 16


def test_num_threads_is_per_rank_and_must_fit():
    planned = plan_ranks(_config(num_threads=2), reserve_frontend=False, pin_rank0=True,
                         environ={}, topology=CpuTopology.uniform(1, 4))
    assert planned.rank_threads == ((2, (0, 1)), (2, (2, 3)))
    with pytest.raises(ValueError, match="tensor_parallel_size=2 x num_threads=3 needs 6"):
        plan_ranks(_config(num_threads=3), reserve_frontend=False, pin_rank0=True,
                   environ={}, topology=CpuTopology.uniform(1, 4))


def test_the_plan_travels_in_the_config():
    planned = plan_ranks(_config(), reserve_frontend=False, pin_rank0=False, environ={},
                         topology=CpuTopology.uniform(1, 4))
    assert EngineConfig.from_dict(json.loads(json.dumps(planned.to_dict()))) == planned


@pytest.mark.parametrize("kwargs, words", [
    ({"device": "cuda:1"}, "device must be 'cpu' \\(gloo\\) or 'cuda'"),
    ({"load_format": "dummy"}, "load_format 'dummy'"),
    ({"batch_invariant": True}, "batch_invariant"),
])  # fmt: skip
def test_settings_tensor_parallel_does_not_run_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=f"tensor_parallel_size=2: {words}"):
        build_engine_config("m", tensor_parallel_size=2, **kwargs)
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        build_engine_config("m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="tensor_parallel_size=2: cpus"):
        EngineConfig(ModelConfig("m"), tensor_parallel_size=2, cpus=(0,))


def test_cuda_ranks_join_over_nccl_one_gpu_each_and_need_n_gpus(tmp_path, monkeypatch):
    import torch
    import transformers

    from paternoster.engine.tp_worker import backend_for

    assert (backend_for("cuda"), backend_for("cpu")) == ("nccl", "gloo")
    config = build_engine_config(_save(tmp_path, transformers.LlamaConfig(**SMALL)),
                                 tensor_parallel_size=2, device="cuda")
    assert config.model.device == "cuda"  # accepted: rank r runs on GPU r
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=2: device cuda runs rank r on "
                                         "GPU r and needs 2 GPUs; torch sees 1"):
        check_model(config)


def _save(tmp_path, cfg) -> str:
    cfg.save_pretrained(tmp_path)
    return str(tmp_path)


SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2)


def test_models_tensor_parallel_does_not_split_are_refused_naming_the_argument(tmp_path):
    import transformers

    moe = transformers.MixtralConfig(**SMALL, num_local_experts=4)
    moe.architectures = ["MixtralForCausalLM"]
    with pytest.raises(ValueError, match="tensor_parallel_size=2: MixtralForCausalLM is not"):
        check_model(_config(model=_save(tmp_path / "moe", moe)))
    llama = transformers.LlamaConfig(**SMALL)
    path = _save(tmp_path / "llama", llama)
    check_model(_config(model=path))  # splits over 2
    with pytest.raises(ValueError, match="tensor_parallel_size=4: .*num_key_value_heads"):
        check_model(_config(4, model=path))
    with pytest.raises(ValueError, match="tensor_parallel_size=3: .*num_attention_heads"):
        check_model(_config(3, model=path))
    llama.quantization_config = {"quant_method": "fp8"}
    with pytest.raises(ValueError, match="tensor_parallel_size=2: quantized"):
        check_model(_config(model=_save(tmp_path / "fp8", llama)))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="tensor_parallel_size=2: GGUF"):
        check_model(_config(model=str(gguf)))


@pytest.mark.parametrize("dp, backend", [(2, "mp"), (1, "ray")])
def test_data_parallel_or_ray_with_tensor_parallel_is_refused_naming_both(dp, backend):
    from paternoster.frontend.data_parallel import DataParallelClient

    with pytest.raises(ValueError, match=f"--tensor-parallel-size 2 with --data-parallel-size "
                                         f"{dp} and --distributed-executor-backend {backend}"):
        DataParallelClient.create(_config(), dp, distributed_executor_backend=backend)

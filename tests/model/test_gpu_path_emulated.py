"""The GPU model path's data flow with the CUDA attention kernels' own code, on
the CPU emulation of cuda/emu (``kernels.emulated_cuda_backend()``, passed to
the runner as its attention ops): ModelRunner's
CUDA execute path in bfloat16 with the kernel hints and a preallocated split-K
workspace, and decode steps through :class:`DecodeGraphs` (batches padded to
a captured size, padding rows with slot -1 and ``seq_lens`` 0, the kernels'
split grid sized for ``max_model_len``), against HF transformers' float32
forward of the same weights. Only the graph capture itself is replaced (by an
eager replay): CUDA graphs cannot run without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from paternoster import kernels
from paternoster.config import CacheConfig, ModelConfig
from paternoster.model import cuda_graphs
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, hf_logits

pytestmark = pytest.mark.skipif(not kernels.cuda_emulation_available(),
                                reason="paternoster._cuda_emu not built (needs the CUDA toolkit)")

# Head size 64 (Gemma 3 also at its released 256; the kernels take 64, 128 and 256),
# GQA 4:1, 2 layers.
CONFIG = dict(vocab_size=256, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=1, head_dim=64,
              max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=False)  # fmt: skip
BLOCK = 16


class EagerGraphs(cuda_graphs.DecodeGraphs):
    """DecodeGraphs whose "capture" records an eager forward per size: replay
    runs the model on the static buffers and writes the output buffer, as the
    captured graph would."""

    def _capture_all(self, model, kv_caches, workspace, kernel_hints: bool) -> None:
        self.replays = []
        for size in self.sizes:
            attn = self._metadata(size, workspace, kernel_hints)
            ids, pos = self.input_ids[:size], self.positions[:size]
            hidden = torch.empty(size, CONFIG["hidden_size"], dtype=torch.bfloat16)

            class Replay:
                def replay(self, ids=ids, pos=pos, attn=attn, hidden=hidden, size=size,
                           graphs=self) -> None:
                    graphs.replays.append(size)
                    with torch.inference_mode():
                        hidden.copy_(model(ids, pos, attn, kv_caches))

            self._graphs[size] = (Replay(), hidden)


@pytest.fixture(scope="module",
                params=["llama", "qwen3", "smollm3", "qwen3_moe", "gemma3", "gemma3_d256",
                        "gpt_oss", "phi4_mini"])
def hf_and_dir(request, tmp_path_factory):
    """A tiny Llama, a tiny Qwen3 (per-head q/k norms, weights away from 1), a
    tiny SmolLM3 (its second layer without RoPE), a tiny Qwen3-MoE (4
    experts, 2 per token, a random router) and a tiny Gemma 3 (a sliding and a
    full layer, norm weights away from 0; at head size 64 and at the released
    checkpoints' 256) and a tiny gpt-oss (YaRN, random sinks, router and
    expert biases); both windowed at 64, below the longest sequence here, so
    prefill and the decode graphs attend within a window through two KV cache
    groups. And a tiny Phi-4-mini (LongRoPE over 48 of the 64 dimensions,
    original context 256: the engine, at max_model_len 1024, takes the long
    factors for every request, so the reference is HF with its long set
    forced below 256 too; paternoster.model.longrope)."""
    torch.manual_seed(0)
    if request.param == "phi4_mini":
        from transformers import Phi3Config, Phi3ForCausalLM

        gen = torch.Generator().manual_seed(5)
        rope = {"rope_type": "longrope", "rope_theta": CONFIG["rope_theta"],
                "partial_rotary_factor": 0.75,
                "short_factor": (1 + torch.rand(24, generator=gen) * 0.5).tolist(),
                "long_factor": (1 + torch.rand(24, generator=gen) * 10).sort()[0].tolist()}
        hf = Phi3ForCausalLM(Phi3Config(
            **{k: v for k, v in CONFIG.items() if k not in ("rope_theta", "head_dim")},
            rope_parameters=rope, original_max_position_embeddings=256, pad_token_id=0))
        with torch.no_grad():  # sharp attention, so that the rotation shows in the logits
            for layer in hf.model.layers:
                qk = (CONFIG["num_attention_heads"] + CONFIG["num_key_value_heads"]) * 64
                layer.self_attn.qkv_proj.weight[:qk].normal_(0, 0.08)
        hf = hf.to(torch.bfloat16)
        d = tmp_path_factory.mktemp("tiny-phi4-mini-d64")
        hf.save_pretrained(d)
        ref = Phi3ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        rotary = ref.model.rotary_emb
        long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](ref.config, seq_len=257)
        rotary.original_inv_freq.copy_(long_freq)
        return ref, d
    if request.param.startswith("gemma3"):
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        head_dim = 256 if request.param == "gemma3_d256" else CONFIG["head_dim"]
        hf = Gemma3ForCausalLM(Gemma3TextConfig(
            **{**CONFIG, "head_dim": head_dim}, sliding_window=64,
            layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=48,
            rope_local_base_freq=100.0, pad_token_id=0))
        with torch.no_grad():
            for name, param in hf.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(-0.5, 0.5)
    elif request.param == "gpt_oss":
        from transformers import GptOssConfig, GptOssForCausalLM

        rope = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 256,
                "rope_theta": CONFIG["rope_theta"]}
        hf = GptOssForCausalLM(GptOssConfig(
            **{k: v for k, v in CONFIG.items() if k != "rope_theta"}, rope_parameters=rope,
            num_local_experts=4, num_experts_per_tok=2,
            sliding_window=64, layer_types=["sliding_attention", "full_attention"],
            pad_token_id=0))
        with torch.no_grad():
            for name, param in hf.named_parameters():
                if name.endswith(("sinks", "router.weight")):
                    param.normal_(0.0, 1.0)
                elif name.endswith("bias"):
                    param.normal_(0.0, 0.02)
    elif request.param == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**CONFIG))
    elif request.param == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        hf = Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG, moe_intermediate_size=64,
                                                num_experts=4, num_experts_per_tok=2,
                                                pad_token_id=0))
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.mlp.gate.weight.normal_(0, 1.0)
    elif request.param == "smollm3":
        from transformers import SmolLM3Config, SmolLM3ForCausalLM

        hf = SmolLM3ForCausalLM(SmolLM3Config(**CONFIG, no_rope_layers=[1, 0], pad_token_id=0))
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        hf = Qwen3ForCausalLM(Qwen3Config(**CONFIG))
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    hf = hf.to(torch.bfloat16)
    d = tmp_path_factory.mktemp(f"tiny-{request.param}-d{_head_dim(hf.config)}")
    hf.save_pretrained(d)
    # The reference reloaded in float32: ``hf.float()`` would keep the RoPE
    # frequency buffers rounded to bfloat16 (off by 6 % at 300 tokens for Gemma 3).
    return type(hf).from_pretrained(d, dtype=torch.float32).eval(), d


def test_cuda_execute_path_and_padded_decode_graphs_match_hf(hf_and_dir):
    hf, model_dir = hf_and_dir
    backend = kernels.emulated_cuda_backend()
    emu = backend.module
    runner = ModelRunner(ModelConfig(model=str(model_dir), dtype="bfloat16"),
                         CacheConfig(block_size=BLOCK, num_kv_blocks=80),
                         attn_ops=backend, max_num_seqs=8)
    runner._kernel_hints = True
    runner.workspace = backend.alloc_decode_workspace(
        "cpu", 8, CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"],
        _head_dim(hf.config), runner.max_model_len)
    assert runner.head_dim == _head_dim(hf.config)
    assert runner.workspace is not None  # one sequence's long context splits
    # Models with several KV cache groups (Gemma 3's sliding and full layers)
    # get a static slot mapping and block table per group.
    runner.graphs = EagerGraphs(runner.model, runner.kv_caches, torch.device("cpu"),
                                max_num_seqs=8, max_model_len=runner.max_model_len,
                                block_size=BLOCK, workspace=runner.workspace,
                                kernel_hints=True, num_groups=runner.kv_layout.num_groups)
    assert runner.graphs.sizes == [1, 2, 4, 8]
    for cache in runner.kv_caches:  # slots no sequence owns must stay untouched
        cache[0].fill_(float("nan"))
        cache[1].fill_(float("nan"))

    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, CONFIG["vocab_size"], n).tolist() for n in (300, 7, 40)]
    maker = BatchMaker(runner.num_kv_blocks, BLOCK, seed=3,
                       num_groups=runner.kv_layout.num_groups)
    logits = {i: [] for i in range(3)}
    # a prefill step (the CUDA execute path, eager: max_query_len 300) ...
    batch = maker.batch([Chunk(str(i), s, 0, len(s)) for i, s in enumerate(seqs)],
                        all_logits=False)
    out = runner._execute_cuda(batch)
    emu.emu_stats(True)
    for i in range(3):
        logits[i].append(out[i])
    # ... then 5 decode steps of 3 sequences: the graph of size 4, one padding row
    for _ in range(5):
        for i, s in enumerate(seqs):
            s.append(int(logits[i][-1].argmax()))
        batch = maker.batch([Chunk(str(i), s, len(s) - 1, 1) for i, s in enumerate(seqs)],
                            all_logits=False)
        out = runner._execute_cuda(batch)
        for i in range(3):
            logits[i].append(out[i])
    assert runner.graphs.replays == [4] * 5
    assert emu.emu_stats()["launches"] > 0

    owned = {b for table in maker.tables.values() for b in table}
    free = sorted(set(range(runner.num_kv_blocks)) - owned)
    for key_cache, value_cache in runner.kv_caches:
        assert torch.isnan(key_cache[free]).all() and torch.isnan(value_cache[free]).all()

    for i, s in enumerate(seqs):
        n = len(s) - 5  # prompt length: logits of positions n-1 .. len-1 were computed
        ref = hf_logits(hf, s)[n - 1:]
        ours = torch.stack(logits[i]).float()
        err = float((ours - ref).norm() / ref.norm())
        assert err < 5e-2, (i, err)


@pytest.mark.parametrize("family", ["Qwen3.5", "LFM2", "Nemotron-H"])
def test_hybrid_model_gpu_path_matches_hf(family):
    """Each kind of recurrent state (Qwen3.5's Gated DeltaNet, LFM2's short
    convolutions, Nemotron-H's Mamba2) on the GPU path's kernels, emulated:
    bench/gpu_check.py's own check, the one a lent GPU runs."""
    from ..cuda.conftest import load_gpu_check

    res = load_gpu_check().check_hybrid_model_path(
        11, steps=4, device="cpu", attn_ops=kernels.emulated_cuda_backend(), family=family)
    assert res["ok"], res


def _head_dim(config) -> int:
    """The config's head size (Phi-3 configs derive it from the hidden size)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

"""gpt-oss against HF transformers' own GptOssForCausalLM on tiny random-weight
checkpoints: the experts (router bias, softmax over the top k, interleaved
gate/up, clamped SwiGLU, biases) against HF's ``GptOssMLP`` on the same
weights, YaRN RoPE against HF's rotary embedding, MXFP4 dequantization against
the OCP MX spec's value table and HF's own dequantizer, an MXFP4 checkpoint
loaded to HF's weights; and, with attention sinks, float32 logits over a
chunked prefill past the window, greedy ids equal to HF ``generate``, and
the whole engine with chunked prefill."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from paternoster import kernels
from paternoster.model.gpt_oss import GptOssForCausalLM, GptOssMoE
from paternoster.model.loader import load_hf_config, load_model
from paternoster.model.mxfp4 import dequantize_mxfp4
from paternoster.model.rope import RotaryEmbedding, attention_scaling, rope_parameters

from .conftest import greedy_matches_hf_generate
from .test_sliding_window import engine, hf_greedy, prompts, run
from .test_tiny_models import SMALL, _compare

WINDOW = 8
#: gpt-oss-20b's RoPE (its config.json's rope_scaling).
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096,
                "rope_theta": 150000.0}
#: The OCP MX spec's FP4 E2M1 values (Table: "FP4 (E2M1)"), codes 0b0000..0b1111.
SPEC_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
             -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _config(**kwargs):
    from transformers import GptOssConfig

    rope = {**GPT_OSS_ROPE, "factor": 4.0, "original_max_position_embeddings": 64,
            "rope_theta": 1000.0}
    base = dict(SMALL, num_hidden_layers=4, intermediate_size=32, head_dim=16,
                num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                rope_parameters=rope, swiglu_limit=1.0, pad_token_id=0)
    return GptOssConfig(**{**base, **kwargs})


def _hf_model(cfg, seed: int):
    """HF's model with every parameter random (HF zeroes the expert biases
    and draws sinks near 0: make them all matter)."""
    from transformers import GptOssForCausalLM as HFGptOss

    torch.manual_seed(seed)
    model = HFGptOss(cfg).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.normal_(0.0, 1.0)
            elif name.endswith("router.weight"):
                param.normal_(0.0, 0.5)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                param.normal_(0.0, 0.15)
            elif "bias" in name:
                param.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    cfg = _config()
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2
    model = _hf_model(cfg, 41)
    path = tmp_path_factory.mktemp("gpt_oss")
    model.save_pretrained(path)
    return path, model


def _ours(path) -> GptOssForCausalLM:
    cfg = load_hf_config(path)
    model = load_model(path, cfg, torch.float32, kernels)
    assert isinstance(model, GptOssForCausalLM)
    return model


def test_experts_match_hf_mlp(gpt_oss):
    """Each layer's block against HF's GptOssMLP (router + experts) on the
    same weights; the test weights route to every expert and clamp."""
    path, hf = gpt_oss
    ours = _ours(path)
    x = torch.randn(40, SMALL["hidden_size"], generator=torch.Generator().manual_seed(1))
    for layer, hf_layer in zip(ours.layers, hf.model.layers, strict=True):
        moe = layer.mlp
        assert isinstance(moe, GptOssMoE)
        with torch.no_grad():
            ref, _ = hf_layer.mlp(x[None])
        torch.testing.assert_close(moe(x), ref[0], rtol=1e-5, atol=1e-5)
        for i in (0, 7):  # the one-token path
            torch.testing.assert_close(moe(x[i:i + 1]), ref[0, i:i + 1], rtol=1e-5, atol=1e-5)
        _, experts = moe.route(x)
        assert len(set(experts.flatten().tolist())) == 4
    gate_up = torch.nn.functional.linear(x, ours.layers[0].mlp.gate_up_weight)
    assert (gate_up > 1.0).any() and (gate_up < -1.0).any()  # both clamps bite


def test_router_softmax_is_over_the_top_k_only(gpt_oss):
    path, hf = gpt_oss
    moe = _ours(path).layers[1].mlp
    x = torch.randn(9, SMALL["hidden_size"])
    weights, experts = moe.route(x)
    with torch.no_grad():
        _, ref_weights, ref_experts = hf.model.layers[1].mlp.router(x)
    assert torch.equal(experts, ref_experts)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(weights.sum(-1), torch.ones(9))


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_rope_matches_hf_rotary_embedding(truncate):
    """gpt-oss-20b's YaRN (head_dim 64): inverse frequencies, and the cos/sin
    table with the attention factor 0.1 ln(32) + 1 folded in."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = GptOssConfig(rope_parameters={**GPT_OSS_ROPE, "truncate": truncate},
                       num_hidden_layers=2)
    params = rope_parameters(cfg)
    assert params["rope_type"] == "yarn"
    hf = GptOssRotaryEmbedding(cfg)
    ours = RotaryEmbedding(64, 5000, params, torch.float32)
    assert attention_scaling(params) == pytest.approx(0.1 * np.log(32) + 1)
    assert attention_scaling(params) == hf.attention_scaling
    positions = torch.tensor([[0, 1, 7, 100, 4095, 4096, 4999]])
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(ours.cos[positions[0]], cos[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.sin[positions[0]], sin[0], rtol=1e-6, atol=1e-6)
    plain = RotaryEmbedding(64, 5000, {"rope_type": "default", "rope_theta": 150000.0},
                            torch.float32)
    assert not torch.allclose(ours.cos, plain.cos * attention_scaling(params))


def test_yarn_inverse_frequencies_equal_hf():
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from paternoster.model.rope import inverse_frequencies

    for extra in ({}, {"truncate": True}, {"attention_factor": 0.7},
                  {"mscale": 1.0, "mscale_all_dim": 0.5}):
        cfg = GptOssConfig(rope_parameters={**GPT_OSS_ROPE, **extra}, num_hidden_layers=2)
        inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        params = rope_parameters(cfg)
        torch.testing.assert_close(inverse_frequencies(64, params), inv_freq, rtol=1e-6, atol=0)
        assert attention_scaling(params) == pytest.approx(factor, rel=1e-12)


def _random_mxfp4(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 blocks ``[*shape, 16]`` and scales ``shape`` (exponents 2^-8..2^3)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=gen, dtype=torch.int32)
    scales = torch.randint(127 - 8, 127 + 4, shape, generator=gen, dtype=torch.int32)
    return blocks.to(torch.uint8), scales.to(torch.uint8)


def test_mxfp4_dequantization_follows_the_spec():
    blocks, scales = _random_mxfp4((3, 5, 2), seed=2)
    b, s = blocks.numpy(), scales.numpy()
    table = np.array(SPEC_E2M1)
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(3, 5, 2, 32)  # low nibble first
    ref = table[codes] * np.exp2(s.astype(np.float64) - 127)[..., None]
    for dtype in (torch.float32, torch.bfloat16):
        got = dequantize_mxfp4(blocks, scales, dtype)
        assert got.shape == (3, 5, 64) and got.dtype == dtype
        assert np.array_equal(got.float().numpy(), ref.reshape(3, 5, 64))  # exact
    zeros = dequantize_mxfp4(torch.tensor([[0x08] + [0] * 15], dtype=torch.uint8),
                             torch.tensor([127], dtype=torch.uint8), torch.float32)
    assert np.signbit(zeros.numpy()).sum() == 1  # code 8 is -0


def test_mxfp4_dequantization_equals_hf():
    """HF's dequantizer (transformers.integrations.mxfp4, gpt-oss's reference
    code) returns the matrix transposed to its ``[E, in, out]`` parameters."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_mxfp4((4, 6, 3), seed=3)
    for dtype in (torch.float32, torch.bfloat16):
        ref = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert torch.equal(dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2), ref)


def test_mxfp4_bad_inputs_are_refused():
    blocks, scales = _random_mxfp4((2, 2), seed=4)
    with pytest.raises(ValueError, match="NaN"):
        dequantize_mxfp4(blocks, torch.full_like(scales, 0xFF), torch.float32)
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(blocks, scales[:1], torch.float32)
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(blocks.to(torch.int32), scales, torch.float32)


def _quantize_checkpoint(path, hf, out, seed: int) -> None:
    """Rewrite ``path``'s checkpoint as the released gpt-oss ones are stored:
    the expert matrices as MXFP4 ``*_blocks``/``*_scales`` (random codes; HF's
    model gets their dequantized values) and a ``quantization_config``."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(str(path / "model.safetensors"))
    for i, layer in enumerate(hf.model.layers):
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{i}.mlp.experts.{proj}"
            param = getattr(layer.mlp.experts, proj)  # [E, in, out]
            e, n_in, n_out = param.shape
            blocks, scales = _random_mxfp4((e, n_out, n_in // 32), seed + 2 * i + len(proj))
            scales = scales - 3  # keep the activations moderate
            with torch.no_grad():
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            del tensors[name]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    out.mkdir(exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_oss_src")
    hf = _hf_model(_config(), 43)
    hf.save_pretrained(path)
    out = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    _quantize_checkpoint(path, hf, out, seed=5)
    return out, hf


def test_mxfp4_checkpoint_loads_hf_weights(gpt_oss_mxfp4, caplog):
    path, hf = gpt_oss_mxfp4
    with caplog.at_level("INFO"):
        ours = _ours(path)
    assert "dequantized 8 MXFP4 expert tensors" in caplog.text
    x = torch.randn(30, SMALL["hidden_size"], generator=torch.Generator().manual_seed(6))
    inter = ours.config.intermediate_size
    for layer, hf_layer in zip(ours.layers, hf.model.layers, strict=True):
        experts = hf_layer.mlp.experts
        for e in range(4):  # the same values: gate rows, then up rows, per expert
            gate_up = layer.mlp.gate_up_weight[e * 2 * inter:(e + 1) * 2 * inter]
            assert torch.equal(gate_up[:inter], experts.gate_up_proj[e, :, 0::2].T)
            assert torch.equal(gate_up[inter:], experts.gate_up_proj[e, :, 1::2].T)
        assert torch.equal(layer.mlp.down_weight,
                           experts.down_proj.transpose(1, 2).reshape(-1, inter))
        with torch.no_grad():
            ref, _ = hf_layer.mlp(x[None])
        torch.testing.assert_close(layer.mlp(x), ref[0], rtol=1e-4, atol=1e-4)


def test_unknown_quantization_is_refused(gpt_oss):
    path, _ = gpt_oss
    cfg = load_hf_config(path)
    cfg.quantization_config = {"quant_method": "fp8"}
    with pytest.raises(ValueError, match="quant_method 'fp8'"):
        GptOssForCausalLM(cfg, torch.float32, kernels)


def test_mxfp4_blocks_without_scales_are_refused(gpt_oss_mxfp4, tmp_path):
    path, _ = gpt_oss_mxfp4
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match="layers.1.mlp.experts.down_proj"):
        _ours(tmp_path)


def test_model_type_alone_picks_gpt_oss(gpt_oss):
    from paternoster.model.loader import model_class

    cfg = load_hf_config(gpt_oss[0])
    cfg.architectures = None
    assert cfg.model_type == "gpt_oss" and model_class(cfg) is GptOssForCausalLM


# --- end to end (attention sinks in the kernels) ---------------------------------


def test_gpt_oss_matches_hf_forward(gpt_oss, attn_ops):
    path, hf = gpt_oss
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    assert runner.kv_layout.num_groups == 2
    assert runner.model.lm_head is not runner.model.embed_tokens


def test_gpt_oss_mxfp4_matches_hf_forward(gpt_oss_mxfp4, attn_ops):
    path, hf = gpt_oss_mxfp4
    _compare(path, hf, attn_ops, lengths=(30, 11))


def test_gpt_oss_tied_embeddings_match_hf(tmp_path, attn_ops):
    hf = _hf_model(_config(tie_word_embeddings=True, num_hidden_layers=2), 44)
    hf.save_pretrained(tmp_path)
    runner = _compare(tmp_path, hf, attn_ops, lengths=(20, 3))
    assert runner.model.lm_head is runner.model.embed_tokens


def test_gpt_oss_greedy_ids_equal_hf_generate(gpt_oss, attn_ops):
    path, hf = gpt_oss
    ours, ref = greedy_matches_hf_generate(path, hf, attn_ops, [5, 17, 33, 2, 90, 64, 7], 12)
    assert ours == ref


@pytest.mark.parametrize("chunk", [256, 5], ids=["whole-prompts", "chunks-of-5"])
def test_gpt_oss_engine_greedy_matches_hf_past_the_window(gpt_oss, chunk):
    path, hf = gpt_oss
    ps = prompts(6)
    eng = engine(path, chunk=chunk)
    assert eng.kv_cache_manager.num_groups() == 2
    got = run(eng, ps, n=16)
    for rid, p in ps.items():
        assert got[rid] == hf_greedy(hf, p, 16), rid

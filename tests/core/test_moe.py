"""The core's routed experts (``paternoster/moe.h``) against a float64
reference written from the definition (Shazeer et al. 2017; Qwen3-MoE's
routing): softmax over the router logits, the top k, renormalized or not,
each expert a SwiGLU MLP, outputs summed with the routing weights. Quantized
experts are compared on gguf-py's dequantization of their exact blocks.
The model-level tests (tests/model/test_qwen3_moe.py against HF's
Qwen3MoeForCausalLM, tests/model/test_fused_stack.py) run the same call."""

from __future__ import annotations

import pytest
import torch

from paternoster.kernels.moe import CpuMoeExperts, moe_route
from paternoster.kernels.quant import QuantizedWeight, WeightParts
from tests.core.test_linear import _two_threads  # noqa: F401 - the autouse fixture
from tests.core.test_linear_gguf_types import random_blocks

H, INTER, E, K = 256, 64, 8, 3


def reference(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              top_k: int, renormalize: bool, biases=(None, None, None),
              clamp: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out ``[T, H]``, chosen experts ``[T, top_k]``) from the
    definition; ``clamp`` = (alpha, limit): gpt-oss's clamped SwiGLU."""
    x = x.double()
    zero = torch.zeros(1, dtype=torch.float64)
    rb, gb, db = (zero if b is None else b.double() for b in biases)
    probs = torch.softmax(x @ router.double().T + rb, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    h, i = x.shape[1], down.shape[1]
    for t in range(x.shape[0]):
        for s in range(top_k):
            e = int(ids[t, s])
            gu = gate_up.double()[e * 2 * i:(e + 1) * 2 * i] @ x[t]
            if gb.numel() > 1:
                gu = gu + gb[e * 2 * i:(e + 1) * 2 * i]
            if clamp is None:
                act = torch.nn.functional.silu(gu[:i]) * gu[i:]
            else:
                alpha, limit = clamp
                g, u = gu[:i].clamp(max=limit), gu[i:].clamp(-limit, limit)
                act = (u + 1) * g * torch.sigmoid(alpha * g)
            y = down.double()[e * h:(e + 1) * h] @ act
            if db.numel() > 1:
                y = y + db[e * h:(e + 1) * h]
            out[t] += weights[t, s] * y
    return out, ids


def _clear_routing(x: torch.Tensor, router: torch.Tensor, top_k: int) -> torch.Tensor:
    """Tokens whose k-th and (k+1)-th logits are 1e-2 apart or more (no
    rounding can swap their experts)."""
    top = torch.topk(x.double() @ router.double().T, top_k + 1, dim=-1).values
    return (top[:, top_k - 1] - top[:, top_k]) >= 1e-2


def _dense(dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    router = torch.randn(E, H, generator=g) * 0.2
    gate_up = torch.randn(E * 2 * INTER, H, generator=g) * 0.1
    down = torch.randn(E * H, INTER, generator=g) * 0.1
    return router.to(dtype), gate_up.to(dtype), down.to(dtype)


def test_route_matches_softmax_topk():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 16, generator=g) * 3
    for renormalize in (True, False):
        weights, experts = moe_route(logits, 4, renormalize)
        probs = torch.softmax(logits.double(), -1)
        ref_w, ref_ids = torch.topk(probs, 4, dim=-1)
        if renormalize:
            ref_w = ref_w / ref_w.sum(-1, keepdim=True)
        assert torch.equal(experts.long(), ref_ids)
        torch.testing.assert_close(weights.double(), ref_w, rtol=1e-6, atol=1e-7)


def test_route_ties_take_the_lower_expert():
    weights, experts = moe_route(torch.tensor([[1.0, 2.0, 2.0, 2.0]]), 2, False)
    assert experts.tolist() == [[1, 2]]


@pytest.mark.parametrize("top_k", [0, 9])
def test_bad_top_k_is_refused(top_k):
    with pytest.raises(ValueError, match="top_k"):
        moe_route(torch.zeros(2, 8), top_k, True)
    router, gate_up, down = _dense(torch.float32, 0)
    with pytest.raises(ValueError, match="top_k"):
        CpuMoeExperts(router, gate_up, down, H, INTER, E, top_k, True, torch.float32)


@pytest.mark.parametrize(("groups", "topk_groups"), [(3, 1), (4, 5), (4, 0), (8, 1)])
def test_bad_expert_groups_are_refused(groups, topk_groups):
    """n_group must divide the experts, topk_group lie in [1, n_group], and
    the kept groups hold at least top_k experts of two or more per group."""
    router, gate_up, down = _dense(torch.float32, 0)
    with pytest.raises(ValueError, match="routing"):
        CpuMoeExperts(router, gate_up, down, H, INTER, E, K, True, torch.float32,
                      sigmoid_routing=(None, 0.0, 1.0, groups, topk_groups))


def test_wrong_rows_are_refused():
    router, gate_up, down = _dense(torch.float32, 0)
    with pytest.raises(ValueError, match="gate_up parts hold"):
        CpuMoeExperts(router, gate_up[:-2], down, H, INTER, E, K, True, torch.float32)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tokens", [1, 5, 40])
@pytest.mark.parametrize("renormalize", [True, False])
def test_dense_experts_match_float64(dtype, tol, tokens, renormalize):
    router, gate_up, down = _dense(dtype, tokens)
    x = (torch.randn(tokens, H, generator=torch.Generator().manual_seed(9))).to(dtype)
    out = CpuMoeExperts(router, gate_up, down, H, INTER, E, K, renormalize, dtype).forward(x)
    ref, _ = reference(x, router, gate_up, down, K, renormalize)
    clear = _clear_routing(x, router, K)
    assert clear.float().mean() > 0.8
    err = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert err[clear].max() < tol


#: Bounds on quantized experts: the float path (batch-invariant) rounds the
#: gate/up projection and SwiGLU to bfloat16; the default path also quantizes
#: both projections' activations to 8 bits (as llama.cpp's CPU path does).
QUANT_TOL = {True: 1.5e-2, False: 6e-2}


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q8_0"])
@pytest.mark.parametrize("tokens", [1, 6, 33])
@pytest.mark.parametrize("invariant", [True, False])
def test_quantized_experts_match_float64(fmt, tokens, invariant):
    """Experts stored as GGUF blocks, gate and up as separate parts per expert
    (as a GGUF file keeps them), the down projection one stacked matrix in
    another format (Q4_K_M stores some as Q6_K)."""
    inter = 256  # the down projection's in_features: whole 256-value blocks
    down_fmt = "q6_k" if fmt != "q6_k" else "q4_k"
    down, down_ref = random_blocks(E * H, inter, down_fmt, seed=99)
    parts, gate_up_ref = [], []
    for e in range(E):
        for half in range(2):
            qw, ref = random_blocks(inter, H, fmt, seed=10 * e + half)
            parts.append(qw)
            gate_up_ref.append(ref)
    gate_up = WeightParts(tuple(parts))
    g = torch.Generator().manual_seed(3)
    router = torch.randn(E, H, generator=g) * 0.2
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    block = CpuMoeExperts(router.to(torch.bfloat16), gate_up, down, H, inter, E, K, True,
                          torch.bfloat16)
    out = block.forward(x, invariant)
    ref, _ = reference(x, router.to(torch.bfloat16), torch.cat(gate_up_ref), down_ref, K, True)
    clear = _clear_routing(x, router.to(torch.bfloat16), K)
    assert clear.float().mean() > 0.8
    err = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert err[clear].max() < QUANT_TOL[invariant]


def test_a_token_alone_equals_its_row_in_a_batch():
    """With batch-invariant kernels a token's output is the same bits alone
    (the one-token path: one fused gate/up call) and in a batch (grouped by
    expert)."""
    fmt, inter = "q4_k", 256
    parts = [random_blocks(inter, H, fmt, seed=s)[0] for s in range(2 * E)]
    down = random_blocks(E * H, inter, "q6_k", seed=50)[0]
    router = (torch.randn(E, H, generator=torch.Generator().manual_seed(4)) * 0.2)
    block = CpuMoeExperts(router.to(torch.bfloat16), WeightParts(tuple(parts)), down, H, inter,
                          E, K, False, torch.bfloat16)
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    together = block.forward(x, invariant=True)
    for t in range(7):
        assert torch.equal(block.forward(x[t:t + 1].contiguous(), invariant=True)[0], together[t])


def test_quantized_weight_stacked_in_one_matrix():
    """gate_up as one QuantizedWeight of all experts' rows (not parts)."""
    inter = 256
    gate_up, gate_up_ref = random_blocks(E * 2 * inter, H, "q4_k", seed=7)
    down, down_ref = random_blocks(E * H, inter, "q4_k", seed=8)
    assert isinstance(gate_up, QuantizedWeight)
    router = torch.randn(E, H, generator=torch.Generator().manual_seed(6)) * 0.2
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(7)).float()
    block = CpuMoeExperts(router, gate_up, down, H, inter, E, K, True, torch.float32)
    ref, _ = reference(x, router, gate_up_ref, down_ref, K, True)
    clear = _clear_routing(x, router, K)
    err = (block.forward(x, invariant=True).double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert err[clear].max() < 1e-5  # float32 throughout


@pytest.mark.parametrize("tokens", [1, 9])
def test_biases_and_clamped_swiglu_match_float64(tokens):
    """gpt-oss's experts: biases on the router and both projections, the
    clamped SwiGLU (alpha 1.702, limit 7: large weights so the clamps bite),
    the softmax over the top-k logits alone (= renormalized top-k)."""
    g = torch.Generator().manual_seed(tokens)
    router, gate_up, down = _dense(torch.float32, tokens)
    gate_up = gate_up * 30  # pre-activations beyond +-7
    biases = (torch.randn(E, generator=g), torch.randn(E * 2 * INTER, generator=g),
              torch.randn(E * H, generator=g))
    x = torch.randn(tokens, H, generator=g)
    block = CpuMoeExperts(router, gate_up, down, H, INTER, E, K, True, torch.float32, biases,
                          "clamped_swiglu", 1.702, 7.0)
    ref, _ = reference(x, router, gate_up, down, K, True, biases, clamp=(1.702, 7.0))
    pre = (x.double() @ gate_up.double().T).abs()
    assert (pre > 7).float().mean() > 0.2  # the clamps are exercised
    err = (block.forward(x).double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert err.max() < 1e-5  # float32 throughout


def test_bad_activation_is_refused():
    router, gate_up, down = _dense(torch.float32, 0)
    with pytest.raises(ValueError, match="activation"):
        CpuMoeExperts(router, gate_up, down, H, INTER, E, K, True, torch.float32,
                      activation="gelu")
    with pytest.raises(ValueError, match="limit > 0"):
        CpuMoeExperts(router, gate_up, down, H, INTER, E, K, True, torch.float32,
                      activation="clamped_swiglu", alpha=1.0, limit=0.0)

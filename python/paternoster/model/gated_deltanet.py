"""Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh 2024, "Gated
Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464), the
token mixer of three in four layers of Qwen3-Next and Qwen3.5.

Each head keeps a state ``S`` ``[Dk, Dv]`` instead of a KV cache. Per token,
with ``q`` and ``k`` L2-normalized and ``q`` scaled by ``Dk ** -0.5``, a decay
``alpha = exp(g)`` (``g <= 0``) and a write strength ``beta`` in (0, 1)::

    S = alpha * S                      # forget
    u = beta * (v - S^T k)             # the delta rule: write only the error
    S = S + k u^T
    o = S^T q

Before the rule, q/k/v pass a causal depthwise convolution of width ``K``
over the sequence (with SiLU), whose last ``K - 1`` inputs are the second
part of the state. A request's state lives in one *state slot*
(``_core.KVCacheManager``'s recurrent-state group), in per-layer tensors
``conv_state`` ``[N, C, K - 1]`` (model dtype) and ``ssm_state``
``[N, Hv, Dk, Dv]`` (float32).

Two forms compute the same rule: :func:`recurrent_step` (decode: one token
per sequence, batched over sequences) and :func:`chunked_delta_rule`
(prefill: chunks of ``C`` tokens as a few matmuls, the chunkwise WY form of
Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule
over Sequence Length", arXiv:2406.06484, with the gate folded in as in the
Gated DeltaNet paper). tests/model/test_gated_deltanet.py checks both against
a float64 loop of the recurrence above and against each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata
from paternoster.model.causal_conv import causal_conv1d, causal_conv1d_step
from paternoster.model.state_slots import SlotSpan, decode_index, slot_spans

#: Tokens per chunk of :func:`chunked_delta_rule` (FLA's and HF's choice).
CHUNK_SIZE = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (FLA's form, as
    HF's Qwen3-Next), same shape and dtype."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float32, heads first (``[H, L, D]`` / ``[H, L]``), q/k normalized and
    repeated to the value heads, q scaled by ``Dk ** -0.5``."""
    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:  # each q/k head serves `rep` consecutive value heads
        q = q.repeat_interleave(rep, dim=-2)
        k = k.repeat_interleave(rep, dim=-2)
    q, k = l2norm(q.float()), l2norm(k.float())
    q = q * q.shape[-1] ** -0.5
    return (q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1),
            g.float().t(), beta.float().t())


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, state: torch.Tensor,
                       chunk_size: int = CHUNK_SIZE) -> torch.Tensor:
    """The gated delta rule over one sequence's ``L`` tokens, chunk by chunk.

    Within a chunk with cumulative log-decay ``G_i = g_1 + ... + g_i`` and
    entering state ``S0``, the writes ``U`` solve the unit lower-triangular
    system ``(I + L) U = beta V - (beta exp(G) K) S0`` with ``L_ij = beta_i
    exp(G_i - G_j) k_i . k_j`` (j < i); then ``O = (exp(G) Q) S0 + (M * Q K^T)
    U`` with ``M_ij = exp(G_i - G_j)`` (j <= i) and the state leaving is
    ``exp(G_C) S0 + (exp(G_C - G) K)^T U``.

    Args:
        q, k: ``[L, Hk, Dk]``; v: ``[L, Hv, Dv]`` (``Hv`` a multiple of ``Hk``).
        g: ``[L, Hv]`` log-decays (<= 0); beta: ``[L, Hv]``.
        state: float32 ``[Hv, Dk, Dv]``, the state before the first token;
            overwritten with the state after the last.
        chunk_size: tokens per chunk (>= 1).
    Returns:
        ``[L, Hv, Dv]`` in ``v``'s dtype.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = state
    outs = []
    for start in range(0, q.shape[1], chunk_size):
        end = min(start + chunk_size, q.shape[1])
        qc, kc, vc = q[:, start:end], k[:, start:end], v[:, start:end]
        bc = beta[:, start:end, None]
        cum = g[:, start:end].cumsum(dim=-1)  # [H, C]
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp()
        system = (bc * kc) @ kc.transpose(-1, -2) * decay  # strictly lower part used
        rhs = torch.cat([bc * vc, bc * cum.exp()[..., None] * kc], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        w, kd = solved[..., : vc.shape[-1]], solved[..., vc.shape[-1]:]
        u = w - kd @ s  # [H, C, Dv]
        attn = (qc @ kc.transpose(-1, -2)) * decay
        outs.append((qc * cum.exp()[..., None]) @ s + attn @ u)
        last = cum[:, -1:]
        s = last.exp()[..., None] * s + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    state.copy_(s)
    return torch.cat(outs, dim=1).transpose(0, 1).to(out_dtype)


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """One token of the gated delta rule for each of ``B`` sequences.

    Args:
        q, k: ``[B, Hk, Dk]``; v: ``[B, Hv, Dv]``; g, beta: ``[B, Hv]``.
        states: float32 ``[B, Hv, Dk, Dv]`` (gathered from the slots;
            updated in place).
    Returns:
        ``[B, Hv, Dv]`` in ``v``'s dtype.
    """
    out_dtype = v.dtype
    rep = v.shape[-2] // k.shape[-2]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=-2)
        k = k.repeat_interleave(rep, dim=-2)
    q, k = l2norm(q.float()), l2norm(k.float())
    q = q * q.shape[-1] ** -0.5
    s = states * g.float().exp()[..., None, None]
    error = v.float() - (s * k[..., None]).sum(dim=-2)  # v - S^T k: [B, H, Dv]
    s = s + k[..., None] * (beta.float()[..., None] * error)[..., None, :]
    states.copy_(s)
    return (s * q[..., None]).sum(dim=-2).to(out_dtype)


def state_shapes(config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One state slot of one linear layer: the shapes of ``conv_state``
    ``[C, K - 1]`` (model dtype; ``C = 2 Hk Dk + Hv Dv``) and ``ssm_state``
    ``[Hv, Dk, Dv]`` (float32), from a Qwen3-Next / Qwen3.5 config."""
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    return (2 * hk * dk + hv * dv, config.linear_conv_kernel_dim - 1), (hv, dk, dv)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet token mixer over a flattened batch (Qwen3-Next /
    Qwen3.5 ``linear_attn``), its per-request state in state slots.

    Parameters (model dtype unless said): ``in_proj_weight`` ``[2 Kd + 2 Vd +
    2 Hv, H]``, rows of q (``Kd = Hk * Dk``), k, v (``Vd = Hv * Dv``), the
    output gate z, then beta's and the decay's inputs b and a (one per value
    head; HF's Qwen3-Next interleaves them per key head, the loader reorders);
    ``conv_weight`` ``[2 Kd + Vd, K]``; ``dt_bias`` and ``A_log`` ``[Hv]``;
    ``norm_weight`` ``[Dv]`` (the gated RMSNorm); ``out_weight`` ``[H, Vd]``.

    Value head j reads key head ``j // (Hv / Hk)`` (HF's grouped order), or
    ``j mod Hk`` with ``config.linear_value_heads_tiled`` (llama.cpp's
    converter tiles Qwen3.5's value heads so; every value-head-indexed row
    and column of the file follows that order, which is kept).

    Args:
        config: a Qwen3-Next / Qwen3.5 text config (``linear_*`` fields,
            ``rms_norm_eps``, ``hidden_act`` silu).
    Raises:
        ValueError: value heads not a multiple of key heads, or an activation
            other than silu.
    """

    #: The layer's KV cache group (a recurrent-state group; set by the model).
    kv_group = 0

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__()
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        if self.hv % self.hk:
            raise ValueError(f"linear_num_value_heads ({self.hv}) must be a multiple of "
                             f"linear_num_key_heads ({self.hk})")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {config.hidden_act!r}")
        self.tiled = bool(getattr(config, "linear_value_heads_tiled", False))
        self.kernel = config.linear_conv_kernel_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.eps = config.rms_norm_eps
        self.invariant = invariant
        h = config.hidden_size
        param = lambda *shape, dt=dtype: nn.Parameter(  # noqa: E731
            torch.empty(*shape, dtype=dt), requires_grad=False)
        self.in_proj_weight = param(self.conv_dim + self.value_dim + 2 * self.hv, h)
        self.conv_weight = param(self.conv_dim, self.kernel)
        self.dt_bias = param(self.hv)
        self.A_log = param(self.hv)
        self.norm_weight = param(self.dv)
        self.out_weight = param(h, self.value_dim)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``.

        Args:
            state: ``(conv_state [N, C, K - 1], ssm_state [N, Hv, Dk, Dv])``,
                indexed by state slot; each sequence's slot is column 0 of
                its row in the layer group's block table. A sequence with no
                computed tokens before this step starts from zeros; the slots
                of this step's sequences are updated in place.
            attn: the step's placement (``query_start_loc``, ``seq_lens``).
        """
        conv_state, ssm_state = state
        T = x.shape[0]
        proj = kernels.linear(x, self.in_proj_weight, invariant=self.invariant)
        mixed, z, b, a = proj.split([self.conv_dim, self.value_dim, self.hv, self.hv], dim=-1)
        spans = slot_spans(attn, self.kv_group)
        if self.invariant:
            normed = self._stepwise(mixed, z, b, a, spans, state)
            return kernels.linear(normed.reshape(T, self.value_dim), self.out_weight,
                                  invariant=True)
        beta, g = self._gates(b, a)
        core = torch.empty(T, self.hv, self.dv, dtype=x.dtype, device=x.device)
        for s in spans:
            if s.decode:
                continue
            if s.fresh:
                conv_state[s.slot].zero_()
                ssm_state[s.slot].zero_()
            qkv = causal_conv1d(mixed[s.lo:s.hi], conv_state[s.slot], self.conv_weight)
            q, k, v = self._split_heads(qkv)
            core[s.lo:s.hi] = chunked_delta_rule(q, k, v, g[s.lo:s.hi], beta[s.lo:s.hi],
                                                 ssm_state[s.slot])
        index = decode_index(spans, x.device)
        if index is not None:
            rows, idx = index
            conv = conv_state.index_select(0, idx)
            qkv = causal_conv1d_step(mixed.index_select(0, rows), conv, self.conv_weight)
            conv_state.index_copy_(0, idx, conv)
            q, k, v = self._split_heads(qkv)
            ssm = ssm_state.index_select(0, idx)
            out = recurrent_step(q, k, v, g.index_select(0, rows), beta.index_select(0, rows), ssm)
            ssm_state.index_copy_(0, idx, ssm)
            core.index_copy_(0, rows, out)
        normed = self._gated_norm(core, z.reshape(T, self.hv, self.dv))
        return kernels.linear(normed.reshape(T, self.value_dim), self.out_weight,
                              invariant=self.invariant)

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``beta = sigmoid(b)`` (model dtype) and the log-decay ``g =
        -exp(A_log) * softplus(a + dt_bias)`` (float32), both ``[n, Hv]``."""
        return torch.sigmoid(b), -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)

    def _stepwise(self, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                  spans: list[SlotSpan], state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Batch-invariant mode: each token of each sequence on its own, from
        the gates to the gated norm, through the one-token forms
        (:func:`causal_conv1d_step`, :func:`recurrent_step`). Its bits then do
        not depend on the step's other rows (torch's elementwise kernels round
        a vector's tail differently from its body), on how its prompt was
        chunked or on a preemption's recompute (the chunked form's sums move
        with chunk boundaries). Returns the gated-norm output ``[T, Hv, Dv]``;
        costs a Python loop per token."""
        conv_state, ssm_state = state
        out = torch.empty(mixed.shape[0], self.hv, self.dv, dtype=mixed.dtype,
                          device=mixed.device)
        for s in spans:
            if s.fresh:
                conv_state[s.slot].zero_()
                ssm_state[s.slot].zero_()
            conv, ssm = conv_state[s.slot : s.slot + 1], ssm_state[s.slot : s.slot + 1]
            for t in range(s.lo, s.hi):
                row = slice(t, t + 1)
                beta, g = self._gates(b[row], a[row])
                q, k, v = self._split_heads(causal_conv1d_step(mixed[row], conv,
                                                               self.conv_weight))
                core = recurrent_step(q, k, v, g, beta, ssm)
                out[row] = self._gated_norm(core, z[row].reshape(1, self.hv, self.dv))
        return out

    def _split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``[n, C]`` conv output -> q, k ``[n, Hk, Dk]`` and v ``[n, Hv, Dv]``
        (with tiled value heads, q and k repeated to ``[n, Hv, Dk]`` in that
        order)."""
        n = qkv.shape[0]
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = q.reshape(n, self.hk, self.dk), k.reshape(n, self.hk, self.dk)
        if self.tiled and self.hv > self.hk:
            r = self.hv // self.hk
            q, k = q.repeat(1, r, 1), k.repeat(1, r, 1)
        return q, k, v.reshape(n, self.hv, self.dv)

    def _gated_norm(self, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """RMSNorm over each head's ``Dv`` (float32, cast back before the
        weight), times ``silu(z)`` in float32, cast to the model dtype (HF's
        ``Qwen3NextRMSNormGated`` order)."""
        y = core.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.norm_weight * y.to(core.dtype)
        return (y * F.silu(z.float())).to(core.dtype)

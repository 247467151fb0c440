"""Mamba2's selective state space layer (Dao & Gu 2024, "Transformers are
SSMs: Generalized Models and Efficient Algorithms Through Structured State
Space Duality", arXiv:2405.21060), the token mixer of Nemotron-H's and
Granite 4.0-H's ``"linear_attention"`` layers.

Each of ``H`` heads keeps a state ``S`` ``[P, N]`` (head size ``P``, state
size ``N``); per token, with a step ``dt > 0``, a scalar decay
``exp(dt * A)`` (``A < 0`` per head) and input-dependent ``B``, ``C``
``[N]`` shared by the heads of one of ``G`` groups::

    S = exp(dt * A) * S + dt * x B^T
    y = S C + D * x

Before it, x, B and C pass a causal depthwise convolution of width ``K``
with SiLU (its last ``K - 1`` inputs are the conv state); after it, ``y``
is gated by ``silu(z)`` and RMS-normalized in ``G`` groups (HF's
``RMSNormGated``, ``norm_before_gate=False``). A request's state lives in
one *state slot* of the recurrent-state group: ``conv_state`` ``[N, C, K -
1]`` (model dtype, ``C = H P + 2 G N``) and ``ssm_state`` ``[N, H, P, N]``
(float32).

Two forms compute the same recurrence: :func:`ssd_step` (decode: one token
per sequence, batched) and :func:`ssd_chunk_scan` (prefill: chunks of ``Q``
tokens as a few matmuls, the paper's state space dual form: within a chunk
the quadratic, attention-like form masked by the decays, between chunks the
state passed on). tests/model/test_mamba2.py checks both against a float64
loop of the recurrence above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata
from paternoster.model.causal_conv import causal_conv1d, causal_conv1d_step
from paternoster.model.rowwise import rowwise
from paternoster.model.state_slots import decode_index, slot_spans

#: Tokens per chunk of :func:`ssd_chunk_scan` when the config names none.
CHUNK_SIZE = 128


@dataclass(frozen=True)
class Mamba2Shape:
    """A Mamba2 layer's sizes, from either naming of the configs.

    Attributes:
        heads (H), head_dim (P), groups (G), state (N), conv_kernel (K):
            as the module docstring. chunk: tokens per scan chunk.
        conv_bias, proj_bias: the conv and the in/out projections have biases.
        eps: the gated norm's epsilon. dt_min, dt_max: ``dt`` clamped to this.
    """

    heads: int
    head_dim: int
    groups: int
    state: int
    conv_kernel: int
    chunk: int
    conv_bias: bool
    proj_bias: bool
    eps: float
    dt_min: float = 0.0
    dt_max: float = float("inf")

    @property
    def inner(self) -> int:
        """``H P``, the width of x, z and y."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.inner + 2 * self.groups * self.state

    @classmethod
    def from_config(cls, config) -> Mamba2Shape:
        """From a Nemotron-H config (``mamba_num_heads``, ``ssm_state_size``,
        ``n_groups``, ``conv_kernel``...; ``dt`` at least ``time_step_min``)
        or a Granite 4.0-H / Bamba one (``mamba_n_heads``, ``mamba_d_state``,
        ``mamba_n_groups``, ``mamba_d_conv``...; ``time_step_limit``).

        Raises:
            ValueError: heads not a multiple of groups.
        """
        if hasattr(config, "mamba_num_heads"):  # Nemotron-H
            shape = cls(config.mamba_num_heads, config.mamba_head_dim, config.n_groups,
                        config.ssm_state_size, config.conv_kernel,
                        int(getattr(config, "chunk_size", None) or CHUNK_SIZE),
                        bool(config.use_conv_bias), bool(getattr(config, "use_bias", False)),
                        float(config.layer_norm_epsilon),
                        float(getattr(config, "time_step_min", 0.0) or 0.0))
        else:  # Granite 4.0-H
            lo, hi = tuple(getattr(config, "time_step_limit", None) or (0.0, float("inf")))
            shape = cls(config.mamba_n_heads, config.mamba_d_head, config.mamba_n_groups,
                        config.mamba_d_state, config.mamba_d_conv,
                        int(getattr(config, "mamba_chunk_size", None) or CHUNK_SIZE),
                        bool(config.mamba_conv_bias), bool(config.mamba_proj_bias),
                        float(config.rms_norm_eps), float(lo), float(hi))
        if shape.heads % shape.groups:
            raise ValueError(f"Mamba2 heads ({shape.heads}) must be a multiple of its "
                             f"groups ({shape.groups})")
        return shape


def state_shapes(config) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """One slot of one Mamba2 layer: ``conv_state`` ``[C, K - 1]`` (model
    dtype) and ``ssm_state`` ``[H, P, N]`` (float32)."""
    s = Mamba2Shape.from_config(config)
    return (s.conv_dim, s.conv_kernel - 1), (s.heads, s.head_dim, s.state)


def _per_head(bc: torch.Tensor, heads: int) -> torch.Tensor:
    """``[..., G, N]`` -> ``[..., H, N]``: head ``h`` reads group ``h // (H / G)``."""
    return bc.repeat_interleave(heads // bc.shape[-2], dim=-2)


def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   c: torch.Tensor, d: torch.Tensor, state: torch.Tensor,
                   chunk_size: int = CHUNK_SIZE) -> torch.Tensor:
    """The recurrence over one sequence's ``L`` tokens, chunk by chunk.

    Within a chunk, with cumulative log-decay ``G_i = dt_1 A + ... + dt_i A``
    and entering state ``S0``: ``y_i = exp(G_i) S0 C_i + sum_{j <= i}
    exp(G_i - G_j) (C_i . B_j) dt_j x_j``; the state leaving is
    ``exp(G_Q) S0 + sum_j exp(G_Q - G_j) dt_j x_j B_j^T`` (the SSD paper's
    block decomposition, its "minimal" algorithm).

    Args:
        x: ``[L, H, P]``. dt: float32 ``[L, H]`` (after softplus and the
            clamp). a: float32 ``[H]`` (``A``, negative). b, c: ``[L, G, N]``.
        d: ``[H]``. state: float32 ``[H, P, N]``, the state before the first
            token; overwritten with the state after the last.
        chunk_size: tokens per chunk (>= 1).
    Returns:
        float32 ``[L, H, P]`` (with the ``D x`` skip).
    """
    heads = x.shape[1]
    xs = x.float().transpose(0, 1)  # [H, L, P]
    bs = _per_head(b.float(), heads).transpose(0, 1)  # [H, L, N]
    cs = _per_head(c.float(), heads).transpose(0, 1)
    dts = dt.t()  # [H, L]
    log_decay = dts * a[:, None]
    s = state
    outs = []
    for start in range(0, xs.shape[1], chunk_size):
        end = min(start + chunk_size, xs.shape[1])
        cum = log_decay[:, start:end].cumsum(dim=-1)  # [H, Q]
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp()
        xdt = xs[:, start:end] * dts[:, start:end, None]  # [H, Q, P]
        bc, cc = bs[:, start:end], cs[:, start:end]
        scores = (cc @ bc.transpose(-1, -2)) * decay  # [H, Q, Q]
        outs.append(scores @ xdt + cum.exp()[..., None] * (cc @ s.transpose(-1, -2)))
        last = cum[:, -1:]
        s = last.exp()[..., None] * s + (xdt * (last - cum).exp()[..., None]).transpose(-1, -2) @ bc
    state.copy_(s)
    y = torch.cat(outs, dim=1).transpose(0, 1)  # [L, H, P]
    return y + d.float()[:, None] * x.float()


def ssd_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             c: torch.Tensor, d: torch.Tensor, states: torch.Tensor,
             invariant: bool = False) -> torch.Tensor:
    """One token of the recurrence for each of ``B`` sequences.

    Args:
        x: ``[B, H, P]``; dt: float32 ``[B, H]``; a, d: ``[H]``;
        b, c: ``[B, G, N]``; states: contiguous float32 ``[B, H, P, N]``
            (the slots' rows, gathered or a view; updated in place).
        invariant: elementwise ops only, transcendental ones row by row, so
            a sequence's bits do not depend on ``B`` (else the write and the
            read-out are batched matrix products, two passes over the state).
    Returns:
        float32 ``[B, H, P]``.
    """
    batch, heads, p = x.shape
    n = states.shape[-1]
    xf = x.float()
    bh, ch = _per_head(b.float(), heads), _per_head(c.float(), heads)  # [B, H, N]
    decay = rowwise(torch.exp, dt * a, invariant)
    if invariant:
        s = states * decay[..., None, None] + (dt[..., None] * xf)[..., None] * bh[:, :, None, :]
        states.copy_(s)
        return (s * ch[:, :, None, :]).sum(dim=-1) + d.float()[:, None] * xf
    states.mul_(decay[..., None, None])
    flat = states.view(batch * heads, p, n)
    flat.baddbmm_((dt[..., None] * xf).reshape(batch * heads, p, 1),
                  bh.reshape(batch * heads, 1, n))
    y = torch.bmm(flat, ch.reshape(batch * heads, n, 1)).view(batch, heads, p)
    return y + d.float()[:, None] * xf


class Mamba2Mixer(nn.Module):
    """One Mamba2 token mixer over a flattened batch, its per-request state
    in state slots.

    Parameters (model dtype unless said): ``in_proj_weight`` ``[I + C + H,
    hidden]`` (rows of z, then x, B, C, then dt; ``I = H P``),
    ``conv_weight`` ``[C, K]`` and ``conv_bias`` ``[C]`` (or None),
    ``dt_bias``, ``A_log``, ``D`` ``[H]``, ``norm_weight`` ``[I]``,
    ``out_weight`` ``[hidden, I]``; with projection biases
    ``in_proj_bias`` and ``out_bias`` (else None).

    Args:
        config: a Nemotron-H or Granite 4.0-H config (:class:`Mamba2Shape`).
    Raises:
        ValueError: what :meth:`Mamba2Shape.from_config` raises.
    """

    #: The layer's KV cache group (the recurrent-state group; set by the model).
    kv_group = 0

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__()
        s = self.shape = Mamba2Shape.from_config(config)
        self.invariant = invariant
        hidden = config.hidden_size
        param = lambda *shape: nn.Parameter(torch.empty(*shape, dtype=dtype),  # noqa: E731
                                            requires_grad=False)
        rows = s.inner + s.conv_dim + s.heads
        self.in_proj_weight = param(rows, hidden)
        self.in_proj_bias = param(rows) if s.proj_bias else None
        self.conv_weight = param(s.conv_dim, s.conv_kernel)
        self.conv_bias = param(s.conv_dim) if s.conv_bias else None
        self.dt_bias = param(s.heads)
        self.A_log = param(s.heads)
        self.D = param(s.heads)
        self.norm_weight = param(s.inner)
        self.out_weight = param(hidden, s.inner)
        self.out_bias = param(hidden) if s.proj_bias else None

    def matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's projection matrices (dense or quantized)."""
        return self.in_proj_weight, self.out_weight

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, hidden]`` -> ``[T, hidden]``.

        Args:
            state: ``(conv_state [N, C, K - 1], ssm_state [N, H, P, N])``
                indexed by state slot; a sequence with no computed tokens
                before this step starts from zeros; this step's sequences'
                slots are updated in place.
            attn: the step's placement (column 0 of the group's block
                tables is each sequence's slot).
        """
        conv_state, ssm_state = state
        s = self.shape
        proj = kernels.linear(x, self.in_proj_weight, self.in_proj_bias, invariant=self.invariant)
        z, xbc, dt = proj.split([s.inner, s.conv_dim, s.heads], dim=-1)
        dt = rowwise(F.softplus, dt.float() + self.dt_bias.float(),
                     self.invariant).clamp(s.dt_min, s.dt_max)
        a = -self.A_log.float().exp()
        y = torch.empty(x.shape[0], s.heads, s.head_dim, dtype=torch.float32, device=x.device)
        spans = slot_spans(attn, self.kv_group)
        for sp in spans:
            if sp.decode:
                continue
            if sp.fresh:
                conv_state[sp.slot].zero_()
                ssm_state[sp.slot].zero_()
            if self.invariant:  # the one-token forms for every token (as Gated DeltaNet)
                conv = conv_state[sp.slot : sp.slot + 1]
                slot = torch.tensor([sp.slot], device=x.device)
                for t in range(sp.lo, sp.hi):
                    xt, bt, ct = self._split(causal_conv1d_step(
                        xbc[t : t + 1], conv, self.conv_weight, self.conv_bias))
                    y[t : t + 1] = self._ssm_step(ssm_state, slot, xt, dt[t : t + 1], a, bt, ct)
                continue
            xs, bs, cs = self._split(causal_conv1d(xbc[sp.lo:sp.hi], conv_state[sp.slot],
                                                   self.conv_weight, self.conv_bias))
            y[sp.lo:sp.hi] = ssd_chunk_scan(xs, dt[sp.lo:sp.hi], a, bs, cs, self.D,
                                            ssm_state[sp.slot], s.chunk)
        index = decode_index(spans, x.device)
        if index is not None:
            rows, slots = index
            conv = conv_state.index_select(0, slots)
            xs, bs, cs = self._split(causal_conv1d_step(xbc.index_select(0, rows), conv,
                                                        self.conv_weight, self.conv_bias))
            conv_state.index_copy_(0, slots, conv)
            y.index_copy_(0, rows, self._ssm_step(ssm_state, slots, xs, dt.index_select(0, rows),
                                                  a, bs, cs))
        out = self._gated_norm(y.reshape(x.shape[0], s.inner), z).to(x.dtype)
        return kernels.linear(out, self.out_weight, self.out_bias, invariant=self.invariant)

    def _ssm_step(self, ssm_state: torch.Tensor, slots: torch.Tensor, xs: torch.Tensor,
                  dt: torch.Tensor, a: torch.Tensor, bs: torch.Tensor,
                  cs: torch.Tensor) -> torch.Tensor:
        """One token of each of the sequences in ``slots`` (int64 ``[B]``):
        float32 ``[B, H, P]``. On the CPU the core's update, in place on the
        slots, one pass over each state; elsewhere :func:`ssd_step` on the
        gathered states, written back."""
        if ssm_state.device.type == "cpu":
            f = lambda t: t.float().contiguous()  # noqa: E731
            return kernels.mamba2_state_update(ssm_state, slots, f(xs), dt.contiguous(), a,
                                               f(bs), f(cs), f(self.D))
        ssm = ssm_state.index_select(0, slots)
        out = ssd_step(xs, dt, a, bs, cs, self.D, ssm, self.invariant)
        ssm_state.index_copy_(0, slots, ssm)
        return out

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output ``[n, C]`` -> x ``[n, H, P]``, B and C ``[n, G, N]``."""
        s, n = self.shape, xbc.shape[0]
        xs, b, c = xbc.split([s.inner, s.groups * s.state, s.groups * s.state], dim=-1)
        return (xs.reshape(n, s.heads, s.head_dim), b.reshape(n, s.groups, s.state),
                c.reshape(n, s.groups, s.state))

    def _gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``y * silu(z)`` RMS-normalized over each of the G groups of
        ``I / G`` columns, times the weight, float32 (HF's ``RMSNormGated``
        with the gate applied before the norm)."""
        s = self.shape
        h = y * rowwise(F.silu, z.float(), self.invariant)
        g = h.view(h.shape[0], s.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + s.eps)
        return self.norm_weight.float() * g.view_as(h)

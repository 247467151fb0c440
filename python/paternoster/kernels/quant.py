"""Weights kept in a GGUF block-quantized format, and their dequantization.

Formats (ggml's ``ggml-common.h``; the GGUF specification), quantized along
the input features in blocks of 32 values, one block a row of bytes:

- ``q8_0``: ``{float16 d; int8 q[32]}`` (34 bytes), value ``d * q``
- ``q4_0``: ``{float16 d; uint8 q[16]}`` (18 bytes), value ``d * (nibble - 8)``
- ``q4_1``: ``{float16 d; float16 m; uint8 q[16]}`` (20 bytes), value
  ``d * nibble + m``
- ``q5_0`` (22 bytes), ``q5_1`` (24): as ``q4_0`` / ``q4_1`` with a fifth bit
  per value in ``uint8 qh[4]`` (value ``d * (q - 16)`` / ``d * q + m``)
- ``iq4_nl`` (18 bytes): ``d * kvalues_iq4nl[nibble]``; ``mxfp4`` (17 bytes,
  an E8M0 scale and 16 bytes of E2M1 nibbles)

where byte ``j`` of ``q`` holds element ``j`` in its low nibble and element
``j + 16`` in its high nibble; and in blocks of 256 values (the K-quants):
``q4_k`` (144 bytes), ``q5_k`` (176), ``q6_k`` (210), ``iq4_xs`` (136), with a
scale per run of 32 (16 for ``q6_k``) values (``core/src/quant_formats.h``
spells them out). The CPU kernels compute with these bytes directly
(:func:`paternoster.kernels.linear`). :func:`dequantize_torch` is written from
the format description for ``q8_0``/``q4_0``/``q4_1`` and runs on any device;
the other formats dequantize on the CPU with the ``gguf`` package's reference
(:mod:`gguf.quants`), used where no kernel takes them (CUDA dequantizes at
load).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Values per quantization block of the 32-value formats.
BLOCK = 32
#: Bytes per block of each quantized format.
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18,
               "mxfp4": 17, "q4_k": 144, "q5_k": 176, "q6_k": 210, "iq4_xs": 136}
#: Values per block of each quantized format (32, or 256 for the K-quants).
BLOCK_VALUES = {f: 256 if f in ("q4_k", "q5_k", "q6_k", "iq4_xs") else BLOCK
                for f in BLOCK_BYTES}
#: The formats :class:`QuantizedWeight` holds.
QUANT_FORMATS = tuple(BLOCK_BYTES)
#: The formats :func:`dequantize_torch` computes in torch (any device).
TORCH_FORMATS = ("q8_0", "q4_0", "q4_1")


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear layer's weight ``[out_features, in_features]`` kept quantized.

    Attributes:
        data: uint8 ``[out_features, in_features // block values * block
            bytes]``, contiguous: each row the GGUF blocks of one output feature.
        format: one of :data:`QUANT_FORMATS`.
        in_features: K, a multiple of the format's block (:data:`BLOCK_VALUES`).
        mapped: ``data`` views a memory-mapped file (a GGUF file served as it
            lies): the huge-page arena leaves it there rather than copy it
            (:mod:`paternoster.model.huge_pages`).

    Raises:
        ValueError: unknown format, ``in_features`` not a positive multiple of
            the block, or ``data`` not a contiguous uint8 matrix of the
            matching width.
    """

    data: torch.Tensor
    format: str
    in_features: int
    mapped: bool = False

    def __post_init__(self) -> None:
        if self.format not in BLOCK_BYTES:
            raise ValueError(f"format must be one of {QUANT_FORMATS}, got {self.format!r}")
        block = BLOCK_VALUES[self.format]
        if self.in_features <= 0 or self.in_features % block:
            raise ValueError(f"in_features must be a positive multiple of {block} for "
                             f"{self.format}, got {self.in_features}")
        width = self.in_features // block * BLOCK_BYTES[self.format]
        if (self.data.dtype != torch.uint8 or self.data.dim() != 2
                or self.data.shape[1] != width or not self.data.is_contiguous()):
            raise ValueError(f"data must be a contiguous uint8 [out_features, {width}] "
                             f"tensor for {self.format} with in_features={self.in_features}, "
                             f"got {self.data.dtype} {tuple(self.data.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        """The logical ``(out_features, in_features)``."""
        return (self.data.shape[0], self.in_features)

    @property
    def device(self) -> torch.device:
        """Where the bytes are."""
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized data."""
        return self.data.numel()

    def rows(self, start: int, count: int) -> QuantizedWeight:
        """Rows ``[start, start + count)`` as a new weight (a copy)."""
        return QuantizedWeight(self.data[start:start + count].contiguous(), self.format,
                               self.in_features)  # a copy: no longer the file's bytes

    def __getitem__(self, rows: slice) -> QuantizedWeight:
        """Rows ``weight[a:b]`` as a weight viewing the same bytes (rows are
        contiguous, so no copy), as a dense tensor's row slice: an MoE layer's
        expert ``e`` out of its stacked experts.

        Raises:
            TypeError: anything but a row slice with step 1.
        """
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"a QuantizedWeight takes row slices with step 1, got {rows!r}")
        return QuantizedWeight(self.data[rows], self.format, self.in_features, self.mapped)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values, ``[out_features, in_features]`` in ``dtype``
        (:func:`dequantize_torch`)."""
        return dequantize_torch(self.data, self.format, self.in_features).to(dtype)


@dataclass(frozen=True)
class WeightParts:
    """A weight ``[out_features, in_features]`` kept as row blocks stored
    apart, each a :class:`QuantizedWeight` in its own format: a fused
    projection (q/k/v, gate/up) whose parts a GGUF file holds as separate
    tensors, used where they lie (no copy out of the file's mapping) and in
    whatever types they have (Q4_K_M stores some v projections as Q6_K). The
    CPU kernels compute every part's columns from its own bytes
    (``linear_parts`` in ``paternoster/linear.h``).

    Attributes:
        parts: the row blocks, top to bottom.

    Raises:
        ValueError: no parts, or parts with different ``in_features`` or devices.
    """

    parts: tuple[QuantizedWeight, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("WeightParts needs at least one part")
        first = self.parts[0]
        if any(p.in_features != first.in_features or p.device != first.device
               for p in self.parts):
            raise ValueError("WeightParts: all parts need one in_features and device, got "
                             f"{[(p.in_features, str(p.device)) for p in self.parts]}")

    @property
    def shape(self) -> tuple[int, int]:
        """The logical ``(out_features, in_features)``."""
        return (sum(p.shape[0] for p in self.parts), self.parts[0].in_features)

    @property
    def in_features(self) -> int:
        """K."""
        return self.parts[0].in_features

    @property
    def device(self) -> torch.device:
        """Where the bytes are."""
        return self.parts[0].device

    @property
    def nbytes(self) -> int:
        """Bytes of all parts."""
        return sum(p.nbytes for p in self.parts)

    @property
    def format(self) -> str:
        """The parts' formats joined by ``+`` in row order, e.g. ``q4_k+q4_k+q6_k``."""
        return "+".join(p.format for p in self.parts)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values, ``[out_features, in_features]`` in ``dtype``."""
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def __getitem__(self, rows: slice) -> QuantizedWeight | WeightParts:
        """Rows ``weight[a:b]`` viewing the same bytes: one part's rows as a
        :class:`QuantizedWeight`, rows across parts as :class:`WeightParts`
        (an MoE layer's expert ``e`` out of its stacked experts).

        Raises:
            TypeError: anything but a row slice with step 1.
            ValueError: an empty range.
        """
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"WeightParts takes row slices with step 1, got {rows!r}")
        start, stop, _ = rows.indices(self.shape[0])
        picked, at = [], 0
        for p in self.parts:
            n = p.shape[0]
            lo, hi = max(start, at), min(stop, at + n)
            if lo < hi:
                picked.append(p[lo - at:hi - at])
            at += n
        if not picked:
            raise ValueError(f"rows {rows!r} of a {self.shape[0]}-row weight are empty")
        return picked[0] if len(picked) == 1 else WeightParts(tuple(picked))


def dequantize_torch(data: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    """Dequantization of GGUF blocks to float32, on ``data``'s device: in
    torch for :data:`TORCH_FORMATS`; the other formats by the core's decoder
    on the CPU, or elsewhere by the ``gguf`` package's numpy reference, the
    result moved back.

    Args:
        data: uint8 ``[rows, in_features // block values * BLOCK_BYTES[fmt]]``.
        fmt: one of :data:`QUANT_FORMATS`.
        in_features: values per row, a multiple of the block (:data:`BLOCK_VALUES`).
    Returns:
        float32 ``[rows, in_features]``.
    Raises:
        ValueError: unknown ``fmt``.
    """
    if fmt not in BLOCK_BYTES:
        raise ValueError(f"format must be one of {QUANT_FORMATS}, got {fmt!r}")
    if fmt not in TORCH_FORMATS:
        if data.device.type == "cpu":  # the core's decoder (tests hold it to gguf-py's)
            from paternoster import _core

            out = torch.empty(data.shape[0], in_features)
            _core._dequantize_rows_ptr(out.data_ptr(), data.contiguous().data_ptr(),
                                       getattr(_core.WeightFormat, fmt), data.shape[0],
                                       in_features)
            return out
        from gguf import GGMLQuantizationType, quants

        values = quants.dequantize(data.cpu().numpy(), GGMLQuantizationType[fmt.upper()])
        return torch.from_numpy(values.astype("float32", copy=False)).to(data.device)
    rows = data.shape[0]
    blocks = data.reshape(rows, in_features // BLOCK, BLOCK_BYTES[fmt])
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, nb, 1]
    if fmt == "q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (d * q).reshape(rows, in_features)
    qs = blocks[..., 4:] if fmt == "q4_1" else blocks[..., 2:]
    nibbles = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # elements j, then j + 16
    if fmt == "q4_0":
        return (d * (nibbles - 8)).reshape(rows, in_features)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (d * nibbles + m).reshape(rows, in_features)

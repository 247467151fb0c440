"""Widen a mixture-of-experts GGUF file to more experts by tiling its
experts' blocks, for files too large to make from a random HF checkpoint on
this disk.

Qwen3-30B-A3B's BF16 intermediate is 61 GB. So :mod:`make_gguf` builds the
model at its real shapes with 16 experts per layer instead of 128, runs
llama.cpp's converter and ``llama-quantize`` on it, and widens the quantized
file here. Every tensor type is then the one ``llama-quantize`` chose, every
metadata key the one the converter wrote, and the expert matrices have their
real shapes. Only two things change:

- each ``*_exps`` tensor (``[E, rows, K]`` weights, ``[E, rows]`` biases) is
  repeated along E up to the new count (expert e holds the blocks of expert
  ``e % E``);
- the router (``ffn_gate_inp``, float32 ``[E, H]``, and its bias ``[E]``
  where it has one) gets fresh random values, N(0, 0.02^2) like HF's init,
  so tokens spread over all the experts rather than only over copies of the
  first E.

``{arch}.expert_count`` is set to the new count. Speed and memory depend on
the shapes and the types, not on the values, so the widened file measures
what the published one would.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def expand_experts(src: Path, dst: Path, experts: int, seed: int = 0) -> Path:
    """Write ``dst``: ``src`` with ``experts`` experts per layer.

    Args:
        src: a GGUF file with ``{arch}.expert_count`` = E.
        dst: the file to write (through ``dst.tmp``, renamed when complete).
        experts: the new count, a multiple of E.
        seed: for the router's new rows.
    Returns:
        ``dst``.
    Raises:
        ValueError: ``src`` has no expert count, or ``experts`` is not a
            multiple of it.
    """
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    key = f"{arch}.expert_count"
    if key not in reader.fields:
        raise ValueError(f"{src}: no {key} (not a mixture-of-experts file)")
    have = int(reader.fields[key].contents())
    if experts % have:
        raise ValueError(f"experts must be a multiple of {have} ({src}), got {experts}")
    reps = experts // have
    rng = np.random.default_rng(seed)
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = experts if field.name == key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)

    def per_expert(t) -> bool:
        return "_exps." in t.name or ".ffn_gate_inp." in t.name or ".exp_probs_b." in t.name

    def widened(t) -> np.ndarray:
        if "_exps." in t.name or ".exp_probs_b." in t.name:  # (the selection bias: per expert)
            return np.concatenate([t.data] * reps, axis=0)
        if ".ffn_gate_inp." in t.name:
            shape = (experts, *t.data.shape[1:])
            return rng.normal(0.0, 0.02, size=shape).astype(t.data.dtype)
        return t.data

    for t in reader.tensors:
        shape = list(t.data.shape)
        if per_expert(t):
            shape[0] = experts
        nbytes = t.data.nbytes // t.data.shape[0] * shape[0]
        writer.add_tensor_info(t.name, shape, t.data.dtype, nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(widened(t))
    writer.close()
    tmp.replace(dst)
    return dst

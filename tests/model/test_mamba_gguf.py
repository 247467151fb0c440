"""Granite 4.0-H (with and without experts) and Nemotron-H / Nemotron 3
GGUF files as llama.cpp's converter writes them
(tests/model/gguf_writer_mamba.py: ``-exp(A_log)``, ``[H, 1]`` and
``[G, I / G]`` shapes, per-layer KV head and MLP-width keys, split and
stacked experts, permuted q/k rows) against HF's forward on the same
checkpoint: float32 logits over a chunked prefill and one-token decode
steps."""

from __future__ import annotations

import pytest
import torch

from .gguf_writer_mamba import write_mamba_gguf
from .hybrid_checks import file_logits_match_hf
from .test_gguf import _runner

CASES = {"granite-moe": "granitehybrid", "granite-dense": "granitehybrid",
         "nemotron_h": "nemotron_h", "nemotron_3": "nemotron_h_moe"}


def _hf(case: str):
    if case.startswith("granite"):
        from .test_granite_hybrid import _build

        return _build("dense" if case == "granite-dense" else "moe")
    from .test_nemotron_h import _build

    return _build(case)


@pytest.mark.parametrize("case", list(CASES))
def test_converter_layout_file_matches_hf(tmp_path, case):
    torch.manual_seed(list(CASES).index(case) + 150)
    hf = _hf(case).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if param.dim() >= 2 and "conv1d" not in name:
                param.normal_(0.0, 0.08)
            elif name.endswith(("norm.weight", "norm_f.weight")):
                param.uniform_(0.5, 1.5)
            elif name.endswith(("dt_bias", ".D")):
                param.uniform_(-0.5, 1.0)
        for name, buf in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.uniform_(-0.2, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / f"{case}.gguf"
    write_mamba_gguf(tmp_path / "hf", path, CASES[case])
    runner = _runner(path)
    assert type(runner.model).__name__ == type(hf).__name__
    assert runner.model.layer_types == list(hf.config.layers_block_type)
    file_logits_match_hf(runner, hf)

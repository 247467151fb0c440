"""bench/gpu_check.py without a GPU: ``--dry-run`` prints the table and writes
the JSON, and its correctness phase (the GPU phase's own code) passes on the
CPU emulation of the CUDA kernels."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paternoster import kernels

from .conftest import load_gpu_check

gc = load_gpu_check()
GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def test_dry_run_writes_the_table(tmp_path):
    """As a user runs it: its own interpreter (the import check looks at sys.modules)."""
    proc = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--dry-run", "--skip", "correctness", "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {row["check"]: row["status"] for row in data["table"]}
    assert checks["imports (no HTTP/ZMQ modules)"] == "PASS"
    assert checks["e2e decode batch 256"] == "n/a"
    # The tensor-parallel phase's own code over gloo: layers, split model vs HF, LLM TP=2.
    tp = {name: s for name, s in checks.items() if name.startswith("TP=2 gloo")}
    assert len(tp) == 6 and set(tp.values()) == {"PASS"}, tp
    assert "TP=2 gloo: LLM greedy vs TP=1" in tp
    assert proc.stdout.rstrip().splitlines()[-1].startswith("wrote ")
    assert "roofline step" in proc.stdout


@pytest.mark.skipif(not kernels.cuda_emulation_available(),
                    reason="paternoster._cuda_emu not built")
def test_correctness_phase_passes_on_the_emulation(monkeypatch):
    long = dataclasses.replace(gc.CASES[2], ctx_lens=(9000, 700))  # the 40k case, shorter
    monkeypatch.setattr(gc, "CASES", (gc.CASES[0], long, gc.CASES[9]))
    report = gc.Report()
    gc.phase_correctness(report, gc.Clock(time.time() + 600), device="cpu",
                         ops=kernels.emulated_cuda_backend())
    results = report.data["correctness"]
    assert all(r["ok"] for r in results.values()), results
    assert "cuda graph replay" not in results  # not emulated
    assert any(name.startswith("model path") for name in results)
    assert report.rows[0][3] == "PASS" and "CPU emulation" in report.rows[0][0]

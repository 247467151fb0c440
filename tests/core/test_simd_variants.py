"""``PATERNOSTER_CPU_ISA``: a variant this CPU runs is applied and said in
the start-up log line; an unknown name is not silently ignored but warned
about, naming the accepted values. Each case runs a fresh interpreter, since
the core reads the variable once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paternoster import _core

PROBE = ("import json; from paternoster import _core; "
         "from paternoster.kernels.cpu import simd_variants; "
         "print(json.dumps([_core.attention_isa(), *simd_variants()]))")


def _run(isa: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "PATERNOSTER_CPU_ISA"}
    if isa is not None:
        env["PATERNOSTER_CPU_ISA"] = isa
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif("baseline" == _core.attention_isa(), reason="no SIMD variant to force")
def test_a_variant_this_cpu_runs_is_applied_without_a_warning():
    attention, text, warning = _run("baseline")
    assert attention == "baseline" and warning is None
    assert text.startswith("attention baseline, linear ")


def test_an_empty_value_means_unset():
    assert _run("") == _run(None) and _run("")[2] is None


@pytest.mark.parametrize("isa", ["bogus", "AVX2"])
def test_an_unknown_name_is_warned_about_and_the_best_variant_kept(isa):
    best = _run(None)[0]
    attention, text, warning = _run(isa)
    assert attention == best
    assert warning == (f"PATERNOSTER_CPU_ISA={isa!r} is not a variant (one of avx512, avx2, "
                       f"baseline); ignored, using {text}")

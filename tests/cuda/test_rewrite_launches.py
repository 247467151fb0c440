"""cuda/emu/rewrite_launches.py: triple-chevron launches become calls of the
emulator's launcher, dynamic shared arrays its per-launch buffer, nothing else
changes, and a launch or array the patterns miss is an error instead of a
kernel silently left out of the emulation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "cuda" / "emu" / "rewrite_launches.py"
_spec = importlib.util.spec_from_file_location("rewrite_launches", _PATH)
rw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rw)


def test_template_kernel_launch():
    src = "  paged_decode_kernel<T, D, GMAX><<<grid, kThreads, 0, stream>>>(p);\n"
    assert rw.rewrite(src) == (
        "  ::pn_emu::launch(paged_decode_kernel<T, D, GMAX>, grid, kThreads, 0, stream)(p);\n"
    )


def test_config_with_casts_and_line_breaks_keeps_line_numbers():
    src = ("k<V><<<static_cast<unsigned>(a.n), threads, 0,\n"
           "      stream>>>(x,\n y);\nint after;\n")
    out = rw.rewrite(src)
    assert out.startswith("::pn_emu::launch(k<V>, static_cast<unsigned>(a.n), threads, 0,\n")
    assert out.count("\n") == src.count("\n")
    assert out.endswith("(x,\n y);\nint after;\n")


def test_plain_kernel_and_no_launch():
    assert rw.rewrite("f<<<1, 32>>>(a);") == "::pn_emu::launch(f, 1, 32)(a);"
    text = "int x = a << 2; bool b = x > 3;"
    assert rw.rewrite(text) == text


def test_unmatched_launch_is_an_error():
    with pytest.raises(ValueError, match="line 2"):
        rw.rewrite("ok();\n(*table[i])<<<1, 2>>>(x);\n")


def test_every_kernel_source_rewrites(tmp_path):
    for cu in sorted((_PATH.parents[1] / "src").glob("*.cu")):
        out = rw.rewrite(cu.read_text())
        assert "<<<" not in out and "extern __shared__" not in out
        assert out.count("\n") == cu.read_text().count("\n")
    assert rw.main(["x", str(cu), str(tmp_path / "o.cc")]) == 0
    assert (tmp_path / "o.cc").read_text().startswith(f'#line 1 "{cu}"\n')


def test_dynamic_shared_memory_becomes_the_launch_buffer():
    src = ("  extern __shared__ __align__(16) uint32_t smem[];  // bytes\n"
           "  extern __shared__ float red[ ];\n")
    assert rw.rewrite(src) == (
        "  uint32_t* const smem = ::pn_emu::dynamic_shared<uint32_t>();  // bytes\n"
        "  float* const red = ::pn_emu::dynamic_shared<float>();\n")


def test_unmatched_dynamic_shared_memory_is_an_error():
    with pytest.raises(ValueError, match="dynamic shared array on line 2"):
        rw.rewrite("ok();\nextern __shared__ unsigned char raw[64];\n")

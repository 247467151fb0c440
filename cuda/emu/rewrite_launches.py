"""Rewrite CUDA launches for the CPU emulation (cuda/emu/cuda_emu.h).

``kernel<targs><<<grid, block, smem, stream>>>(args)`` becomes
``::pn_emu::launch(kernel<targs>, grid, block, smem, stream)(args)``, and a
dynamic shared memory declaration ``extern __shared__ [__align__(N)] T name[];``
becomes ``T* const name = ::pn_emu::dynamic_shared<T>();`` (the launch's
``smem`` bytes); nothing else changes, so the emulated kernels are the sources
in cuda/src.

Usage: ``python rewrite_launches.py IN.cu OUT.cc`` (fails when IN has a
``<<<`` or an ``extern __shared__`` the patterns do not match, so nothing is
silently left out).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# A kernel name with optional template arguments (no nested <>), then <<<...>>>.
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>", re.S)
# extern __shared__ [__align__(N)] TYPE NAME[];  (TYPE one, possibly qualified, name)
DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:]*)\s+"
    r"([A-Za-z_]\w*)\s*\[\s*\]\s*;")


def rewrite(text: str) -> str:
    """Return ``text`` with every triple-chevron launch and dynamic shared
    memory declaration rewritten.

    Raises:
        ValueError: a ``<<<`` or an ``extern __shared__`` remains after the rewrite.
    """
    out = LAUNCH.sub(lambda m: f"::pn_emu::launch({m.group(1)}, {m.group(2)})", text)
    out = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* const {m.group(2)} = ::pn_emu::dynamic_shared<{m.group(1)}>();",
        out)
    for left, what in ((r"<<<", "a launch"), (r"extern\s+__shared__", "a dynamic shared array")):
        found = re.search(left, out)
        if found:
            line = out[: found.start()].count("\n") + 1
            raise ValueError(f"{what} on line {line} does not match the rewrite pattern")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Path(argv[1]), Path(argv[2])
    text = f'#line 1 "{src}"\n' + rewrite(src.read_text())
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_text() != text:
        dst.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

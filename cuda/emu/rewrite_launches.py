"""Rewrite CUDA launches for the CPU emulation (cuda/emu/cuda_emu.h).

``kernel<targs><<<grid, block, smem, stream>>>(args)`` becomes
``::pn_emu::launch(kernel<targs>, grid, block, smem, stream)(args)``; nothing
else changes, so the emulated kernels are the sources in cuda/src.

Usage: ``python rewrite_launches.py IN.cu OUT.cc`` (fails when IN has a
``<<<`` the pattern does not match, so no launch is silently left out).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# A kernel name with optional template arguments (no nested <>), then <<<...>>>.
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>", re.S)


def rewrite(text: str) -> str:
    """Return ``text`` with every triple-chevron launch rewritten.

    Raises:
        ValueError: a ``<<<`` remains after the rewrite.
    """
    out = LAUNCH.sub(lambda m: f"::pn_emu::launch({m.group(1)}, {m.group(2)})", text)
    if "<<<" in out:
        line = out[: out.index("<<<")].count("\n") + 1
        raise ValueError(f"a launch on line {line} does not match the rewrite pattern")
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

"""The layer contract of pyproject.toml (``[tool.importlinter]``, DESIGN.md
"Layers"): the installed package keeps it, and an upward import (the kernels
importing the model) breaks it, shown on a copy of the package so the tree
under test is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The wheel's package mapping (pyproject.toml [tool.scikit-build.wheel.packages]).
PACKAGES = {"paternoster": "python/paternoster", "paternoster/schedulers": "schedulers",
            "paternoster/bench": "bench"}
# lint-imports on whatever `paternoster` the given sys.path finds first; -S keeps the
# editable install's import hook (a .pth file) out of it.
# No cache: grimp's cache would take the copy's unchanged files for the originals.
RUN_ON_PATH = ("import sys; sys.path[:0] = sys.argv[1:]; sys.argv[1:] = ['--no-cache']; "
               "from importlinter.cli import lint_imports_command; lint_imports_command()")


def lint_imports(*python_path: str) -> subprocess.CompletedProcess:
    """lint-imports with the repository's configuration (exit 0: every contract kept)."""
    if python_path:
        cmd = [sys.executable, "-S", "-c", RUN_ON_PATH, *python_path,
               sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    else:
        cmd = [str(Path(sys.executable).with_name("lint-imports"))]
    env = dict(os.environ, COLUMNS="200")  # rich wraps its report at the terminal width
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_installed_package_keeps_its_layers():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def copy_package(dest: Path) -> Path:
    """The package as the wheel lays it out, under ``dest``."""
    for target, source in PACKAGES.items():
        shutil.copytree(ROOT / source, dest / target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dest


@pytest.mark.parametrize("upward_import", [False, True])
def test_a_kernel_importing_the_model_breaks_the_contract(tmp_path, upward_import):
    root = copy_package(tmp_path)
    if upward_import:
        with open(root / "paternoster/kernels/native.py", "a") as f:
            f.write("\nfrom paternoster.model import llama  # noqa: E402, F401\n")
    proc = lint_imports(str(root))
    output = proc.stdout + proc.stderr
    if upward_import:
        assert proc.returncode == 1, output[-4000:]
        assert "paternoster.kernels is not allowed to import paternoster.model" in output
    else:
        assert proc.returncode == 0, output[-4000:]

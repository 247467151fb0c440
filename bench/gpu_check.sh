#!/bin/sh
# The prepared GPU check (see bench/gpu_check.py): builds the CUDA extension,
# checks the kernels, times them and the end-to-end decode path, compares with
# HF transformers; prints a table and writes $OUT/gpu_check.json. ~8 minutes.
#   bench/gpu_check.sh              on a machine with one NVIDIA GPU
#   bench/gpu_check.sh --dry-run    on a CPU: everything that runs without a GPU
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
exec "$PY" bench/gpu_check.py "$@"

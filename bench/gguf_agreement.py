"""Next-token agreement with llama.cpp on the same GGUF file, teacher-forced.

For each file: ``llama-server`` (built by ``bench/peers.py build``, run with
``--no-repack``: its repacked AMX path crashes on our VMs) gives its top-k
next-token probabilities after every prefix of a real text (one request per
position, ``n_predict`` 1, the prompt cache making each an extension of the
last); Paternoster gives its logits for every position of the same tokens in
one prefill (``ModelRunner``, default mode). Reported per file: top-1
agreement (llama.cpp's argmax = ours), the mean KL divergence
KL(llama.cpp || ours) over llama.cpp's top-k tokens (both renormalized on
them: a truncated KL), and the top-1 agreement on the positions whose
answer is not a near-tie (llama.cpp's top two probabilities at least 0.05
apart), over the positions llama.cpp reports (it holds back, with its
probabilities, a token that ends inside a UTF-8 character): llama.cpp
quantizes activations to 8 bits for every quantized product and keeps an
F16 KV cache, so near-ties flip between any two implementations.

    .venv/bin/python bench/gguf_agreement.py FILE.gguf [FILE.gguf ...] --tokens 512

The text is this repository's README (real English and code, not chosen for
the model); the tokens are ours (the file's tokenizer), sent to llama-server
as token ids, so both read the same sequence.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import llamacpp  # noqa: E402
import peer_servers  # noqa: E402


def text_tokens(model: Path, n: int) -> list[int]:
    """The first ``n`` tokens of README.md under the file's tokenizer (BOS first
    when the tokenizer adds one)."""
    from paternoster.model.loader import load_tokenizer

    tok = load_tokenizer(model)
    ids = tok(REPO.joinpath("README.md").read_text())["input_ids"]
    if len(ids) < n:
        raise ValueError(f"README.md holds {len(ids)} tokens, fewer than --tokens {n}")
    return ids[:n]


def llamacpp_top(url: str, tokens: list[int], k: int) -> list[dict[int, float] | None]:
    """llama.cpp's top-``k`` next-token probabilities after each prefix
    ``tokens[:i + 1]`` (i = 0 .. len - 2); None where its argmax ends inside
    a UTF-8 character: llama-server holds such a token back and, once the
    character completes, reports the probabilities of the tokens after it
    only (checked: the held token's own entry is dropped)."""
    out: list[dict[int, float] | None] = []
    for i in range(1, len(tokens)):
        body = {"prompt": tokens[:i], "n_predict": 1, "n_probs": k, "temperature": 0,
                "cache_prompt": True, "post_sampling_probs": False,
                "ignore_eos": True}  # an end-of-generation argmax reports its probabilities
        req = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        probs = reply.get("completion_probabilities")
        if not probs:
            out.append(None)
            continue
        out.append({int(t["id"]): math.exp(t["logprob"]) for t in probs[0]["top_logprobs"]})
    return out


def our_logits(model: Path, tokens: list[int], threads: int, dtype: str = "auto"):
    """float32 logits ``[len - 1, V]`` for positions 0 .. len - 2, one prefill."""
    import numpy as np
    import torch

    from paternoster import kernels
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    kernels.set_num_threads(threads)
    torch.set_num_threads(threads)
    n, bs = len(tokens), 16
    blocks = n // bs + 1
    probe = ModelRunner(ModelConfig(model=str(model), dtype=dtype),
                        CacheConfig(block_size=bs, num_kv_blocks=4))
    groups = probe.kv_layout.num_groups  # e.g. sliding-window and full layers
    del probe
    runner = ModelRunner(ModelConfig(model=str(model), dtype=dtype),
                         CacheConfig(block_size=bs, num_kv_blocks=groups * blocks + 2))
    # one sequence, one prefill; KV cache group g holds blocks g * blocks ..
    tables = [np.arange(g * blocks, (g + 1) * blocks, dtype=np.int32)[None]
              for g in range(groups)]
    slots = [np.arange(n, dtype=np.int64) + g * blocks * bs for g in range(groups)]
    batch = {
        "input_ids": np.asarray(tokens, np.int64),
        "positions": np.arange(n, dtype=np.int64),
        "slot_mapping": slots[0],
        "block_tables": tables[0],
        "seq_lens": np.asarray([n], np.int32),
        "query_start_loc": np.asarray([0, n], np.int32),
        "logits_indices": np.arange(n, dtype=np.int64),
    }
    if groups > 1:
        batch["group_slot_mapping"] = np.stack(slots[1:])
        batch["group_block_tables"] = np.stack(tables[1:])
    return runner.compute_logits(batch)[:-1].float()


def agreement(theirs: list[dict[int, float] | None], ours,
              clear: float = 0.05) -> tuple[float, float, float, int]:
    """(top-1 agreement, mean truncated KL(theirs || ours), top-1 agreement
    where llama.cpp's top-2 probabilities differ by at least ``clear``, how
    many such positions), over the positions llama.cpp reported (not None)."""
    import torch

    hits, kls, clear_hits, clear_n = 0, [], 0, 0
    logp = torch.log_softmax(ours.double(), dim=-1)
    for i, top in enumerate(theirs):
        if top is None:
            continue
        ids = list(top)
        p = torch.tensor([top[t] for t in ids], dtype=torch.float64)
        p = p / p.sum()
        q = logp[i, ids].exp()
        q = q / q.sum()
        kls.append(float((p * (p.log() - q.log())).sum()))
        hit = int(max(top, key=top.get) == int(logp[i].argmax()))
        hits += hit
        first, second = sorted(top.values(), reverse=True)[:2]
        if first - second >= clear:
            clear_hits, clear_n = clear_hits + hit, clear_n + 1
    return hits / len(kls), sum(kls) / len(kls), clear_hits / max(clear_n, 1), clear_n


def main(argv: list[str] | None = None) -> int:
    """Print one table row per file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--tokens", type=int, default=512, help="positions compared")
    ap.add_argument("--top", type=int, default=20, help="llama.cpp's top-k per position")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto",
                    help="our activations: auto (bfloat16) or float32 (llama.cpp's)")
    args = ap.parse_args(argv)
    print("| file | types | positions | top-1 agreement | mean KL (top-k) | "
          "top-1 agreement where llama.cpp's top-2 gap >= 0.05 (positions) |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.files:
        from gguf import GGUFReader

        types = sorted({t.tensor_type.name for t in GGUFReader(str(path)).tensors} - {"F32"})
        tokens = text_tokens(path, args.tokens + 1)
        port = peer_servers.free_port()
        cmd = llamacpp.server_command(path, port, args.threads, 1, len(tokens) + 64,
                                      extra=["--no-repack"])
        log = Path("/tmp") / f"agreement-{path.stem}.log"
        with peer_servers.running_server(cmd, port, log, 300) as url:
            theirs = llamacpp_top(url, tokens, args.top)
        ours = our_logits(path, tokens, args.threads, args.dtype)
        top1, kl, clear, clear_n = agreement(theirs, ours)
        compared = sum(top is not None for top in theirs)
        print(f"| {path.name} | {', '.join(types)} | {compared} | {100 * top1:.1f} % | "
              f"{kl:.4f} | {100 * clear:.1f} % ({clear_n}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a decode step's time goes: a per-op profile of steady-state decode steps.

For each batch size ``B``: ``B`` requests of ``--prompt-len`` random tokens are
added to one :class:`~paternoster.engine.core.EngineCore` and run past their
prefill; then ``--steps`` decode steps run under ``torch.profiler``. Each
kernel call of :mod:`paternoster.kernels` and each stage of the step
(schedule, batch build, forward, sampling, update) and the core's decoder
stack (one C++ call for all layers of the steps it takes; its kernels are not
split: ``--python-layers`` runs those steps through the Python layers, which
gives the same bits, to see them) is wrapped in a ``record_function`` range
for the run (the wrapping is done here, by
replacing the module attributes the model and engine call, so the code under
test is unchanged); matrix multiplies are grouped by weight shape
(``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``). Prints, per batch, the
milliseconds per step of each row and its share of the step, and the memory
limit: bytes of weights and KV read per step divided by the machine's
measured read bandwidth (:func:`memory_bandwidth`; the STREAM-like copy is
printed too), and, with ``--rounds N``, the step against the limit in N
interleaved pairs (:mod:`paternoster.bench.memory_limit`: a few steps, then
one bandwidth sample, so each ratio is taken at one moment of a VM whose
bandwidth drifts).
Usage::

    .venv/bin/python bench/step_profile.py [--batches 1,8,64] [--threads 2] [--steps 20]
        [--model path/to/model.gguf] [--python-layers] [--rounds 15]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch

#: The kernel functions wrapped in a profiler range (module paternoster.kernels).
KERNEL_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding",
              "paged_attention", "reshape_and_cache", "linear")


def memory_bandwidth(threads: int, size_mb: int = 512,
                     repeats: int = 5) -> tuple[float, float]:
    """Bytes per second of a large copy (STREAM "copy": read + write counted)
    and of a large read (a sum: what a decode step does with its weights).

    Args:
        threads: torch threads.
        size_mb: array size in MiB (far above the last-level cache).
        repeats: runs timed; the fastest counts (as STREAM reports).
    Returns:
        (copy bytes/s counting reads and writes, read bytes/s).
    """
    from paternoster.bench.memory_limit import BandwidthProbe

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        probe = BandwidthProbe(size_mb)
        probe.sample()  # warm-up
        samples = [probe.sample() for _ in range(repeats)]
        return max(c for _, c in samples), max(r for r, _ in samples)
    finally:
        torch.set_num_threads(old)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a decode step reads: every matrix once, dense or
    quantized (the embedding table only as the tied LM head; an untied
    table's few looked-up rows are left out)."""
    tables = {id(model.embed_tokens)} - {id(model.lm_head)}
    seen: set[int] = set()
    total = 0
    weights = [p for _, p in model.named_parameters()] + model.quantized_weights()
    for w in weights:
        if id(w) in seen or id(w) in tables:
            continue
        seen.add(id(w))
        total += w.nbytes if hasattr(w, "format") else w.numel() * w.element_size()
    return total


@contextlib.contextmanager
def _ranges(engine) -> Iterator[None]:
    """Wrap kernels and step stages in ``record_function`` ranges, undone on exit."""
    from paternoster import kernels

    patched: list[tuple[object, str, object]] = []

    def wrap(owner: object, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def ranged(*a, **kw):
            with torch.profiler.record_function(label):
                return fn(*a, **kw)

        patched.append((owner, attr, fn))
        setattr(owner, attr, ranged)

    for op in KERNEL_OPS:
        if hasattr(kernels, op):
            wrap(kernels, op, f"kernel::{op}")
    wrap(engine.scheduler, "schedule", "stage::schedule")
    wrap(engine, "_build_input", "stage::build")
    wrap(engine.runner, "compute_logits", "stage::forward")
    wrap(engine.runner.sampler, "sample_step", "stage::sample")
    wrap(kernels.CpuDecoderStack, "forward", "kernel::decoder_stack (all layers, one call)")
    wrap(engine.scheduler, "update_from_output", "stage::update")
    try:
        yield
    finally:
        for owner, attr, fn in reversed(patched):
            setattr(owner, attr, fn)


def _shape_names(model) -> dict[tuple[int, int], str]:
    """(out, in) of each weight matrix -> its projection name."""
    names = {}
    found: list[tuple[str, object]] = [("lm_head", model.lm_head)]
    for layer in model.layers:  # each kind of token mixer and feed-forward block
        mixer = getattr(layer, "self_attn", None) or getattr(layer, "mixer", None)
        if hasattr(mixer, "matrices"):
            labels = ("qkv", "o") if hasattr(mixer, "qkv_weight") else ("in_proj", "out_proj")
            found += zip(labels, mixer.matrices(), strict=True)
        mlp = getattr(layer, "mlp", None) or getattr(layer, "shared_mlp", None)
        if mlp is not None:
            found += [("gate_up", mlp.gate_up_weight), ("down", mlp.down_weight)]
    for label, obj in found:
        shape = getattr(obj, "logical_shape", None) or tuple(obj.shape)
        names.setdefault(tuple(shape), label)
    return names


def _matmul_label(event, names: dict[tuple[int, int], str]) -> str | None:
    if event.name == "aten::embedding":
        return "embedding"
    if event.name != "aten::linear":  # (its mm/addmm children are inside it)
        return None
    for shape in event.input_shapes or ():
        if len(shape) == 2 and tuple(shape) in names:
            return f"matmul::{names[tuple(shape)]}"
    return "matmul::other"


def profile_batch(engine, batch: int, args,
                  rng: random.Random) -> tuple[dict, float, float]:
    """Time, then profile, ``args.steps`` decode steps at ``batch``.

    Returns:
        (ms per step by profiled range, median step ms under the profiler,
        median step ms without it: the figure compared with the memory limit).
    """
    from paternoster import SamplingParams
    from paternoster.engine.messages import EngineCoreRequest

    vocab = engine.runner.vocab_size
    max_tokens = args.steps * 4 + args.rounds * args.round_steps + 64
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"p{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(EngineCoreRequest(rid, [rng.randrange(3, vocab)
                                                  for _ in range(args.prompt_len)], params))
    counts = dict.fromkeys(ids, 0)
    while not all(counts.values()):  # prefill
        for o in engine.step():
            counts[o.request_id] += len(o.new_token_ids)
    for _ in range(args.warmup):
        engine.step()
    plain = []
    for _ in range(args.steps):
        t = time.perf_counter()
        engine.step()
        plain.append(time.perf_counter() - t)
    names = _shape_names(engine.runner.model)
    step_times = []
    with _ranges(engine), torch.profiler.profile(record_shapes=True) as prof:
        for _ in range(args.steps):
            t = time.perf_counter()
            engine.step()
            step_times.append(time.perf_counter() - t)
    if args.rounds:
        from paternoster.bench.memory_limit import BandwidthProbe, paired_rounds, summarize

        done = [args.warmup + 2 * args.steps]

        def one_step() -> None:
            engine.step()
            done[0] += 1

        def need() -> float:
            return args.weight_bytes + batch * ((args.prompt_len + done[0]) * args.kv_per_token
                                                + args.state_per_seq)

        probe = BandwidthProbe()
        print(f"\n## batch {batch}, interleaved\n"
              + summarize(paired_rounds(one_step, need, probe, args.rounds, args.round_steps)))
        del probe
    engine.abort_requests(ids)
    rows: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        label = ev.name if "::" in ev.name and ev.name.split("::")[0] in (
            "kernel", "stage") else _matmul_label(ev, names)
        if label is not None:
            rows[label] += ev.cpu_time_total / 1e3 / args.steps  # us -> ms per step
    return (dict(rows), 1e3 * statistics.median(step_times),
            1e3 * statistics.median(plain))


def _print_table(batch: int, rows: dict[str, float], step_ms: float, plain_ms: float,
                 limit_ms: float) -> None:
    print(f"\n## batch {batch}: step {plain_ms:.2f} ms (median, not profiled), memory limit "
          f"{limit_ms:.2f} ms ({plain_ms / limit_ms:.2f}x); profiled {step_ms:.2f} ms")
    print("| range | ms/step | % of step |\n|---|---:|---:|")
    for label, ms in sorted(rows.items(), key=lambda kv: (kv[0].split("::")[0] != "stage",
                                                            -kv[1])):
        shown = f"of which (torch) {label}" if label.startswith("matmul::") and \
            "kernel::linear" in rows else label
        print(f"| {shown} | {ms:.3f} | {100 * ms / step_ms:.1f} |")
    forward = rows.get("stage::forward", 0.0)
    # torch's matmuls (matmul::*) run inside kernel::linear when it is wrapped:
    # count them once.
    nested = "kernel::linear" in rows
    inner = sum(v for k, v in rows.items()
                if not k.startswith("stage::") and not (nested and k.startswith("matmul::")))
    print(f"| forward outside kernels and matmuls (Python, embedding, indexing) | "
          f"{forward - inner:.3f} | {100 * (forward - inner) / step_ms:.1f} |")


def main(argv: list[str] | None = None, build: Callable | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir or .gguf (default: embedded)")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--load-format", default="auto",
                    help="'dummy': random weights at the config's shapes (no checkpoint)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--python-layers", action="store_true",
                    help="run every step through the Python layers (no decoder stack)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="also time the step against the limit in N interleaved pairs")
    ap.add_argument("--round-steps", type=int, default=5, help="decode steps per round")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]

    from paternoster import LLM
    from paternoster.bench.roofline import machine_info

    kwargs = dict(dtype=args.dtype, max_num_seqs=max(batches), num_threads=args.threads,
                  max_model_len=2048, load_format=args.load_format)
    llm = LLM(args.model, **kwargs) if args.model else LLM(**kwargs)
    engine = llm.engine
    if args.python_layers:  # (a model without the core's stack keeps its own layers)
        engine.runner.model.fused_steps = False
    copy_bw, bandwidth = memory_bandwidth(args.threads)
    model = engine.runner.model
    wbytes = weight_bytes(model)
    runner = engine.runner
    layout = runner.kv_layout  # attention layers only: recurrent and cacheless ones hold no KV
    attention_layers = sum(1 for g in layout.layer_groups
                           if g >= 0 and g != layout.recurrent_group)
    kv_per_token = (2 * attention_layers * runner.num_kv_heads * runner.head_dim
                    * runner.dtype.itemsize)
    # A recurrent layer reads its state once a step per sequence.
    state_per_seq = runner.state_bytes() // max(runner.num_state_slots, 1)
    args.weight_bytes, args.kv_per_token, args.state_per_seq = wbytes, kv_per_token, state_per_seq
    print(f"{machine_info()}")
    print(f"memory bandwidth ({args.threads} threads): copy {copy_bw / 1e9:.1f} GB/s, "
          f"read {bandwidth / 1e9:.1f} GB/s (the limit uses read); "
          f"weights read per step {wbytes / 1e6:.1f} MB; KV {kv_per_token} B/token; "
          f"recurrent state {state_per_seq} B/sequence")
    rng = random.Random(args.seed)
    for b in batches:
        rows, step_ms, plain_ms = profile_batch(engine, b, args, rng)
        # The VM's bandwidth drifts: measured again next to each batch's steps.
        _, bandwidth = memory_bandwidth(args.threads)
        context = args.prompt_len + args.warmup + args.steps + args.steps // 2
        limit_ms = 1e3 * (wbytes + b * (context * kv_per_token + state_per_seq)) / bandwidth
        print(f"read bandwidth now {bandwidth / 1e9:.1f} GB/s")
        _print_table(b, rows, step_ms, plain_ms, limit_ms)


if __name__ == "__main__":
    main()

"""Fit the cost model to a serving engine's own steps (its request timeline).

``paternoster simulate --calibrate`` times the model runner alone, back to
back in one process. A server's steps run slower: the frontend, the load
generator and the engine share the cores, and the engine loop does I/O between
steps. This module reads what a running server actually did, from its request
timeline (``paternoster serve --timeline-size N``, ``GET
/debug/timeline?format=snapshot``; schema in :mod:`paternoster.metrics.timeline`),
and fits :class:`~paternoster.scheduling.cost_model.CostModel` to it, so the
simulator can be asked "what would this server do" with the server's own step
times, separating the simulator's queueing model from its step-time input.

What each step computed is rebuilt from the snapshot: a step's rows give the
tokens each request computed, and each request's events give how many of its
tokens were already in the KV cache before that step (its prompt tokens the
prefix cache supplied, plus its earlier spans). A step's time is its span
``end - start`` plus, when the next step continues one of its requests (so the
engine did not idle in between), the gap to the next step's start: the engine
loop's own cost per step, which the clients see in their inter-token gaps.

Steps are left out (and counted) when they cannot be rebuilt exactly: a row of
a request the snapshot no longer holds, of a request that was preempted
(its recompute's prefix-cache hit is not recorded) or that dropped events, of a
request still in its prefill when the snapshot was taken (its cached prefix is
not known yet), or a step whose rows do not add up to its token counts (a
sample rate below 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paternoster.scheduling.cost_model import FIRST_TOKENS_KNEES, CostModel, StepWork


@dataclass(frozen=True)
class TimelineFit:
    """A cost model fitted to a timeline, and how well it fits.

    Attributes:
        cost_model: the fit; its ``step_noise`` is the sd of log(measured /
            modelled) over the steps used.
        r2: coefficient of determination of the fit on the step times.
        num_steps: steps used. num_skipped: steps left out (module docstring).
        median_gap_s: median loop gap added to the steps that had one (s).
        max_prefill_tokens: the most prefill tokens of one step used (tokens):
            steps beyond it are extrapolations.
    """

    cost_model: CostModel
    r2: float
    num_steps: int
    num_skipped: int
    median_gap_s: float
    max_prefill_tokens: int = 0

    def report(self) -> str:
        """One paragraph: the coefficients, R^2, noise and the steps used, and
        a warning when the steps cannot pin the prefill or decode costs (a
        coefficient fitted as 0, or no step with 64 prefill tokens)."""
        m = self.cost_model
        kv_prefill = m.a_kv_prefill if m.a_kv_prefill is not None else m.a_kv
        text = (f"fitted to {self.num_steps} server steps ({self.num_skipped} left out): "
                f"overhead {m.overhead * 1e3:.2f} ms, prefill {m.a_prefill * 1e6:.1f} us/token, "
                f"decode {m.a_decode * 1e6:.1f} us/token, decode KV {m.a_kv * 1e6:.3f} us/key, "
                f"prefill KV {kv_prefill * 1e6:.4f} us/key, {m.a_first_tokens * 1e6:.1f} us more "
                f"for each of a step's first {m.first_tokens} tokens; R^2 {self.r2:.3f}, "
                f"step noise {m.step_noise:.3f}; median loop gap {self.median_gap_s * 1e3:.2f} ms; "
                f"steps of up to {self.max_prefill_tokens} prefill tokens")
        costs = (("prefill", m.a_prefill), ("decode", m.a_decode))
        unpinned = [name for name, v in costs if v <= 0]
        if unpinned or self.max_prefill_tokens < 64:
            why = (f"the {' and '.join(unpinned)} cost per token fitted as 0" if unpinned
                   else f"no step had more than {self.max_prefill_tokens} prefill tokens")
            text += (f"\nwarning: {why}: these steps do not pin the cost model, and predictions "
                     "for longer prompts are extrapolations; record a timeline under the "
                     "load you want to simulate")
        return text


def _computed_before(request: dict) -> dict[int, int] | None:
    """Step index -> tokens of this request in the KV cache before that step,
    for every step with one of its rows; None when it cannot be known
    (preempted, events dropped, prefill unfinished)."""
    if request.get("num_preemptions", 0) or request.get("num_events_dropped", 0):
        return None
    spans = [e for e in request["events"] if e["kind"] in ("prefill", "decode")]
    if not any(e["kind"] == "decode" or e["sampled"] for e in spans):
        return None  # still prefilling: the prefix cache's share is not known yet
    prefilled = sum(e["tokens"] for e in spans if e["kind"] == "prefill")
    computed = request["num_prompt_tokens"] - prefilled  # the prefix cache's hit
    if computed < 0:
        return None
    out: dict[int, int] = {}
    for e in spans:
        if e["kind"] == "prefill":
            out[e["first_step"]] = computed
        else:  # one token per step over first_step..last_step
            for j in range(e["last_step"] - e["first_step"] + 1):
                out[e["first_step"] + j] = computed + j
        computed += e["tokens"]
    return out


def works_from_timeline(snapshot: dict) -> tuple[list[StepWork], list[float], int, list[float]]:
    """Rebuild each step's work and time (:func:`_works`), a malformed
    snapshot reported as such.

    Raises:
        ValueError: not a snapshot, a missing or mistyped field, or a step
            time that is not a finite number.
    """
    try:
        return _works(snapshot)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"not a timeline snapshot: {type(e).__name__}: {e}") from None


def _works(snapshot: dict) -> tuple[list[StepWork], list[float], int, list[float]]:
    """Rebuild each step's work and time from a timeline snapshot.

    Args:
        snapshot: a timeline snapshot (``format=snapshot``; version 1).
    Returns:
        ``(works, seconds, num_skipped, gaps)``: per usable step its
        :class:`StepWork` and time (s), the steps left out, and the loop gaps
        added (s).
    Raises:
        ValueError: not a snapshot (e.g. the Chrome trace format), or an
            unknown version.
    """
    if not isinstance(snapshot, dict) or "steps" not in snapshot or "requests" not in snapshot:
        raise ValueError("not a timeline snapshot: fetch GET /debug/timeline?format=snapshot "
                         "(the default format is a Chrome trace)")
    if snapshot.get("version") != 1:
        raise ValueError(f"timeline snapshot version {snapshot.get('version')!r} is not 1")
    prompt = {r["request_id"]: r["num_prompt_tokens"] for r in snapshot["requests"]}
    before = {r["request_id"]: _computed_before(r) for r in snapshot["requests"]}
    steps = sorted(snapshot["steps"], key=lambda s: s["step"])
    works: list[StepWork] = []
    seconds: list[float] = []
    gaps: list[float] = []
    skipped = 0
    for i, s in enumerate(steps):
        rows = s["rows"]
        known = [before.get(rid) for rid, _, _ in rows]
        if (not rows or any(b is None or s["step"] not in b for b in known)
                or sum(n for _, n, _ in rows) != s["prefill_tokens"] + s["decode_tokens"]
                or s["num_preempted"]):  # fmt: skip
            skipped += 1
            continue
        c = np.array([b[s["step"]] for b in known], dtype=np.int64)
        n = np.array([t for _, t, _ in rows], dtype=np.int64)
        p = np.array([prompt[rid] for rid, _, _ in rows], dtype=np.int64)
        t = s["end"] - s["start"]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if nxt is not None and nxt["step"] == s["step"] + 1 and \
                {r[0] for r in nxt["rows"]} & {r[0] for r in rows}:  # fmt: skip
            gap = max(0.0, nxt["start"] - s["end"])
            gaps.append(gap)
            t += gap
        if not math.isfinite(t):
            raise ValueError(f"not a timeline snapshot: step {s['step']} lasts {t!r} s")
        if t <= 0:
            skipped += 1
            continue
        works.append(StepWork.from_arrays(c, n, p))
        seconds.append(t)
    return works, seconds, skipped, gaps


def load_snapshot(source: str) -> dict:
    """A timeline snapshot from a server's base URL (``http://...``: fetched
    from ``GET /debug/timeline?format=snapshot``: engine 0 of a data-parallel
    server), a full ``/debug/timeline`` URL (``...?engine=1`` for another
    engine) or a JSON file.

    Raises:
        ValueError: unreadable file, malformed JSON, or the server could not
            give one (the reason included, e.g. timelines are off), or an
            empty ``source``.
    """
    if not source.strip():
        raise ValueError(f"--fit-timeline needs a server URL or a snapshot file, got {source!r}")
    if source.startswith(("http://", "https://")):
        from paternoster.metrics.trace_cli import TraceFetchError, fetch_timeline

        base, engine = _base_and_engine(source)
        try:
            return fetch_timeline(base, timeout=120.0, engine=engine)
        except TraceFetchError as e:
            raise ValueError(str(e)) from None
    try:
        return json.loads(Path(source).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read a timeline snapshot from {source}: {e}") from None


def _base_and_engine(url: str) -> tuple[str, int]:
    """A server URL's base and ``engine`` query value: a full
    ``.../debug/timeline?engine=1`` URL names another data-parallel engine.

    Raises:
        ValueError: an ``engine`` that is not an integer.
    """
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    path = parts.path.split("/debug/timeline")[0]
    values = parse_qs(parts.query).get("engine", ["0"])
    try:
        engine = int(values[-1])
    except ValueError:
        raise ValueError(f"engine in {url} must be an integer, got {values[-1]!r}") from None
    return f"{parts.scheme}://{parts.netloc}{path}", engine


def fit_timeline(snapshot: dict, source: str = "", split_kv: bool = True) -> TimelineFit:
    """Fit the cost model to a server's steps (:func:`works_from_timeline`,
    then :meth:`CostModel.fit`, choosing the first-tokens knee among
    ``FIRST_TOKENS_KNEES``), with the step noise of the fit.

    Args:
        snapshot: a timeline snapshot.
        source: stored in the model's ``source``.
        split_kv: fit decode and prefill attention apart (see :meth:`CostModel.fit`).
    Raises:
        ValueError: not a snapshot, or fewer than 5 usable steps.
    """
    works, seconds, skipped, gaps = works_from_timeline(snapshot)
    if len(works) < 5:
        raise ValueError(f"only {len(works)} usable steps in the timeline ({skipped} left out); "
                         "record more with --timeline-size and --timeline-sample-rate 1")
    model, r2 = CostModel.fit(works, seconds, source=source or "fitted to a server timeline",
                              split_kv=split_kv, first_tokens=FIRST_TOKENS_KNEES)
    pred = np.array([model.step_time(w) for w in works])
    y = np.asarray(seconds)
    ok = pred > 0
    noise = float(np.std(np.log(y[ok] / pred[ok]))) if ok.any() else 0.0
    model = dataclasses.replace(model, step_noise=noise)
    return TimelineFit(model, r2, len(works), skipped, float(np.median(gaps)) if gaps else 0.0,
                       max(w.prefill_tokens for w in works))

"""The ``slo`` policy's options and per-request targets: parsing and validation.

Targets resolve per request, first match wins: the request's own
``slo_ttft_s`` / ``slo_itl_s`` (HTTP body fields, ``LLM.generate`` arguments),
then the entry of its ``priority`` in ``classes``, then the server-level
``ttft_s`` / ``itl_s``. Every bad option is a ``ValueError`` naming it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paternoster.request import Request
from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel
from paternoster.scheduling.policy import option_text, require_int
from paternoster.scheduling.step_time import StepTimePredictor

#: ``--scheduler-config`` keys of the ``slo`` policy and their defaults.
DEFAULT_OPTIONS: dict[str, Any] = {
    "ttft_s": 2.0,
    "itl_s": 0.2,
    "classes": {},
    "load_shedding": False,
    "margin": 0.05,
    "itl_miss_budget": 0.04,
    "min_chunk_tokens": 16,
    "cost_model": None,
    "adapt": True,
}


def _seconds(value: Any, name: str) -> float:
    """``value`` as seconds: a finite number > 0.

    Raises:
        ValueError: anything else (naming ``name``).
    """
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) \
            and 0 < float(value) < math.inf  # fmt: skip
    except OverflowError:  # an integer past float's range
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a number of seconds > 0, got {option_text(value)}")
    return float(value)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {option_text(value)}")
    return value


@dataclass(frozen=True)
class Targets:
    """A TTFT and an ITL target, seconds."""

    ttft_s: float
    itl_s: float


@dataclass(frozen=True)
class SLOOptions:
    """The ``slo`` policy's validated options.

    Attributes:
        default: the server-level targets (``ttft_s``, ``itl_s``).
        classes: targets per ``priority`` value (a class may set one of the
            two; the other comes from ``default``).
        load_shedding: refuse (HTTP 503) a waiting request that can no longer
            meet its TTFT target instead of running it late.
        margin: fraction of the ITL target a step plan leaves free for the
            step-time model's error, in ``[0, 0.9]``.
        itl_miss_budget: fraction of decode gaps (recent ones) a step may
            push over their ITL target to save a TTFT deadline, in ``[0, 0.5]``
            (0: never).
        min_chunk_tokens: prompt tokens a step computes even when the decodes
            alone use up the ITL target (progress guarantee), >= 1.
        cost_model: the step-time model to start from.
        adapt: correct the model online from measured step times.
    """

    default: Targets
    classes: Mapping[int, Targets]
    load_shedding: bool
    margin: float
    itl_miss_budget: float
    min_chunk_tokens: int
    cost_model: CostModel
    adapt: bool

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SLOOptions:
        """Validate ``options`` (defaults already merged in).

        ``cost_model`` is ``None`` (:data:`DEFAULT_COST_MODEL`, calibrated on the
        project's 2-core CPU), a path to a JSON file written by ``paternoster
        simulate --calibrate``, or a dict of its coefficients.

        Raises:
            ValueError: a bad value; the message names the option.
        """
        default = Targets(_seconds(options["ttft_s"], "ttft_s"),
                          _seconds(options["itl_s"], "itl_s"))  # fmt: skip
        margin = options["margin"]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
                or not 0 <= margin <= 0.9:  # fmt: skip
            raise ValueError(f"margin must be a number in [0, 0.9], got {option_text(margin)}")
        miss = options["itl_miss_budget"]
        if isinstance(miss, bool) or not isinstance(miss, (int, float)) or not 0 <= miss <= 0.5:
            raise ValueError(f"itl_miss_budget must be a number in [0, 0.5], "
                             f"got {option_text(miss)}")
        chunk = require_int(options, "min_chunk_tokens", minimum=1)
        return cls(
            default=default,
            classes=_parse_classes(options["classes"], default),
            load_shedding=_flag(options["load_shedding"], "load_shedding"),
            margin=float(margin),
            itl_miss_budget=float(miss),
            min_chunk_tokens=chunk,
            cost_model=_parse_cost_model(options["cost_model"]),
            adapt=_flag(options["adapt"], "adapt"),
        )

    def targets(self, request: Request) -> Targets:
        """``request``'s targets: its own fields, else its priority class's,
        else the defaults."""
        base = self.classes.get(request.priority, self.default)
        ttft, itl = request.slo_ttft_s, request.slo_itl_s
        if ttft is None and itl is None:
            return base
        return Targets(base.ttft_s if ttft is None else ttft, base.itl_s if itl is None else itl)


def _parse_classes(classes: Any, default: Targets) -> dict[int, Targets]:
    """``{"0": {"ttft_s": 0.5, "itl_s": 0.1}, ...}`` → targets per priority.

    Raises:
        ValueError: not a mapping, a key that is not an integer, an entry that
            is not a mapping, an unknown entry key or a bad value.
    """
    if not isinstance(classes, Mapping):
        raise ValueError(f"classes must be an object of priority -> targets, "
                         f"got {option_text(classes)}")
    out = {}
    for key, entry in classes.items():
        try:
            prio = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"classes keys must be integer priorities, "
                             f"got {option_text(key)}") from None
        if isinstance(key, bool) or (isinstance(key, float) and key != prio):
            raise ValueError(f"classes keys must be integer priorities, got {option_text(key)}")
        if prio in out:
            raise ValueError(f"classes gives priority {prio} twice (key {option_text(key)})")
        at = f"classes[{option_text(key)}]"  # the JSON path, e.g. classes["1"]
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at} must be an object with ttft_s and/or itl_s")
        unknown = set(entry) - {"ttft_s", "itl_s"}
        if unknown:
            raise ValueError(f"{at}: unknown keys {sorted(unknown)}; "
                             "accepted: ['itl_s', 'ttft_s']")  # fmt: skip
        ttft = entry.get("ttft_s", default.ttft_s)
        itl = entry.get("itl_s", default.itl_s)
        out[prio] = Targets(_seconds(ttft, f"{at}.ttft_s"), _seconds(itl, f"{at}.itl_s"))
    return out


def _parse_cost_model(value: Any) -> CostModel:
    """The ``cost_model`` option: ``None``, a JSON file path or a dict.

    One of ``overhead``, ``a_prefill`` and ``a_decode`` must be above 0 (a
    fitter may clamp some to 0): with all three 0 every step is predicted
    free, and the online correction, which only scales terms that are not 0,
    could never learn otherwise.

    Raises:
        ValueError: another type, an unreadable file or bad coefficients.
    """
    if value is None:
        return DEFAULT_COST_MODEL
    model = None
    try:
        if isinstance(value, str):
            model = CostModel.load(value)
        elif isinstance(value, Mapping):
            model = CostModel.from_dict(dict(value))
    except ValueError as e:
        raise ValueError(f"cost_model: {e}") from None
    if model is None:
        raise ValueError(f"cost_model must be null, a JSON file path or an object, "
                         f"got {option_text(value)}")  # fmt: skip
    if max(model.overhead, model.a_prefill, model.a_decode) <= 0:
        raise ValueError("cost_model: overhead, a_prefill and a_decode are all 0: the slo "
                         "scheduler would predict every step free (give at least one > 0)")
    return model


#: (cost model source, ITL target) pairs already warned about in this process
#: (a simulated capacity search builds one scheduler per probe).
_WARNED: set[tuple[str, float]] = set()


def log_plan_basis(slo: SLOOptions, predictor: StepTimePredictor, max_num_seqs: int,
                   log: logging.Logger) -> None:  # fmt: skip
    """Log (INFO) the targets, the step-time model the policy starts from and
    how many decodes (at short contexts) fit the tightest ITL target under
    it; warn, once per model and target, when not even one does."""
    model = slo.cost_model
    itl = min([slo.default.itl_s, *(t.itl_s for t in slo.classes.values())])
    limit = itl * (1.0 - slo.margin)
    n = 0
    while n < max_num_seqs and predictor.decode_time(n + 1, n + 1) <= limit:
        n += 1
    log.info(
        "slo: targets TTFT %g s, ITL %g s%s; step-time model %r (overhead %.1f ms, %.0f µs "
        "a prompt token, %.0f µs a decode row), %s; under it a decode-only step fits the "
        "ITL target with up to %d of the %d request slots decoding (short contexts)",
        slo.default.ttft_s, slo.default.itl_s,
        f" ({itl:g} s in the tightest priority class)" if itl < slo.default.itl_s else "",
        model.source or "(no source given)",
        model.overhead * 1e3, model.a_prefill * 1e6, model.a_decode * 1e6,
        "corrected online from measured steps" if slo.adapt else "fixed (adapt: false)",
        n, max_num_seqs)  # fmt: skip
    if n == 0 and (model.source, itl) not in _WARNED:
        _WARNED.add((model.source, itl))
        log.warning(
            "slo: under its cost model one decode alone takes %.0f ms, over the %g s ITL "
            "target less its %g %% margin: steps are planned over the target until measured "
            "steps correct the model (adapt), for good if they confirm it; raise itl_s or "
            "give a model calibrated on this machine (paternoster simulate --calibrate)",
            predictor.decode_time(1, 1) * 1e3, itl, 100 * slo.margin)  # fmt: skip

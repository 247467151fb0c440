"""Frontend-side request metrics: latencies, token counts and finish reasons.

Measured in the frontend per API request (one HTTP or ZeroMQ request, however
many prompts and choices ``n`` it has: vLLM counts them so) with
``time.monotonic()``, from the moment the frontend hands the request to the
engine client. Inter-token latency is measured per choice (the gaps of each
stream a client reads).

Per-tenant counters (``paternoster:tenant_*``, label ``tenant``) count the
same requests and tokens by the request's tenant (``user`` / ``X-Tenant-Id``
/ the ZeroMQ ``tenant`` field): ``tenant=""`` is the anonymous tenant (no
tenant given, the ``fair`` policy's ``None``), and once ``max_tenants``
distinct named tenants have a label, further ones count under
``tenant="other"``, so a client cannot grow the label set without bound.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from paternoster.engine.messages import EngineCoreOutput

FINISHED_REASONS = ("stop", "length", "abort", "error")

DEFAULT_MAX_TENANTS = 64
"""Distinct named tenants that get a ``tenant`` label of their own."""
ANONYMOUS_TENANT_LABEL = ""
"""The ``tenant`` label of requests without a tenant (the anonymous tenant)."""
OTHER_TENANTS_LABEL = "other"
"""The ``tenant`` label of the tenants beyond the cap."""
# An API request's reason is its choices' worst: an error anywhere is an error.
_PRECEDENCE = ("error", "abort", "length", "stop")

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class RequestMetrics:
    """Counters and histograms over finished engine requests.

    Args:
        registry: where to register.
        max_tenants: distinct named tenants labelled by name in the
            ``paternoster:tenant_*`` counters (first come, first labelled;
            later ones count under ``tenant="other"``; 0: all of them do).
    """

    def __init__(self, registry: CollectorRegistry,
                 max_tenants: int = DEFAULT_MAX_TENANTS) -> None:  # fmt: skip
        if max_tenants < 0:
            raise ValueError(f"max_tenants must be >= 0, got {max_tenants}")
        self.max_tenants = max_tenants
        self._tenant_labels: set[str] = set()
        self.tenant_requests = Counter(
            "paternoster:tenant_requests",
            "Finished API requests by tenant, any finish reason (requests); tenant \"\" is "
            "the anonymous one, \"other\" the tenants beyond --metrics-max-tenants.",
            ["tenant"],
            registry=registry,
        )
        self.tenant_prompt_tokens = Counter(
            "paternoster:tenant_prompt_tokens",
            "Prompt tokens of API requests whose prefill completed, by tenant (tokens).",
            ["tenant"],
            registry=registry,
        )
        self.tenant_generation_tokens = Counter(
            "paternoster:tenant_generation_tokens",
            "Generated tokens delivered to clients, by tenant (tokens).",
            ["tenant"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "paternoster:prompt_tokens",
            "Prompt tokens of API requests whose prefill completed, each prompt once (tokens).",
            registry=registry,
        )
        self.generation_tokens = Counter(
            "paternoster:generation_tokens",
            "Generated tokens delivered to clients (tokens).",
            registry=registry,
        )
        self.request_success = Counter(
            "paternoster:request_success",
            "Finished API requests by finish reason (requests); with several choices, "
            "the first of error, abort, length, stop among them.",
            ["finished_reason"],
            registry=registry,
        )
        for reason in FINISHED_REASONS:
            self.request_success.labels(reason)
        self.ttft = Histogram(
            "paternoster:time_to_first_token_seconds",
            "Seconds from submission to the first generated token of an API request.",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "paternoster:inter_token_latency_seconds",
            "Seconds between consecutive token-bearing outputs of one choice.",
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "paternoster:e2e_request_latency_seconds",
            "Seconds from submission to the end of an API request's last choice (any reason).",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "paternoster:request_queue_time_seconds",
            "Seconds from arrival at the engine to first scheduling.",
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=registry,
        )

    def tenant_label(self, tenant: str | None) -> str:
        """The ``tenant`` label a request of ``tenant`` counts under: ``""``
        for ``None``, the name for the first ``max_tenants`` named tenants
        seen, ``"other"`` for any later one."""
        if tenant is None:
            return ANONYMOUS_TENANT_LABEL
        if tenant in self._tenant_labels:
            return tenant
        if len(self._tenant_labels) < self.max_tenants:
            self._tenant_labels.add(tenant)
            return tenant
        return OTHER_TENANTS_LABEL

    def track(self, num_prompt_tokens: int, tenant: str | None = None) -> RequestTracker:
        """Start timing one API request (now).

        Args:
            num_prompt_tokens: its prompts' tokens, each prompt once.
            tenant: who it is served for (``None``: the anonymous tenant).
        """
        return RequestTracker(self, num_prompt_tokens, tenant=self.tenant_label(tenant))


class RequestTracker:
    """Times one API request (all its choices) and records it in
    :class:`RequestMetrics`.

    Call :meth:`on_output` for every engine output of any choice as it
    arrives and :meth:`finish` exactly once at the end (later calls are
    ignored).

    Args:
        metrics: where to record.
        num_prompt_tokens: the prompts' tokens (each prompt once).
        start: ``time.monotonic()`` seconds of submission (default: now).
        tenant: the ``tenant`` label it counts under
            (:meth:`RequestMetrics.tenant_label`).
    """

    def __init__(
        self, metrics: RequestMetrics, num_prompt_tokens: int, start: float | None = None,
        tenant: str = ANONYMOUS_TENANT_LABEL,
    ) -> None:
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.tenant = tenant
        self.start = time.monotonic() if start is None else start
        self.first_token_time: float | None = None
        self._last_token_time: dict[str, float] = {}  # per choice (engine request id)
        self.finished = False

    def on_output(self, out: EngineCoreOutput, now: float | None = None) -> None:
        """Record queue time, TTFT (and the prompt tokens) on the request's first
        token, or one ITL of the output's choice.

        Args:
            out: the engine output that just arrived (any choice).
            now: ``time.monotonic()`` seconds of arrival (default: now).
        """
        now = time.monotonic() if now is None else now
        m = self.metrics
        if out.queue_time is not None:
            m.queue_time.observe(max(0.0, out.queue_time))
        if not out.new_token_ids:
            return
        if self.first_token_time is None:
            self.first_token_time = now
            m.ttft.observe(now - self.start)
            m.prompt_tokens.inc(self.num_prompt_tokens)
            m.tenant_prompt_tokens.labels(self.tenant).inc(self.num_prompt_tokens)
        last = self._last_token_time.get(out.request_id)
        if last is not None:
            m.itl.observe(now - last)
        self._last_token_time[out.request_id] = now

    def finish(self, reasons: list[str], num_generation_tokens: int,
               now: float | None = None) -> None:  # fmt: skip
        """Record the end: E2E latency, generated tokens and one finish reason.

        Args:
            reasons: each choice's ``"stop"``, ``"length"``, ``"abort"``
                (engine or client abort) or ``"error"``; the request counts
                under the first of error, abort, length, stop among them.
            num_generation_tokens: tokens delivered to the client, all choices.
            now: ``time.monotonic()`` seconds of the end (default: now).
        """
        if self.finished:
            return
        self.finished = True
        now = time.monotonic() if now is None else now
        m = self.metrics
        m.e2e.observe(now - self.start)
        m.generation_tokens.inc(num_generation_tokens)
        m.tenant_generation_tokens.labels(self.tenant).inc(num_generation_tokens)
        m.tenant_requests.labels(self.tenant).inc()
        known = [r if r in FINISHED_REASONS else "error" for r in reasons] or ["abort"]
        reason = next(r for r in _PRECEDENCE if r in known)
        m.request_success.labels(reason).inc()

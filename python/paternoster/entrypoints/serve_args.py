"""The flags of ``paternoster serve``: the model, the HTTP address, the engine's
flags (engine_args.py), the frontend's, and the limits, security, scale-out and
shutdown flags (docs/errors.md)."""

from __future__ import annotations

import argparse
import os

from paternoster.entrypoints.engine_args import add_engine_args, parse_bytes, positive_int
from paternoster.frontend.router import ROUTING_POLICIES


def add_serve_args(serve: argparse.ArgumentParser) -> None:
    """Add every flag of ``paternoster serve`` to its subparser ``serve``."""
    serve.add_argument(
        "model", nargs="?", default=None, metavar="MODEL",
        help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    add_engine_args(serve)
    g = serve.add_argument_group("frontend")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--engine-startup-timeout", type=float, default=600.0,
        help="seconds to wait for the engine to load the model",
    )  # fmt: skip
    g.add_argument(
        "--engine-stall-timeout", type=float, default=10.0,
        help="seconds without a heartbeat before the engine is reported stalled: /health "
        "answers 503 and new requests are refused until heartbeats resume (the engine "
        "beats from its own thread, also during a long step)",
    )  # fmt: skip
    g.add_argument(
        "--engine-step-timeout", type=float, default=600.0,
        help="seconds one engine step, or one stall, may last before the engine is declared "
        "dead and killed (a long prompt prefilled in one step can take minutes on a CPU)",
    )  # fmt: skip
    g.add_argument(
        "--chat-template", default=None, metavar="FILE",
        help="Jinja chat template file replacing the model's own (or supplying a missing one)",
    )  # fmt: skip
    g.add_argument(
        "--trust-request-chat-template", action="store_true",
        help="accept a chat_template in requests (it is Jinja code the server runs; off by "
        "default, as in vLLM)",
    )  # fmt: skip
    g.add_argument(
        "--tool-call-parser", default=None, metavar="NAME",
        help="read tool calls out of chat output in this model family's format, for "
        "tool_choice auto (built-in: hermes (Qwen2.5/Qwen3/Hermes), qwen3_coder, llama3_json, "
        "mistral, pythonic; more from the entry-point group paternoster.tool_parsers)",
    )  # fmt: skip
    g.add_argument(
        "--reasoning-parser", default=None, metavar="NAME",
        help="split chat output into reasoning_content and the answer (built-in: deepseek_r1, "
        "qwen3, gpt_oss; more from the entry-point group paternoster.reasoning_parsers)",
    )  # fmt: skip
    g.add_argument(
        "--enable-auto-tool-choice", action="store_true",
        help="vLLM's switch, accepted: tool_choice auto works whenever --tool-call-parser is set",
    )  # fmt: skip
    g.add_argument(
        "--zmq-address", default=None, metavar="ENDPOINT",
        help="ZeroMQ endpoint of the msgpack client protocol (docs/protocol.md), e.g. "
             "tcp://127.0.0.1:5555; default ipc://<tmp>/paternoster-<port>.ipc; 'none' turns "
             "it off",
    )  # fmt: skip
    # tests: slow-client handling with small queues and short timeouts
    g.add_argument("--zmq-sndhwm", type=positive_int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--zmq-slow-client-timeout", type=_positive_float, default=None,
                   help=argparse.SUPPRESS)  # fmt: skip
    g.add_argument("--engine-cls", default=None, help=argparse.SUPPRESS)  # tests: a fake engine
    _add_hardening_args(serve)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_hardening_args(parser: argparse.ArgumentParser) -> None:
    """Security, overload and shutdown flags of ``serve`` (docs/errors.md)."""
    from paternoster.entrypoints.openai.guard import DEFAULT_MAX_STOP
    from paternoster.metrics.requests import DEFAULT_MAX_TENANTS
    from paternoster.sampling_params import MAX_N

    g = parser.add_argument_group("limits, security and shutdown")
    g.add_argument(
        "--api-key", default=os.environ.get("PATERNOSTER_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on every route but /health, /version "
             "and /metrics (default: $PATERNOSTER_API_KEY; none when unset)",
    )  # fmt: skip
    g.add_argument(
        "--max-request-body-bytes", type=parse_bytes, default=16 * 1024**2, metavar="BYTES",
        help="larger request bodies get 413 (default 16MiB)",
    )  # fmt: skip
    g.add_argument("--max-n", type=positive_int, default=MAX_N,
                   help=f"largest n per request (at most {MAX_N})")  # fmt: skip
    g.add_argument("--max-stop-sequences", type=int, default=DEFAULT_MAX_STOP,
                   help="most stop strings per request")  # fmt: skip
    g.add_argument(
        "--metrics-max-tenants", type=_non_negative_int, default=DEFAULT_MAX_TENANTS,
        metavar="N",
        help="the first N distinct tenants get a tenant label of their own in the "
             "paternoster:tenant_* metrics; later ones count under tenant=\"other\" "
             f"(default {DEFAULT_MAX_TENANTS})",
    )  # fmt: skip
    g.add_argument(
        "--max-waiting-requests", type=positive_int, default=None, metavar="N",
        help="at most N requests waiting for their first token; beyond, 503 with "
             "Retry-After (default: unbounded)",
    )  # fmt: skip
    g.add_argument(
        "--max-waiting-tokens", type=positive_int, default=None, metavar="N",
        help="at most N prompt tokens waiting; beyond, 503 with Retry-After (default: unbounded)",
    )  # fmt: skip
    g.add_argument(
        "--queue-timeout", type=_positive_float, default=None, metavar="S",
        help="abort a request with 503 when it waited S seconds for its first token",
    )  # fmt: skip
    scale = parser.add_argument_group("scale-out")
    scale.add_argument(
        "--data-parallel-size", "-dp", type=positive_int, default=1, metavar="N",
        help="run N engine processes (data parallel), each with its own KV cache and its "
             "own cores (CPU: pinned to disjoint cores; --num-threads is then per engine) "
             "or GPU (CUDA: engine i gets GPU i), behind this one server; requests go "
             "where their prompt prefix is cached, else to the least loaded engine (default 1)",
    )  # fmt: skip
    scale.add_argument(
        "--data-parallel-routing", choices=ROUTING_POLICIES, default="affinity",
        help="affinity: a prompt goes to the engine holding its prefix, else the least "
             "loaded (default); round_robin: plain rotation (the baseline it is measured "
             "against, bench/dp_routing.py)",
    )  # fmt: skip
    scale.add_argument(
        "--distributed-executor-backend", choices=("mp", "ray"), default="mp",
        help="mp: engines are local processes (default); ray: engines are Ray actors on an "
             "existing Ray cluster (`ray start --head`, `ray start --address HEAD:6379`), "
             "one placement-group bundle of --num-threads CPUs (default 1) each, spread "
             "over the nodes, linked to this server over ZeroMQ tcp (README: Deployment)",
    )  # fmt: skip
    scale.add_argument(
        "--ray-address", default=None, metavar="HOST:PORT",
        help="the Ray cluster to join with --distributed-executor-backend ray "
             "(default: RAY_ADDRESS, else the cluster running on this node)",
    )  # fmt: skip
    g.add_argument(
        "--restart-engine", action="store_true",
        help="start a new engine process when the engine dies or stalls (in-flight "
             "requests still fail; /health recovers once it is ready)",
    )  # fmt: skip
    g.add_argument(
        "--shutdown-timeout", type=_positive_float, default=10.0, metavar="S",
        help="on SIGTERM/Ctrl-C, seconds in-flight requests may take to finish (default 10)",
    )  # fmt: skip


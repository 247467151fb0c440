"""EngineCore.abort_requests in every state a request can be in (waiting, in the
middle of a chunked prefill, running, preempted, finished, unknown), under each
built-in scheduler, on a tiny random-weight Llama: the live ones end with one
``abort`` output, the rest are ignored, and afterwards every KV block is free
and no per-request state is left behind."""

from __future__ import annotations

import pytest
import torch

from paternoster.engine.core import EngineCore
from paternoster.request import RequestStatus
from paternoster.sampling_params import SamplingParams
from tests.metrics.timeline_utils import make_engine, write_tiny_model

from .conftest import make_request

SCHEDULERS = ["fcfs", "chunked_prefill", "priority", "static", "fair"]
MAX_STEPS = 500


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return write_tiny_model(tmp_path_factory.mktemp("tiny-abort"))


def _params(max_tokens: int = 8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def _prompt(i: int, n: int) -> list[int]:
    return [(i * 11 + j) % 90 + 1 for j in range(n)]


def _status(engine: EngineCore, rid: str) -> RequestStatus | None:
    r = engine.scheduler.requests.get(rid)
    return None if r is None else r.status


def _step_until(engine: EngineCore, done, outputs: dict[str, list[int]]) -> None:
    """Step until ``done()``; collect every output's tokens per request id."""
    for _ in range(MAX_STEPS):
        if done():
            return
        for o in engine.step():
            outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
    raise AssertionError(f"not reached within {MAX_STEPS} steps")


def _assert_nothing_left(engine: EngineCore) -> None:
    stats = engine.stats()
    assert not engine.has_unfinished_requests()
    assert stats["num_running"] == stats["num_waiting"] == 0
    assert stats["num_free_blocks"] == stats["num_kv_blocks"] and stats["kv_cache_usage"] == 0
    assert engine.kv_cache_manager.num_requests() == 0
    assert engine.batch_builder.num_requests() == 0
    assert engine._prompt_logprobs.computed == {} and engine._unreported_queue_times == {}


def _assert_aborted(outs, rid: str, prompt_len: int) -> None:
    got = [(o.request_id, o.finish_reason, o.new_token_ids) for o in outs]
    assert got == [(rid, "abort", [])]
    assert outs[0].num_prompt_tokens == prompt_len


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_abort_waiting_request(model_dir, scheduler):
    engine = make_engine(model_dir, scheduler=scheduler, max_num_seqs=1)
    engine.add_request(make_request("first", _prompt(0, 6), _params()))
    engine.add_request(make_request("queued", _prompt(1, 6), _params()))
    outputs: dict[str, list[int]] = {}
    _step_until(engine, lambda: "first" in outputs, outputs)
    assert _status(engine, "queued") == RequestStatus.WAITING
    _assert_aborted(engine.abort_requests(["queued"]), "queued", 6)
    _step_until(engine, lambda: not engine.has_unfinished_requests(), outputs)
    assert len(outputs["first"]) == 8 and "queued" not in outputs
    _assert_nothing_left(engine)


def test_abort_in_the_middle_of_a_chunked_prefill(model_dir):
    # A 40-token prompt in chunks of 8 tokens; it asked for prompt logprobs, which
    # the engine keeps per request until the first token: dropped on abort.
    engine = make_engine(model_dir, scheduler="chunked_prefill", max_num_batched_tokens=8)
    engine.add_request(make_request("long", _prompt(0, 40), _params(prompt_logprobs=1)))
    engine.step()
    engine.step()
    request = engine.scheduler.requests["long"]
    assert request.status == RequestStatus.RUNNING and request.num_computed_tokens == 16
    assert not request.output_token_ids and "long" in engine._prompt_logprobs.computed
    _assert_aborted(engine.abort_requests(["long"]), "long", 40)
    _assert_nothing_left(engine)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_abort_running_request_mid_decode(model_dir, scheduler):
    engine = make_engine(model_dir, scheduler=scheduler)
    for i in range(3):
        engine.add_request(make_request(f"r{i}", _prompt(i, 5 + i), _params(12)))
    outputs: dict[str, list[int]] = {}
    _step_until(engine, lambda: all(len(outputs.get(f"r{i}", [])) >= 3 for i in range(3)),
                outputs)  # fmt: skip
    assert _status(engine, "r1") == RequestStatus.RUNNING
    got = len(outputs["r1"])
    _assert_aborted(engine.abort_requests(["r1"]), "r1", 6)
    _step_until(engine, lambda: not engine.has_unfinished_requests(), outputs)
    assert len(outputs["r1"]) == got  # nothing after the abort
    assert len(outputs["r0"]) == len(outputs["r2"]) == 12  # the others run to the end
    _assert_nothing_left(engine)


@pytest.mark.parametrize("scheduler", ["fcfs", "chunked_prefill", "priority", "fair"])
def test_abort_preempted_request(model_dir, scheduler):
    # 12 blocks of 4 tokens: four requests of 8 + 20 tokens cannot all stay.
    engine = make_engine(model_dir, scheduler=scheduler, num_kv_blocks=12)
    for i in range(4):
        engine.add_request(make_request(f"p{i}", _prompt(i, 8), _params(20)))

    def preempted() -> list[str]:
        return [rid for rid, r in engine.scheduler.requests.items()
                if r.status == RequestStatus.PREEMPTED]  # fmt: skip

    outputs: dict[str, list[int]] = {}
    _step_until(engine, lambda: bool(preempted()), outputs)
    victim = preempted()[0]
    assert outputs.get(victim)  # it had generated tokens before it lost its blocks
    got = len(outputs[victim])
    _assert_aborted(engine.abort_requests([victim]), victim, 8)
    _step_until(engine, lambda: not engine.has_unfinished_requests(), outputs)
    assert len(outputs[victim]) == got
    assert all(len(outputs[f"p{i}"]) == 20 for i in range(4) if f"p{i}" != victim)
    _assert_nothing_left(engine)


def test_abort_finished_unknown_and_repeated_ids_is_a_no_op(model_dir):
    engine = make_engine(model_dir)
    engine.add_request(make_request("done", _prompt(0, 5), _params(3)))
    engine.add_request(make_request("live", _prompt(1, 5), _params(30)))
    outputs: dict[str, list[int]] = {}
    _step_until(engine, lambda: len(outputs.get("done", [])) == 3, outputs)
    assert _status(engine, "done") is None and _status(engine, "live") == RequestStatus.RUNNING
    assert engine.abort_requests(["done", "no-such-id", "done"]) == []
    assert engine.stats()["num_running"] == 1
    # The same id twice in one call, and again later: one abort output in all.
    _assert_aborted(engine.abort_requests(["live", "live"]), "live", 5)
    assert engine.abort_requests(["live"]) == []
    _assert_nothing_left(engine)
    # The engine goes on serving, and an aborted id may be used again.
    engine.add_request(make_request("live", _prompt(2, 5), _params(4)))
    outputs.clear()
    _step_until(engine, lambda: not engine.has_unfinished_requests(), outputs)
    assert len(outputs["live"]) == 4
    _assert_nothing_left(engine)


def test_abort_everything_at_once_with_prefix_caching(model_dir):
    # Shared prefixes: cached blocks are shared between requests; aborting all of
    # them in one call (waiting, running, preempted mixed) still frees every block.
    engine = make_engine(model_dir, scheduler="chunked_prefill", num_kv_blocks=16,
                         max_num_seqs=3)  # fmt: skip
    shared = _prompt(7, 12)
    ids = [f"s{i}" for i in range(6)]
    for i, rid in enumerate(ids):
        engine.add_request(make_request(rid, shared + _prompt(i, 3), _params(25)))
    outputs: dict[str, list[int]] = {}

    def statuses() -> set:
        return {_status(engine, rid) for rid in ids}

    _step_until(engine, lambda: RequestStatus.PREEMPTED in statuses(), outputs)
    assert {RequestStatus.RUNNING, RequestStatus.WAITING} < statuses()
    assert engine.stats()["prefix_cache_hits"] > 0
    live = [rid for rid in ids if _status(engine, rid) is not None]
    outs = engine.abort_requests(ids)
    assert sorted(o.request_id for o in outs) == sorted(live)
    assert all(o.finish_reason == "abort" for o in outs)
    _assert_nothing_left(engine)

"""A slow grammar compile does not stall the engine: the request waits aside
until its grammar is ready while the running requests keep their steps (as
vLLM's WAITING_FOR_FSM state does), and it can be aborted while it waits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from paternoster import LLM, SamplingParams
from paternoster.engine.messages import EngineCoreRequest

pytest.importorskip("xgrammar")


# Thousands of distinct strings: xgrammar takes about a second or more to
# compile this against the 49152-token vocabulary (a cache miss every run: the
# salt makes the strings new to this process).
def _slow_choice(salt: str, n: int = 6000) -> list[str]:
    return [f"{salt}-option-{i:05d}" for i in range(n)]


@pytest.fixture(scope="module")
def llm():
    llm = LLM(max_num_seqs=8, num_threads=2)
    # build the grammar compiler (it reads the vocabulary once, ~0.5 s)
    llm.generate(["Hi"], SamplingParams(max_tokens=2, structured_outputs={"regex": "[ab]+"}))
    return llm


def _req(llm, rid: str, prompt: str, params: SamplingParams) -> EngineCoreRequest:
    ids = llm.tokenizer(prompt).input_ids
    return EngineCoreRequest(rid, ids, params)


def _gate_compiles(engine, monkeypatch) -> threading.Event:
    """Hold every grammar compile's result back until the returned event is
    set (at most 30 s): how long the compile lasts is then the test's choice,
    not the machine's load."""
    compiler = engine._compiling._compiler  # built by the fixture's first compile
    real = compiler.compile_async
    gate = threading.Event()

    def compile_async(spec: dict) -> Future:
        inner, outer = real(spec), Future()

        def finish() -> None:
            gate.wait(30)
            try:
                outer.set_result(inner.result())
            except Exception as e:  # noqa: BLE001 - handed on as the compile's error
                outer.set_exception(e)

        threading.Thread(target=finish, daemon=True).start()
        return outer

    monkeypatch.setattr(compiler, "compile_async", compile_async)
    return gate


def test_running_requests_keep_stepping_while_a_grammar_compiles(llm, monkeypatch):
    engine = llm.engine
    gate = _gate_compiles(engine, monkeypatch)
    free = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    engine.add_request(_req(llm, "free", "Once upon a time", free))
    engine.step()
    choices = _slow_choice("a")
    slow = SamplingParams(max_tokens=16, temperature=0,
                          structured_outputs={"choice": choices})  # fmt: skip
    start = time.perf_counter()
    engine.add_request(_req(llm, "slow", "Pick one:", slow))
    assert time.perf_counter() - start < 0.5  # add_request did not wait for the compile
    assert "slow" in engine._compiling
    free_tokens_while_compiling = 0
    text, finish = [], None
    while engine.has_unfinished_requests():
        compiling = "slow" in engine._compiling
        for out in engine.step():
            if out.request_id == "free" and compiling:
                free_tokens_while_compiling += len(out.new_token_ids)
            if out.request_id == "slow":
                text += out.new_token_ids
                finish = out.finish_reason or finish
        if free_tokens_while_compiling >= 3:
            gate.set()  # the compile ends only after the free request stepped on
    assert free_tokens_while_compiling >= 3
    assert finish == "stop" and llm.tokenizer.decode(text, skip_special_tokens=True) in choices


def test_a_request_waiting_for_its_grammar_can_be_aborted(llm):
    engine = llm.engine
    slow = SamplingParams(max_tokens=8, structured_outputs={"choice": _slow_choice("b")})
    engine.add_request(_req(llm, "slow2", "Pick one:", slow))
    assert "slow2" in engine._compiling
    [out] = engine.abort_requests(["slow2"])
    assert (out.request_id, out.finish_reason) == ("slow2", "abort")
    assert not engine.has_unfinished_requests()

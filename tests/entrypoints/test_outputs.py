"""Per-choice output processing: fan-out, EOS/stop handling, stop strings, counts."""

from __future__ import annotations

from paternoster.engine.messages import EngineCoreOutput
from paternoster.frontend.output_processor import SequenceState, fan_out
from paternoster.sampling_params import SamplingParams


def _feed(state: SequenceState, ids: list[int], last_reason: str | None = None):
    deltas = []
    for i, t in enumerate(ids):
        reason = last_reason if i == len(ids) - 1 else None
        deltas.append(state.process(EngineCoreOutput("r", [t], reason)))
        if state.finished:
            break
    return deltas


def test_fan_out_gives_n_requests_with_consecutive_seeds():
    reqs = fan_out("req", [1, 2], SamplingParams(n=3, seed=10, max_tokens=40), 6)
    assert [i for i, _ in reqs] == [6, 7, 8]
    assert [r.request_id for _, r in reqs] == ["req-6", "req-7", "req-8"]
    assert [r.sampling_params.seed for _, r in reqs] == [10, 11, 12]
    assert all(r.sampling_params.n == 1 for _, r in reqs)
    assert all(r.sampling_params.max_tokens == 40 for _, r in reqs)
    unseeded = fan_out("u", [1], SamplingParams(n=2))
    assert [r.sampling_params.seed for _, r in unseeded] == [None, None]


def test_eos_ends_the_text_but_is_counted(tokenizer):
    ids = tokenizer(" Paris is nice", add_special_tokens=False).input_ids
    state = SequenceState(0, tokenizer, [5, 6], SamplingParams())
    _feed(state, ids + [tokenizer.eos_token_id], "stop")
    assert state.text == " Paris is nice"
    assert state.token_ids == ids + [tokenizer.eos_token_id]
    assert state.finish_reason == "stop" and not state.needs_abort


def test_stop_token_id_text_is_excluded(tokenizer):
    ids = tokenizer(" one. two", add_special_tokens=False).input_ids
    dot = tokenizer(".", add_special_tokens=False).input_ids[0]
    cut = ids.index(dot)
    state = SequenceState(0, tokenizer, [5], SamplingParams(stop_token_ids=[dot]))
    _feed(state, ids[: cut + 1], "stop")
    assert state.text == " one"
    assert len(state.token_ids) == cut + 1


def test_stop_string_truncates_and_requests_abort(tokenizer):
    ids = tokenizer(" alpha beta END gamma delta", add_special_tokens=False).input_ids
    state = SequenceState(1, tokenizer, [5], SamplingParams(stop=["END"]))
    deltas = _feed(state, ids)
    assert state.text == " alpha beta "
    assert "".join(d.text for d in deltas) == state.text
    assert state.finish_reason == "stop" and state.stop_reason == "END"
    assert state.needs_abort
    assert len(state.token_ids) < len(ids)  # stopped consuming at the match
    assert state.process(EngineCoreOutput("r", [ids[-1]])).text == ""  # late outputs ignored
    out = state.to_output()
    assert (out.index, out.text, out.finish_reason) == (1, " alpha beta ", "stop")


def test_held_text_is_released_when_the_engine_finishes(tokenizer):
    ids = tokenizer(" x EN", add_special_tokens=False).input_ids
    state = SequenceState(0, tokenizer, [5], SamplingParams(stop=["END"]))
    deltas = _feed(state, ids, "length")
    assert state.text == " x EN" and state.finish_reason == "length"
    assert not state.needs_abort
    assert deltas[-1].finish_reason == "length"


def test_fan_out_carries_priority_to_every_choice():
    from paternoster.frontend.output_processor import fan_out
    from paternoster.sampling_params import SamplingParams

    reqs = fan_out("x", [1, 2, 3], SamplingParams(n=3, seed=5), priority=7, cache_salt="t1",
                   arrival_time=123.5)  # fmt: skip
    assert [r.priority for _, r in reqs] == [7, 7, 7]
    assert [(r.cache_salt, r.arrival_time) for _, r in reqs] == [("t1", 123.5)] * 3
    assert [r.sampling_params.seed for _, r in reqs] == [5, 6, 7]


def test_include_stop_str_in_output_keeps_the_stop_string_and_token(tokenizer):
    ids = tokenizer(" alpha beta END gamma", add_special_tokens=False).input_ids
    kept = SequenceState(0, tokenizer, [5], SamplingParams(stop=["END"],
                                                           include_stop_str_in_output=True))
    _feed(kept, ids)
    assert kept.text == " alpha beta END" and kept.stop_reason == "END"
    dot = tokenizer(".", add_special_tokens=False).input_ids[0]
    words = tokenizer(" one.", add_special_tokens=False).input_ids
    state = SequenceState(0, tokenizer, [5], SamplingParams(stop_token_ids=[dot],
                                                            include_stop_str_in_output=True))
    _feed(state, words, "stop")
    assert state.text == " one."


def test_stop_strings_are_not_matched_before_min_tokens(tokenizer):
    ids = tokenizer(" END x END y", add_special_tokens=False).input_ids
    first_end = ids.index(tokenizer(" END", add_special_tokens=False).input_ids[0])
    state = SequenceState(0, tokenizer, [5], SamplingParams(stop=["END"],
                                                            min_tokens=first_end + 1))
    _feed(state, ids)
    assert state.text == " END x " and state.finish_reason == "stop"


def test_skip_special_tokens_comes_from_the_params(tokenizer):
    ids = [tokenizer.eos_token_id] * 2
    keep = SequenceState(0, tokenizer, [5], SamplingParams(skip_special_tokens=False))
    _feed(keep, ids, "length")
    assert keep.text == tokenizer.eos_token * 2
    skip = SequenceState(0, tokenizer, [5], SamplingParams())
    _feed(skip, ids, "length")
    assert skip.text == ""


def test_logprobs_accumulate_per_token_and_prompt_logprobs_once(tokenizer):
    from paternoster.logprobs import Logprobs

    state = SequenceState(0, tokenizer, [5, 6, 7], SamplingParams(logprobs=1, prompt_logprobs=0))
    plp = Logprobs([-1.0, -2.0], [[], []], [[], []])
    d = state.process(EngineCoreOutput("r", [9], logprobs=Logprobs([-0.5], [[9]], [[-0.5]]),
                                       prompt_logprobs=plp))
    assert d.prompt_logprobs == plp and d.logprobs.token_logprobs == [-0.5]
    state.process(EngineCoreOutput("r", [10], "length", logprobs=Logprobs([-0.7], [[3]], [[-0.1]])))
    out = state.to_output()
    assert out.logprobs.token_logprobs == [-0.5, -0.7] and out.logprobs.top_token_ids == [[9], [3]]
    assert state.prompt_logprobs == plp

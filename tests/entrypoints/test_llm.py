"""The offline API on the real default model."""

from __future__ import annotations

import pytest

from paternoster import LLM, CompletionOutput, RequestOutput, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def llm(default_model_path):
    return LLM(str(default_model_path), num_kv_blocks=256, max_model_len=1024)


def _assert_idle(llm):
    stats = llm.engine.stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["num_free_blocks"] == stats["num_kv_blocks"]


def test_generate_one_prompt(llm):
    [out] = llm.generate("The capital of France is", GREEDY)
    assert isinstance(out, RequestOutput) and out.finished
    assert out.prompt == "The capital of France is"
    assert out.prompt_token_ids == llm.tokenizer("The capital of France is").input_ids
    [choice] = out.outputs
    assert isinstance(choice, CompletionOutput) and choice.index == 0
    assert choice.text and 1 <= len(choice.token_ids) <= 12
    assert choice.finish_reason in ("stop", "length")
    assert llm.tokenizer.decode(choice.token_ids, skip_special_tokens=True).startswith(choice.text)
    _assert_idle(llm)


def test_prompts_are_batched_continuously(llm):
    prompts = [f"Fact number {i}:" for i in range(6)]
    start = len(llm.engine.step_log)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.prompt for o in outs] == prompts
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    steps = list(llm.engine.step_log)[start:]
    assert max(len(s.scheduled) for s in steps) == 6  # all six decode together
    assert len(steps) < 6 * 8
    _assert_idle(llm)


def test_token_id_prompts_match_text_prompts(llm):
    ids = llm.tokenizer("Once upon a time").input_ids
    by_text = llm.generate("Once upon a time", GREEDY)[0].outputs[0]
    by_ids = llm.generate([ids], GREEDY)[0]
    assert by_ids.prompt is None and by_ids.outputs[0].text == by_text.text


def test_n_choices_with_seeds_are_reproducible(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8)
    a = llm.generate("Hello", params)[0].outputs
    b = llm.generate("Hello", params)[0].outputs
    assert [c.index for c in a] == [0, 1, 2]
    assert [c.text for c in a] == [c.text for c in b]


def test_stop_string_truncates_and_frees_the_request(llm):
    kw = dict(temperature=0, max_tokens=30, ignore_eos=True)
    full = llm.generate("Count: 1, 2, 3,", SamplingParams(**kw))[0].outputs[0]
    stop = full.text.split()[2]
    out = llm.generate("Count: 1, 2, 3,", SamplingParams(stop=[stop], **kw))[0].outputs[0]
    assert out.text == full.text[: full.text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.token_ids) < 30
    _assert_idle(llm)


def test_chat_one_and_many_conversations(llm):
    conv = [{"role": "user", "content": "Say hi."}]
    [one] = llm.chat(conv, GREEDY)
    assert one.prompt.endswith("<|im_start|>assistant\n")
    assert one.prompt_token_ids == llm.tokenizer(one.prompt, add_special_tokens=False).input_ids
    two = llm.chat([conv, [{"role": "user", "content": "Say bye."}]], GREEDY)
    # (Texts are not compared: bf16 greedy can flip near-ties between batch shapes.)
    assert [o.prompt_token_ids for o in two][0] == one.prompt_token_ids
    assert all(o.outputs[0].text for o in two) and "Say bye." in two[1].prompt


def test_per_prompt_params_and_errors(llm):
    outs = llm.generate(
        ["a", "b"], [SamplingParams(max_tokens=2, ignore_eos=True),
                     SamplingParams(max_tokens=3, ignore_eos=True)]
    )  # fmt: skip
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 3]
    with pytest.raises(ValueError, match="2 prompts"):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(ValueError, match="1024"):
        llm.generate([[28120] * 1000], SamplingParams(max_tokens=100))
    _assert_idle(llm)


def test_logprobs_and_prompt_logprobs_in_the_offline_api(llm):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1)
    [out] = llm.generate("The capital of France is", params)
    [choice] = out.outputs
    assert len(choice.logprobs) == len(choice.token_ids) == 4
    assert [ids[0] for ids in choice.logprobs.top_token_ids] == choice.token_ids  # greedy
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids) - 1
    assert all(len(ids) == 1 for ids in out.prompt_logprobs.top_token_ids)
    [plain] = llm.generate("The capital of France is", GREEDY)
    assert plain.outputs[0].logprobs is None and plain.prompt_logprobs is None


def test_chat_continues_the_final_message(llm):
    conv = [{"role": "user", "content": "Count to five."},
            {"role": "assistant", "content": "1, 2, 3,"}]
    [out] = llm.chat(conv, GREEDY, add_generation_prompt=False, continue_final_message=True)
    assert out.prompt.endswith("1, 2, 3,")


def test_chat_without_a_template_names_the_offline_remedy(llm, monkeypatch):
    from paternoster.frontend.chat import ChatTemplateError

    monkeypatch.setattr(llm.tokenizer, "chat_template", None)
    with pytest.raises(ChatTemplateError, match="pass chat_template= .* to LLM.chat"):
        llm.chat([{"role": "user", "content": "Hi"}], GREEDY)
    [out] = llm.chat([{"role": "user", "content": "Hi"}], GREEDY,
                     chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert out.prompt == "Hi"


def test_reports_the_thread_count_it_used(llm):
    # The suite's conftest sets PATERNOSTER_NUM_THREADS=1 (auto otherwise).
    assert llm.engine.info["num_threads"] == llm.engine.threads.num_threads == 1
    assert llm.engine.threads.source == "env"


def test_bad_words_hold_offline(llm):
    """``bad_words`` are turned into token ids offline too (they were ignored)."""
    prompt = "The capital of France is"
    free = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0))[0]
    ids = free.outputs[0].token_ids
    word = llm.tokenizer.decode(ids[:1]).strip()
    banned = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0,
                                                   bad_words=[word]))[0]  # fmt: skip
    assert banned.outputs[0].token_ids[0] != ids[0]


def test_tenant_reaches_the_engine_requests(llm, monkeypatch):
    seen = []
    add = llm.engine.scheduler.add_request
    monkeypatch.setattr(llm.engine.scheduler, "add_request",
                        lambda r: (seen.append(r.tenant), add(r))[1])  # fmt: skip
    one = SamplingParams(max_tokens=1)
    llm.generate(["a", "b", "c"], one, tenant=["x", None, "y"])
    llm.generate("a", one, tenant="z")
    llm.generate("a", one)
    assert seen == ["x", None, "y", "z", None]
    _assert_idle(llm)


def test_bad_tenant_is_a_value_error_naming_it(llm):
    with pytest.raises(ValueError, match="got 1 tenant values for 2 prompts"):
        llm.generate(["a", "b"], tenant=["x"])
    with pytest.raises(ValueError, match="tenant must be a non-empty string"):
        llm.generate("a", tenant="")
    with pytest.raises(ValueError, match="tenant must be at most 256 characters"):
        llm.generate("a", tenant="t" * 257)
    _assert_idle(llm)


def test_slo_targets_reach_the_slo_scheduler(default_model_path):
    """Per-prompt slo_ttft_s: the 1 ns target cannot be met, so load shedding
    refuses it (ValueError with the reason); a reachable one is served."""
    slo = LLM(str(default_model_path), num_kv_blocks=64, max_model_len=256, scheduler="slo",
              scheduler_config={"load_shedding": True, "ttft_s": 60.0})  # fmt: skip
    [out] = slo.generate("Hello", GREEDY, slo_ttft_s=30.0, slo_itl_s=10.0)
    assert out.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"TTFT target of 1e-09 s "):  # as given, no float noise
        slo.generate(["Hello", "Hi"], GREEDY, slo_ttft_s=[None, 1e-9])
    _assert_idle(slo)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"slo_ttft_s": 0}, "slo_ttft_s"), ({"slo_itl_s": -1}, "slo_itl_s"),
    ({"slo_ttft_s": [1.0]}, "1 slo_ttft_s values for 2 prompts"),
    ({"slo_itl_s": True}, "slo_itl_s"),
])  # fmt: skip
def test_bad_slo_targets_are_named(llm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["a", "b"], GREEDY, **kwargs)

"""OpenAI/vLLM request parameters end to end on the default model in float32,
against HF transformers' own forward: logprobs, echo with prompt logprobs,
penalties/bias/min_tokens, stream vs non-stream agreement, /tokenize,
/detokenize, /version and the OpenAPI schema."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from tests.entrypoints.utils import start_server

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]
ATOL = 2e-3  # our CPU kernels vs HF's forward, both float32; logprobs are O(1..20)
EOS = 2  # <|im_end|>, the default model's EOS


@pytest.fixture(scope="module")
def f32_server(default_model_path):
    with start_server(
        str(default_model_path), "--dtype", "float32", "--num-kv-blocks", "256",
        "--max-model-len", "1024",
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(f32_server):
    return openai.OpenAI(base_url=f32_server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def hf(default_model_path):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def hf_greedy(hf, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """HF's greedy generate: the new ids and log_softmax of its raw logits [n, V]."""
    with torch.inference_mode():
        inp = torch.tensor([ids])
        out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=n,
                          min_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    logits = torch.cat([x.float() for x in out.logits])
    return out.sequences[0, len(ids) :].tolist(), torch.log_softmax(logits, dim=-1)


def hf_log_probs(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def token_text(tokenizer, i: int) -> str:
    return tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)])


# ---------------------------------------------------------------- logprobs


def test_completion_logprobs_and_echo_match_hf(f32_server, hf, tokenizer):
    prompt_ids = tokenizer(PROMPT).input_ids
    r = post(f32_server, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3, "echo": True,
        "ignore_eos": True,
    }).json()  # fmt: skip
    choice = r["choices"][0]
    gen, ref = hf_greedy(hf, prompt_ids, 6)
    P = len(prompt_ids)
    lp = choice["logprobs"]
    assert choice["text"] == PROMPT + tokenizer.decode(gen)
    assert lp["tokens"] == [token_text(tokenizer, t) for t in prompt_ids + gen]
    # The echoed prompt: the first token has none; the others vs HF's forward.
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    prompt_ref = hf_log_probs(hf, prompt_ids)
    want = prompt_ref[torch.arange(P - 1), torch.tensor(prompt_ids[1:])]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][1:P]), want, atol=ATOL, rtol=0)
    # Generated tokens vs HF's generate logits.
    want = ref[torch.arange(6), torch.tensor(gen)]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][P:]), want, atol=ATOL, rtol=0)
    for pos, top in enumerate(lp["top_logprobs"][P:]):
        values, ids = ref[pos].topk(3)
        expect = {token_text(tokenizer, int(i)): float(v) for i, v in zip(ids, values)}
        assert set(top) == set(expect)  # greedy: the chosen token is among the top 3
        for k, v in expect.items():
            assert abs(top[k] - v) < ATOL
    # text_offset: where each token starts in the returned text.
    text = choice["text"]
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert text[off : off + len(tok)] == tok


def test_logprobs_zero_lists_only_the_chosen_token(f32_server):
    r = post(f32_server, "/v1/completions",
             {"prompt": PROMPT, "max_tokens": 3, "temperature": 0.8, "seed": 1,
              "logprobs": 0}).json()  # fmt: skip
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == r["usage"]["completion_tokens"] == 3
    assert all(list(t) == [tok] for t, tok in zip(lp["top_logprobs"], lp["tokens"]))
    assert "logprobs" in r["choices"][0] and post(
        f32_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}
    ).json()["choices"][0]["logprobs"] is None


def test_chat_logprobs_match_hf(client, hf, tokenizer):
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT,
                                       max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=2)  # fmt: skip
    choice = r.choices[0]
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    gen, ref = hf_greedy(hf, tokenizer(prompt, add_special_tokens=False).input_ids, 8)
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert [c.token for c in content] == [token_text(tokenizer, t) for t in gen]
    want = ref[torch.arange(len(content)), torch.tensor(gen[: len(content)])]
    torch.testing.assert_close(torch.tensor([c.logprob for c in content]), want, atol=ATOL,
                               rtol=0)  # fmt: skip
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token  # greedy
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
    text_bytes = b"".join(bytes(c.bytes) for c in content if c.token != "<|im_end|>")
    assert text_bytes.decode("utf-8") == choice.message.content


# ------------------------------------------------- stream vs non-stream


def assert_same(a, b, path: str = "") -> None:
    """Equal structures; floats within 1e-4 (float32 logits can differ in the last
    bits with the batch's shape, and the two requests are batched differently)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def _sse(resp: httpx.Response) -> list[dict]:
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _merge_completion_chunks(chunks: list[dict]) -> dict[int, dict]:
    merged: dict[int, dict] = {}
    for c in chunks:
        for ch in c["choices"]:
            m = merged.setdefault(ch["index"], {"text": "", "finish_reason": None, "lp": {
                "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}})
            m["text"] += ch["text"]
            m["finish_reason"] = ch["finish_reason"] or m["finish_reason"]
            for k in m["lp"]:
                m["lp"][k] += (ch["logprobs"] or {}).get(k, [])
    return merged


@pytest.mark.parametrize("echo", [False, True])
def test_completion_stream_and_non_stream_agree(f32_server, echo):
    body = {"prompt": ["Once upon a time", "Hello"], "max_tokens": 10, "temperature": 0.9,
            "seed": 3, "n": 2, "logprobs": 2, "echo": echo, "stop": ["\n\n"]}  # fmt: skip
    whole = post(f32_server, "/v1/completions", body).json()
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = _sse(post(f32_server, "/v1/completions", streamed))
    merged = _merge_completion_chunks(chunks)
    assert sorted(merged) == [0, 1, 2, 3]
    for ch in whole["choices"]:
        m = merged[ch["index"]]
        assert m["text"] == ch["text"] and m["finish_reason"] == ch["finish_reason"]
        assert_same(m["lp"], ch["logprobs"])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    texts = [c["text"] for c in whole["choices"]]
    assert texts[0] != texts[1]  # n samples differ (seeds seed + i)


def test_chat_stream_and_non_stream_agree(client):
    kw = dict(model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=12, temperature=1.0,
              seed=5, n=3, logprobs=True, top_logprobs=1)  # fmt: skip
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    for ch in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == ch.index]
        assert "".join(c.delta.content or "" for c in mine) == ch.message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == [ch.finish_reason]
        streamed = [t.model_dump() for c in mine if c.logprobs for t in c.logprobs.content]
        assert_same(streamed, [t.model_dump() for t in ch.logprobs.content])
    assert chunks[-1].usage == whole.usage
    assert len({c.message.content for c in whole.choices}) == 3  # distinct samples


def test_continuous_usage_stats_in_every_chunk(f32_server):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = _sse(post(f32_server, "/v1/completions", body))
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"] is not None for c in chunks)
    assert counts == sorted(counts) and counts[-1] == 5
    plain = _sse(post(f32_server, "/v1/completions", {**body, "stream_options": None}))
    assert all("usage" not in c for c in plain)


# ------------------------------------------------------ sampling controls


def test_min_tokens_holds_back_eos(f32_server):
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "min_tokens": 4,
            "logit_bias": {str(EOS): 100}, "logprobs": 0}
    r = post(f32_server, "/v1/completions", body).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["logprobs"]["tokens"][-1] == "<|im_end|>"
    r = post(f32_server, "/v1/completions", {**body, "min_tokens": 0}).json()
    assert r["usage"]["completion_tokens"] == 1


def test_penalties_change_greedy_output(f32_server):
    base = {"prompt": "The list: apples, pears, apples,", "max_tokens": 16, "temperature": 0,
            "ignore_eos": True}
    plain = post(f32_server, "/v1/completions", base).json()["choices"][0]["text"]
    for extra in ({"repetition_penalty": 2.0}, {"frequency_penalty": 2.0},
                  {"presence_penalty": 2.0}):  # fmt: skip
        text = post(f32_server, "/v1/completions", {**base, **extra}).json()["choices"][0]["text"]
        assert text != plain, extra  # the values themselves: tests/model/test_logits_processors


def test_stop_string_kept_with_include_stop_str_in_output(f32_server):
    base = {"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 12, "temperature": 0}
    full = post(f32_server, "/v1/completions", base).json()["choices"][0]["text"]
    stop = full.split()[1]
    cut = post(f32_server, "/v1/completions", {**base, "stop": stop}).json()["choices"][0]
    kept = post(f32_server, "/v1/completions",
                {**base, "stop": stop, "include_stop_str_in_output": True}).json()["choices"][0]
    assert kept["text"] == cut["text"] + stop and kept["finish_reason"] == "stop"


def test_skip_special_tokens_false_keeps_them_in_the_text(f32_server):
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(EOS): 100}}
    assert post(f32_server, "/v1/completions", body).json()["choices"][0]["text"] == ""
    kept = post(f32_server, "/v1/completions", {**body, "skip_special_tokens": False}).json()
    assert kept["choices"][0]["text"] == "<|im_end|><|im_end|>"


def test_best_of_equal_to_n_is_accepted(f32_server):
    r = post(f32_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "n": 2,
                                             "best_of": 2, "user": "someone"})  # fmt: skip
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


BAD = [
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"49152": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"5": 150}}, "logit_bias"),
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ("/v1/completions", {"min_tokens": -1}, "min_tokens"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message"),
    ("/v1/chat/completions", {"stream_options": {"include_usage": "x"}}, "stream_options"),
]


@pytest.mark.parametrize(("path", "extra", "param"), BAD)
def test_bad_parameters_are_400_naming_them(f32_server, path, extra, param):
    base = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": CHAT}
    r = post(f32_server, path, {**base, "max_tokens": 3, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError", err


# ------------------------------------------------------------- endpoints


def test_tokenize_and_detokenize_match_the_tokenizer(f32_server, client, tokenizer):
    text = "Hello wörld, 日本!"
    r = post(f32_server, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    ids = tokenizer(text).input_ids
    assert r == {"count": len(ids), "max_model_len": 1024, "tokens": ids,
                 "token_strs": tokenizer.convert_ids_to_tokens(ids)}  # fmt: skip
    r = post(f32_server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert r["tokens"] == tokenizer(text, add_special_tokens=False).input_ids
    assert post(f32_server, "/detokenize", {"tokens": ids}).json() == {"prompt": text}
    # Messages go through the chat template exactly as a chat completion's prompt.
    chat = post(f32_server, "/tokenize", {"messages": CHAT}).json()
    templated = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer(templated, add_special_tokens=False).input_ids
    usage = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT,
                                           max_tokens=1).usage  # fmt: skip
    assert usage.prompt_tokens == chat["count"]
    no_gen = post(f32_server, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert no_gen.json()["count"] < chat["count"]
    for path, body, param in (("/detokenize", {"tokens": [10**9]}, "tokens"),
                              ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
                              ("/tokenize", {"messages": [{"content": "x"}]}, "messages[0].role"),
                              ("/tokenize", {}, "prompt")):  # fmt: skip
        bad = post(f32_server, path, body)
        assert bad.status_code in (400, 404) and bad.json()["error"]["param"] == param


def test_version(f32_server):
    import paternoster

    assert f32_server.get("/version").json() == {"version": paternoster.__version__}


def test_openapi_describes_the_request_models(f32_server):
    spec = f32_server.get("/openapi.json").json()
    paths = spec["paths"]
    for p in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
              "/version", "/v1/models"):  # fmt: skip
        assert p in paths, p
    schemas = spec["components"]["schemas"]
    completion = schemas["CompletionRequest"]["properties"]
    for field in ("prompt", "logprobs", "echo", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "min_tokens", "logit_bias", "seed", "stop_token_ids",
                  "include_stop_str_in_output", "skip_special_tokens", "stream_options",
                  "best_of", "n", "user"):  # fmt: skip
        assert field in completion, field
    chat = schemas["ChatCompletionRequest"]["properties"]
    for field in ("messages", "logprobs", "top_logprobs", "max_completion_tokens",
                  "add_generation_prompt", "continue_final_message", "chat_template"):
        assert field in chat, field
    assert "continuous_usage_stats" in schemas["StreamOptions"]["properties"]
    ok = paths["/v1/completions"]["post"]["responses"]
    assert "CompletionResponse" in json.dumps(ok["200"]) and "400" in ok and "422" not in ok
    assert "TokenizeChatRequest" in json.dumps(paths["/tokenize"]["post"]["requestBody"])
    assert "HTTPValidationError" not in schemas

"""Chat templates: one BOS however the template and the tokenizer add theirs,
generation prompt and continued messages, a clear 400 when the model has no
template, and ``--chat-template FILE`` / a request's ``chat_template``
supplying one (servers over the scripted fake engine: no model)."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from paternoster.frontend.chat import (
    ChatTemplateError,
    load_chat_template,
    render_chat,
)
from tests.entrypoints.utils import FAKE_ENGINE, start_server

BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
TURNS = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "hello there"},
    {"role": "user", "content": "hello"},
]


@pytest.fixture(scope="module")
def bos_tokenizer():
    """A word-level tokenizer whose post-processor adds BOS (as Llama's does)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "</s>", "<unk>", "[user]", "[assistant]", "[system]", "hello", "there",
             "be", "brief"]  # fmt: skip
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    t = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    t.chat_template = BOS_TEMPLATE
    return t


def test_a_template_that_writes_bos_gives_exactly_one(bos_tokenizer):
    text, ids = render_chat(bos_tokenizer, TURNS)
    assert text.startswith("<s>[system] be brief [user] hello [assistant] hello there")
    assert ids.count(0) == 1 and ids[0] == 0
    assert bos_tokenizer(text).input_ids.count(0) == 2  # what naive tokenization would do
    _, with_special = render_chat(bos_tokenizer, TURNS, add_special_tokens=True)
    assert with_special == ids


def test_a_template_without_bos_gets_one_when_special_tokens_are_asked(bos_tokenizer):
    plain = BOS_TEMPLATE.removeprefix("{{ bos_token }}")
    _, ids = render_chat(bos_tokenizer, TURNS, chat_template=plain)
    assert 0 not in ids
    _, ids = render_chat(bos_tokenizer, TURNS, chat_template=plain, add_special_tokens=True)
    assert ids.count(0) == 1 and ids[0] == 0


def test_generation_prompt_and_continued_message(bos_tokenizer, tokenizer):
    text, _ = render_chat(bos_tokenizer, TURNS)
    assert text.endswith("[assistant]")
    text, _ = render_chat(bos_tokenizer, TURNS, add_generation_prompt=False)
    assert not text.endswith("[assistant]")
    # The default model's template (ChatML): an assistant turn left open.
    conv = [{"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "One, two,"}]  # fmt: skip
    text, ids = render_chat(
        tokenizer, conv, add_generation_prompt=False, continue_final_message=True
    )
    assert text.endswith("<|im_start|>assistant\nOne, two,")
    assert ids == tokenizer(text, add_special_tokens=False).input_ids
    with pytest.raises(ChatTemplateError) as e:
        render_chat(tokenizer, conv, continue_final_message=True)  # with the generation prompt
    assert e.value.param == "continue_final_message"


def test_no_template_is_a_clear_error(bos_tokenizer, tmp_path):
    from copy import deepcopy

    bare = deepcopy(bos_tokenizer)
    bare.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template") as e:
        render_chat(bare, TURNS)
    assert e.value.param == "chat_template"
    _, ids = render_chat(bare, TURNS, chat_template=BOS_TEMPLATE)
    assert ids.count(0) == 1
    with pytest.raises(ValueError, match="cannot read chat template"):
        load_chat_template(tmp_path / "missing.jinja")
    (tmp_path / "t.jinja").write_text(BOS_TEMPLATE)
    assert load_chat_template(tmp_path / "t.jinja") == BOS_TEMPLATE


# ------------------------------------------------------------------- HTTP


def _model_dir(default_model_path, tmp_path_factory, with_template: bool):
    d = tmp_path_factory.mktemp("no_template")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, d / name)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    if with_template:
        shutil.copy(default_model_path / "chat_template.jinja", d / "chat_template.jinja")
    return d


@pytest.fixture(scope="module")
def bare_server(default_model_path, tmp_path_factory):
    d = _model_dir(default_model_path, tmp_path_factory, with_template=False)
    with start_server(str(d), "--engine-cls", FAKE_ENGINE, "--num-kv-blocks", "64",
                      "--trust-request-chat-template") as srv:  # fmt: skip
        yield srv


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def test_chat_without_a_template_is_400_naming_chat_template(bare_server):
    tokenize = {"messages": CHAT["messages"]}
    for path, body in (("/v1/chat/completions", CHAT), ("/tokenize", tokenize)):
        r = httpx.post(bare_server.url + path, json=body, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "chat_template" and "--chat-template" in err["message"]
    ok = httpx.post(bare_server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2},
                    timeout=30)  # fmt: skip
    assert ok.status_code == 200


def test_a_request_chat_template_is_used(bare_server, tokenizer):
    template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    body = {**CHAT, "chat_template": template}
    r = httpx.post(bare_server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer("<<hello>>").input_ids)
    bad = httpx.post(bare_server.url + "/v1/chat/completions",
                     json={**CHAT, "chat_template": "{% for %}"}, timeout=30)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_chat_template_flag_supplies_a_template(default_model_path, tmp_path_factory, tokenizer):
    d = _model_dir(default_model_path, tmp_path_factory, with_template=False)
    tpl = d / "my_template.jinja"
    tpl.write_text((default_model_path / "chat_template.jinja").read_text())
    with start_server(str(d), "--engine-cls", FAKE_ENGINE, "--num-kv-blocks", "64",
                      "--chat-template", str(tpl)) as srv:  # fmt: skip
        r = httpx.post(srv.url + "/tokenize", json={"messages": CHAT["messages"]}, timeout=30)
        assert r.status_code == 200, r.text
        want = tokenizer.apply_chat_template(CHAT["messages"], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        assert r.json()["tokens"] == tokenizer(want, add_special_tokens=False).input_ids
        # without --trust-request-chat-template a request's template is refused
        for path in ("/v1/chat/completions", "/tokenize"):
            refused = httpx.post(srv.url + path, json={**CHAT, "chat_template": "{{ 1 }}"},
                                 timeout=30)  # fmt: skip
            assert refused.status_code == 400, refused.text
            err = refused.json()["error"]
            assert err["param"] == "chat_template"
            assert "--trust-request-chat-template" in err["message"]
        chat = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=30).json()
        assert chat["usage"]["prompt_tokens"] == r.json()["count"]

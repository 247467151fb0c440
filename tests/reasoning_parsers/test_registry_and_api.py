"""The registry (built-ins, entry points, errors), starts_in_reasoning on rendered
prompts, the end marker and its token ids, and the docstrings of the public API."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from paternoster import plugins as plugins_module
from paternoster import reasoning_parsers
from paternoster.reasoning_parsers import (
    BUILTIN_REASONING_PARSERS,
    ReasoningParser,
    Split,
    available_reasoning_parsers,
    get_reasoning_parser,
)

from .recordings import RECORDINGS

ROOT = Path(__file__).resolve().parents[2]


def test_every_builtin_loads_and_has_recordings():
    assert sorted(BUILTIN_REASONING_PARSERS) == sorted(RECORDINGS)
    for name in BUILTIN_REASONING_PARSERS:
        cls = get_reasoning_parser(name)
        assert issubclass(cls, ReasoningParser) and cls.name == name
        assert name in available_reasoning_parsers()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_pyproject_declares_the_builtins_as_entry_points():
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["paternoster.reasoning_parsers"] == BUILTIN_REASONING_PARSERS


def test_unknown_name_lists_the_builtins():
    with pytest.raises(ValueError) as err:
        get_reasoning_parser("nope")
    message = str(err.value)
    assert "name" in message and "'nope'" in message
    for name in BUILTIN_REASONING_PARSERS:
        assert name in message


class _EntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"thirdparty:{name}", obj

    def load(self):
        return self._obj


class ThirdPartyParser(ReasoningParser):
    """Everything before ``ANSWER:`` is reasoning."""

    name = "thirdparty"
    end_text = "ANSWER:"

    def starts_in_reasoning(self, prompt_text):
        return True

    def split(self, text, in_reasoning, final):
        before, tag, after = text.partition(self.end_text)
        return Split(before, after, True) if tag else Split(before if final else "", "", False)


def test_third_party_entry_point(monkeypatch):
    eps = [_EntryPoint("thirdparty", ThirdPartyParser), _EntryPoint("broken", object)]
    monkeypatch.setattr(plugins_module, "entry_points", lambda group: eps)
    assert "thirdparty" in available_reasoning_parsers()
    got = get_reasoning_parser("thirdparty")().extract("hmm ANSWER: 4")
    assert (got.reasoning, got.content) == ("hmm ", " 4")
    with pytest.raises(ValueError, match="not a ReasoningParser subclass"):
        get_reasoning_parser("broken")


QWEN_USER = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
GPT_OSS_USER = (
    "<|start|>system<|message|>You are ChatGPT.\nReasoning: medium<|end|>"
    "<|start|>user<|message|>Hi<|end|><|start|>assistant"
)


@pytest.mark.parametrize(
    "parser,prompt,expected",
    [
        (
            "deepseek_r1",
            "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>\n",
            True,
        ),
        ("deepseek_r1", "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜>", False),
        ("qwen3", QWEN_USER, False),  # enable_thinking=True
        ("qwen3", QWEN_USER + "<think>\n\n</think>\n\n", False),  # enable_thinking=False
        ("qwen3", QWEN_USER + "<think>\n", True),  # Qwen3-Thinking-2507
        (
            "qwen3",
            "<|im_start|>assistant\n<think>\nold\n</think>\n\nold answer<|im_end|>\n" + QWEN_USER,
            False,
        ),  # history with reasoning
        ("gpt_oss", GPT_OSS_USER, False),
        ("gpt_oss", GPT_OSS_USER + "<|channel|>analysis<|message|>", True),
        ("gpt_oss", GPT_OSS_USER + "<|channel|>final<|message|>", False),
        ("gpt_oss", "no harmony at all", False),
    ],
)
def test_starts_in_reasoning(parser, prompt, expected):
    assert get_reasoning_parser(parser)().starts_in_reasoning(prompt) is expected


def test_end_text_and_special_tokens():
    assert get_reasoning_parser("deepseek_r1")().reasoning_end_text() == "</think>"
    assert get_reasoning_parser("qwen3")().reasoning_end_text() == "</think>"
    assert get_reasoning_parser("gpt_oss")().reasoning_end_text() == "<|channel|>final<|message|>"
    assert get_reasoning_parser("qwen3").skip_special_tokens is True
    assert get_reasoning_parser("gpt_oss").skip_special_tokens is False


@pytest.fixture(scope="module")
def tag_tokenizer():
    """A word-level tokenizer with ``<think>``/``</think>`` as added tokens and the
    harmony tags as special tokens (as in the Qwen3 and gpt-oss tokenizers)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "final", "analysis", "hello", "<", "/", "think", ">"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    t.add_tokens(["<think>", "</think>"])
    t.add_special_tokens({"additional_special_tokens": ["<|channel|>", "<|message|>"]})
    return t


def test_end_token_ids(tag_tokenizer):
    end_think = tag_tokenizer.convert_tokens_to_ids("</think>")
    assert get_reasoning_parser("qwen3")(tag_tokenizer).end_token_ids() == [end_think]
    assert get_reasoning_parser("deepseek_r1")(tag_tokenizer).end_token_ids() == [end_think]
    ids = get_reasoning_parser("gpt_oss")(tag_tokenizer).end_token_ids()
    assert ids == tag_tokenizer.convert_tokens_to_ids(["<|channel|>", "final", "<|message|>"])
    assert get_reasoning_parser("qwen3")().end_token_ids() is None


def test_the_end_token_ids_appear_in_a_tokenized_generation(tag_tokenizer):
    ids = tag_tokenizer.encode("hello </think> hello", add_special_tokens=False)
    end = get_reasoning_parser("qwen3")(tag_tokenizer).end_token_ids()
    assert any(ids[i : i + len(end)] == end for i in range(len(ids)))


def test_every_public_name_has_a_docstring():
    modules = [
        reasoning_parsers,
        plugins_module,
        *(sys.modules[get_reasoning_parser(n).__module__] for n in BUILTIN_REASONING_PARSERS),
        sys.modules[ReasoningParser.__module__],
    ]
    for module in modules:
        assert module.__doc__, module
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                assert obj.__doc__, f"{module.__name__}.{name}"
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if inspect.isfunction(member) and not attr.startswith("_"):
                        assert member.__doc__, f"{module.__name__}.{name}.{attr}"


def test_grammar_gate(tag_tokenizer):
    """The gate the engine gets: end and start tag ids, and whether the prompt
    opened reasoning (gpt-oss: always wait for the final channel)."""
    think = tag_tokenizer.convert_tokens_to_ids("<think>")
    end = tag_tokenizer.convert_tokens_to_ids("</think>")
    qwen3 = get_reasoning_parser("qwen3")(tag_tokenizer)
    assert qwen3.grammar_gate("<|im_start|>assistant\n") == {
        "end": [end], "start": [think], "in_reasoning": False}
    assert qwen3.grammar_gate("<|im_start|>assistant\n<think>\n")["in_reasoning"] is True
    gpt = get_reasoning_parser("gpt_oss")(tag_tokenizer)
    gate = gpt.grammar_gate("<|start|>assistant")
    assert gate["in_reasoning"] is True and gate["end"] == gpt.end_token_ids()
    assert get_reasoning_parser("qwen3")(None).grammar_gate("x") is None

"""Tool-call streaming, checked and timed in one run for every built-in parser.

For each recorded output in tests/tool_parsers/recordings.py (written from
each model family's documented format), the text is cut into the deltas a
server would stream (the default model's tokenizer, one token at a time,
decoded incrementally) and fed to the parser's streaming form. Reported per
parser: how many recordings stream exactly what :meth:`ToolParser.extract`
returns (the same content, the same calls, each call's argument fragments
concatenating to its non-streamed arguments), and the parsing cost per
delta: on the recordings, and on one long call (a 4000-character string
argument, ~1000 tokens) where a parser that rescans its text on every delta
pays the most (a decode step of the default model takes ~25 ms on 2 cores,
so this is the cost to compare it with). Usage::

    .venv/bin/python bench/tool_streaming.py
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recordings():
    path = ROOT / "tests" / "tool_parsers" / "recordings.py"
    spec = importlib.util.spec_from_file_location("recordings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WELL_FORMED


def token_deltas(tokenizer, text: str) -> list[str]:
    """``text`` as the per-token deltas incremental detokenization yields."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    out, prev = [], ""
    for i in range(1, len(ids) + 1):
        cur = tokenizer.decode(ids[:i])
        if cur.endswith("\ufffd"):  # a partial UTF-8 sequence: wait for the rest
            continue
        out.append(cur[len(prev):])
        prev = cur
    if prev != text:  # the tokenizer does not round-trip: fall back to characters
        return list(text)
    return out


def stream(parser, deltas: list[str]) -> tuple[str, list[tuple[str, str]], float]:
    """Feed ``deltas``: (content, [(name, arguments)], seconds spent parsing)."""
    s = parser.streaming()
    content, calls = "", {}
    start = time.perf_counter()
    parts = [s.feed(d) for d in deltas] + [s.finish()]
    elapsed = time.perf_counter() - start
    for p in parts:
        content += p.content or ""
        for item in p.tool_calls:
            if item.name is not None:
                calls[item.index] = [item.name, ""]
            calls[item.index][1] += item.arguments
    return content, [tuple(c) for _, c in sorted(calls.items())], elapsed


def long_call(name: str) -> str | None:
    """One call of ``get_weather`` with a 4000-character argument in ``name``'s format."""
    args = {"city": "Paris " * 666 + "!!!!", "days": 3}
    j = json.dumps(args)
    return {
        "hermes": f'<tool_call>\n{{"name": "get_weather", "arguments": {j}}}\n</tool_call>',
        "llama3_json": f'{{"name": "get_weather", "parameters": {j}}}',
        "mistral": f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {j}}}]',
        "openai": ("<|channel|>commentary to=functions.get_weather <|constrain|>json"
                   f"<|message|>{j}<|call|>"),
        "pythonic": f'[get_weather(city="{args["city"]}", days=3)]',
        "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                        f"{args['city']}\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                        "</function>\n</tool_call>"),
    }.get(name)  # fmt: skip


def main() -> None:
    from transformers import AutoTokenizer

    from paternoster.entrypoints.engine_args import resolve_model_dir
    from paternoster.tool_parsers import BUILTIN_TOOL_PARSERS, get_tool_parser

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    recordings = _recordings()
    print("| parser | recordings streamed = extract | deltas | us/delta (recordings) "
          "| long call: deltas | us/delta |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted(BUILTIN_TOOL_PARSERS):
        cls = get_tool_parser(name)
        ok = total = n_deltas = 0
        seconds = 0.0
        for _label, tools, text, *_ in recordings.get(name, []):
            parser = cls(tools=tools, seed=0)
            found = parser.extract(text)
            deltas = token_deltas(tokenizer, text)
            content, calls, t = stream(parser, deltas)
            total += 1
            n_deltas += len(deltas)
            seconds += t
            ok += (content or None) == found.content and calls == [
                (c.name, c.arguments) for c in found.calls]  # fmt: skip
        text = long_call(name)
        cell = "| - | - |"
        if text is not None:
            deltas = token_deltas(tokenizer, text)
            _, calls, t = stream(cls(seed=0), deltas)
            assert calls and calls[0][0] == "get_weather", (name, calls[:1])
            cell = f"| {len(deltas)} | {t / len(deltas) * 1e6:.0f} |"
        per = seconds / max(n_deltas, 1) * 1e6
        print(f"| {name} | {ok}/{total} | {n_deltas} | {per:.0f} {cell}")


if __name__ == "__main__":
    main()

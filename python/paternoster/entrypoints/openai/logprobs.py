"""Engine logprobs to OpenAI's two response shapes.

- legacy completions: ``{tokens, token_logprobs, top_logprobs, text_offset}``,
  ``top_logprobs`` a ``{token text: logprob}`` map per position holding the
  ``logprobs`` most likely tokens plus the chosen one;
- chat: ``{content: [{token, logprob, bytes, top_logprobs: [...]}]}`` with
  exactly ``top_logprobs`` alternatives.

A token's text is the tokenizer's own rendering of that one token (special
tokens included); its bytes are the exact bytes it stands for (byte-level BPE
and ``<0xNN>`` byte tokens decode exactly, so a character split over two
tokens shows as its two halves), else the UTF-8 of its text.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from paternoster.entrypoints.openai.protocol_outputs import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from paternoster.logprobs import Logprobs

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """Text and bytes of single tokens, cached.

    Args:
        tokenizer: a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self.text = functools.lru_cache(maxsize=1 << 16)(self._text)
        self.bytes = functools.lru_cache(maxsize=1 << 16)(self._bytes)

    def _text(self, token_id: int) -> str:
        """The token's text (``str``)."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if token is None:
            return ""
        return self.tokenizer.convert_tokens_to_string([token])

    def _bytes(self, token_id: int) -> list[int]:
        """The bytes the token stands for (``list[int]``, each 0..255)."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if token is None:
            return []
        if self._byte_level:
            table = _byte_level_decoder()
            if all(c in table for c in token):
                return [table[c] for c in token]
        m = _BYTE_TOKEN.match(token)
        if m:
            return [int(m.group(1), 16)]
        return list(self.text(token_id).encode("utf-8"))


class CompletionLogprobsBuilder:
    """Builds one choice's legacy ``logprobs``, piece by piece (streaming) or at
    once; character offsets run on across pieces.

    Args:
        texts: token texts.
    """

    def __init__(self, texts: TokenTexts):
        self.texts = texts
        self.offset = 0

    def prompt(self, token_ids: list[int], logprobs: Logprobs | None) -> CompletionLogprobs:
        """An echoed prompt: the first token has no logprob; ``logprobs`` covers
        tokens ``1..P-1`` (``None`` or short: the rest have none either)."""
        out = CompletionLogprobs()
        lp = logprobs or Logprobs()
        for i, t in enumerate(token_ids):
            j = i - 1
            if 0 <= j < len(lp):
                self._add(out, t, lp.token_logprobs[j], lp.top_token_ids[j], lp.top_logprobs[j])
            else:
                self._add(out, t, None, None, None)
        return out

    def generated(self, token_ids: list[int], logprobs: Logprobs | None) -> CompletionLogprobs:
        """Generated tokens with one logprob position each."""
        out = CompletionLogprobs()
        lp = logprobs or Logprobs()
        for i, t in enumerate(token_ids):
            if i < len(lp):
                self._add(out, t, lp.token_logprobs[i], lp.top_token_ids[i], lp.top_logprobs[i])
            else:
                self._add(out, t, None, None, None)
        return out

    def _add(self, out: CompletionLogprobs, token: int, logprob: float | None,
             top_ids: list[int] | None, top_lps: list[float] | None) -> None:
        text = self.texts.text(token)
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.text_offset.append(self.offset)
        self.offset += len(text)
        if logprob is None:
            out.top_logprobs.append(None)
            return
        top = {self.texts.text(i): v for i, v in zip(top_ids or [], top_lps or [])}
        top.setdefault(text, logprob)  # the chosen token is always listed (OpenAI)
        out.top_logprobs.append(top)


def merge_completion_logprobs(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    """``a`` followed by ``b`` (a new object)."""
    return CompletionLogprobs(
        tokens=a.tokens + b.tokens,
        token_logprobs=a.token_logprobs + b.token_logprobs,
        top_logprobs=a.top_logprobs + b.top_logprobs,
        text_offset=a.text_offset + b.text_offset,
    )


def chat_logprobs(texts: TokenTexts, token_ids: list[int],
                  logprobs: Logprobs | None) -> ChatLogprobs:
    """Chat ``logprobs`` of generated tokens (one logprob position per token;
    tokens without one are left out)."""
    lp = logprobs or Logprobs()
    content = []
    for i, t in enumerate(token_ids[: len(lp)]):
        top = [
            TopLogprob(token=texts.text(k), logprob=v, bytes=texts.bytes(k))
            for k, v in zip(lp.top_token_ids[i], lp.top_logprobs[i])
        ]
        content.append(
            ChatTokenLogprob(token=texts.text(t), logprob=lp.token_logprobs[i],
                             bytes=texts.bytes(t), top_logprobs=top)
        )
    return ChatLogprobs(content=content)

"""Incremental detokenization and stop-string matching.

Both turn a growing token stream into text deltas that never need taking back:
the detokenizer holds back text that may still be an incomplete multi-byte
character, the stop-string matcher holds back text that may still become a
stop string.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as left context: some tokenizers (SentencePiece) render a
# token's leading space only when something precedes it.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Decodes generated tokens a few at a time into stable text deltas.

    It keeps a short window of token ids: ``[0, read)`` are tokens whose text
    was already emitted (the left context), ``[read, len)`` are tokens not yet
    emitted. Each call decodes the window twice, with and without the new
    tokens, and emits the difference unless the decoded text ends with U+FFFD
    (a multi-byte character split across tokens); then the window slides.

    Args:
        tokenizer: a Hugging Face tokenizer (``decode`` is all that is used).
        prompt_token_ids: the prompt; its last few tokens seed the context.
        skip_special_tokens: drop special tokens (EOS, chat markers) from text.
    """

    def __init__(
        self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._read = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def _delta(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix = self._decode(self._ids[: self._read])
        full = self._decode(self._ids)
        if len(full) <= len(prefix) or (not final and full.endswith(REPLACEMENT_CHAR)):
            return ""
        # Slide: what was unread becomes the context of the next call.
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        return full[len(prefix) :]

    def add(self, token_ids: list[int]) -> str:
        """Append generated tokens.

        Args:
            token_ids: new token ids (any number, usually one).
        Returns:
            Newly stable text (possibly ``""``); never ends inside a
            multi-byte character.
        """
        self._ids.extend(token_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """Text still held back (e.g. an unfinished byte sequence, rendered
        with U+FFFD); call once when the sequence ends.

        Returns:
            The remaining text (possibly ``""``).
        """
        return self._delta(final=True)


class StopStringMatcher:
    """Finds stop strings in a stream of text deltas without leaking them.

    Text that could be the start of a stop string is held back until it either
    completes a stop string (then the text is cut before it) or cannot anymore
    (then it is released). At most ``max(len(stop)) - 1`` characters are held.

    Args:
        stops: stop strings (non-empty). An empty list makes :meth:`feed` a
            pass-through.
        include_stop: keep the matched stop string at the end of the text
            (vLLM's ``include_stop_str_in_output``).
    Raises:
        ValueError: an empty stop string.
    """

    def __init__(self, stops: list[str], include_stop: bool = False):
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = list(stops)
        self.include_stop = include_stop
        self._max_hold = max((len(s) for s in self.stops), default=1) - 1
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add the next piece of text.

        Args:
            text: the next text delta.
        Returns:
            ``(safe_text, matched)``: the text that can be emitted now, and the
            stop string that was found (``None`` if none). When several could
            match, the one that ends first wins (then the longest). After a match the
            stream is over: the text from the stop string on (after it, with
            ``include_stop``) is dropped and later calls return ``("", matched)``.
        """
        if self.matched is not None:
            return "", self.matched
        if not self.stops:
            return text, None
        s = self._held + text
        # The stop string that completes first wins (ties: the longest), so the
        # result does not depend on how the text was split into deltas.
        best: tuple[int, int, str] | None = None
        for stop in self.stops:
            i = s.find(stop)
            if i >= 0:
                key = (i + len(stop), i, stop)
                if best is None or key[:2] < best[:2]:
                    best = key
        if best is not None:
            self._held = ""
            self.matched = best[2]
            return s[: best[0] if self.include_stop else best[1]], self.matched
        hold = self._partial_suffix_len(s)
        self._held = s[len(s) - hold :] if hold else ""
        return s[: len(s) - hold], None

    def _partial_suffix_len(self, s: str) -> int:
        """Length of the longest suffix of ``s`` that is a proper prefix of a stop."""
        for k in range(min(self._max_hold, len(s)), 0, -1):
            tail = s[-k:]
            if any(stop.startswith(tail) for stop in self.stops):
                return k
        return 0

    def flush(self) -> str:
        """Release the held text when the stream ends without a match.

        Returns:
            The held text (``""`` after a match).
        """
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

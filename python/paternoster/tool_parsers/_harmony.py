"""A text-level reader of OpenAI's harmony format (gpt-oss), shared by the
``openai`` tool parser and the ``gpt_oss`` reasoning parser.

Written from the format's description (https://cookbook.openai.com/articles/openai-harmony).
A message is a header, ``<|message|>``, a body and a terminator (the messages
follow each other with no newline; the second header is wrapped here)::

    <|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
        <|message|>{"city":"Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

The header names the channel (``analysis``: chain of thought; ``commentary``:
function calls and preambles; ``final``: the answer), a recipient
(``to=functions.NAME``, before or after the channel) and a content type
(``<|constrain|>json``, or a bare word). The terminator is ``<|end|>``,
``<|return|>`` (end of the answer) or ``<|call|>`` (end of a tool call). The
generation prompt ends with ``<|start|>assistant``, so the model's first header
has no ``<|start|>``. Detokenize with special tokens kept: these tags are special
tokens.

Why not the ``openai-harmony`` package: it installs from PyPI, but its encoding
needs the o200k vocabulary file, which it downloads on first use; on a machine
without internet access (``HarmonyError: error downloading or loading vocab
file``) it cannot load at all, and the tags are all this reader needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from paternoster.tool_parsers.base import partial_tag_len

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
TERMINATORS = ("<|end|>", "<|return|>", "<|call|>")
TAGS = (START, CHANNEL, MESSAGE, CONSTRAIN, *TERMINATORS)
_HEADER_START = re.compile(re.escape(START) + "|" + re.escape(CHANNEL))
# A body ends at a terminator, or at a header the model began without one.
_BODY_END = re.compile("|".join(re.escape(t) for t in (*TERMINATORS, START, CHANNEL)))


@dataclass(frozen=True)
class Message:
    """One harmony message as read so far.

    ``header_done`` is False while the header is incomplete (nothing else is
    known then). ``body`` excludes the terminator; while the message is open
    (``closed`` False) it excludes a suffix that may begin a tag, too. ``raw`` is
    the message's text from its header through its terminator (or as far as the
    body goes); ``start`` its offset in the text.
    """

    start: int
    raw: str
    header_done: bool = False
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    body: str = ""
    closed: bool = False


def parse_header(header: str) -> tuple[str | None, str | None, str | None]:
    """``(channel, recipient, content_type)`` of a header's text (the text
    between the message's start and ``<|message|>``, tags included)."""
    if header.startswith(START):
        header = header[len(START) :]
    role, has_channel, rest = header.partition(CHANNEL)
    content_type = None
    if CONSTRAIN in rest:
        rest, _, content_type = rest.partition(CONSTRAIN)
        content_type = content_type.strip() or None
    recipient = next((w[3:] for w in role.split() + rest.split() if w.startswith("to=")), None)
    words = [w for w in rest.split() if not w.startswith("to=")]
    channel = words[0] if has_channel and words else None
    if content_type is None and len(words) > 1:
        content_type = words[1]
    return channel, recipient, content_type


def read_body(text: str, start: int, body_start: int, final: bool, **header) -> Message:
    """The message whose body begins at ``body_start`` (its header at ``start``)."""
    m = _BODY_END.search(text, body_start)
    if m is None:
        body = text[body_start:]
        if not final:
            body = body[: len(body) - partial_tag_len(body, TAGS)]
        return Message(
            start, text[start : body_start + len(body)], True, body=body, closed=False, **header
        )
    end = m.end() if m.group() in TERMINATORS else m.start()
    return Message(
        start, text[start:end], True, body=text[body_start : m.start()], closed=True, **header
    )


def scan(text: str, final: bool, open_channel: str | None = None) -> list[str | Message]:
    """Split ``text`` into bare text (outside any message) and :class:`Message` items.

    Args:
        final: the text is complete; otherwise a suffix that may begin a tag is
            held back, and an incomplete header is reported as a last item with
            ``header_done`` False.
        open_channel: the prompt ended inside a message of this channel (after
            its ``<|message|>``): the text begins with that message's body.
    """
    items: list[str | Message] = []
    pos = 0
    if open_channel is not None:
        msg = read_body(text, 0, 0, final, channel=open_channel)
        items.append(msg)
        if not msg.closed:
            return items
        pos = len(msg.raw)
    while pos < len(text):
        m = _HEADER_START.search(text, pos)
        if m is None or m.start() > pos:
            bare = text[pos : m.start() if m else len(text)]
            if m is None and not final:
                bare = bare[: len(bare) - partial_tag_len(bare, TAGS)]
            items.append(bare)
            if m is None:
                break
            pos = m.start()
        j = text.find(MESSAGE, pos)
        if j < 0:  # the header is not complete
            if not final:
                items.append(Message(pos, text[pos:]))
            break  # a header cut short at the end holds no text
        channel, recipient, content_type = parse_header(text[pos:j])
        msg = read_body(
            text,
            pos,
            j + len(MESSAGE),
            final,
            channel=channel,
            recipient=recipient,
            content_type=content_type,
        )
        items.append(msg)
        if not msg.closed:
            break
        pos += len(msg.raw)
    return items

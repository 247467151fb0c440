"""Input processing: prompts to token ids, and the one validation of every limit.

Every protocol (OpenAI HTTP, the ZeroMQ client protocol, the offline ``LLM``)
hands its prompt and sampling fields to one :class:`InputProcessor`, so a
limit is checked in exactly one place: token ids against the vocabulary, the
prompt plus ``max_tokens`` against the context, the default ``max_tokens``,
``n``, the number of stop strings, and every sampling field's range (by
:class:`SamplingParams` itself). Failures raise :class:`InvalidRequestError`
naming the field; each protocol maps it onto its own error.

The engine checks the context limit once more when a request arrives
(``EngineCore.add_request``): that is the engine's own invariant, not a user
error path, and a frontend that validated never trips it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paternoster.frontend.chat import ChatTemplateError, render_chat
from paternoster.frontend.errors import InvalidRequestError
from paternoster.request import check_slo_target
from paternoster.sampling_params import MAX_N, SamplingParams

DEFAULT_MAX_STOP = 64
MAX_TENANT_LENGTH = 256
"""The longest tenant name (characters): the OpenAI ``user`` field, the
``X-Tenant-Id`` header, the ZeroMQ ``tenant`` field, ``LLM.generate(tenant=)``."""
_PARAM_RE = re.compile(r"^(\w+)(?:\.[\w.]+)?(?: keys| values)? must")

# Roles whose messages must carry content (OpenAI answers 400 without it);
# an assistant message may have none (it then carries tool calls).
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


@dataclass(frozen=True)
class ChatInput:
    """Chat messages and how they become a prompt.

    Attributes:
        messages: ``[{"role": str, "content": str | None, ...}]``, content
            already flattened to text.
        chat_template: a Jinja template replacing the server's and the
            model's own, or ``None``.
        add_generation_prompt: end the prompt with the assistant turn's header.
        continue_final_message: leave the last (assistant) message open.
        add_special_tokens: let the tokenizer add BOS etc. (never a second BOS).
        tools: OpenAI ``tools`` items (``{"type": "function", "function":
            {...}}``) for the template to render, or ``None``.
        template_kwargs: extra template variables (``chat_template_kwargs``).
    """

    messages: list[dict[str, Any]]
    chat_template: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None


class InputProcessor:
    """Tokenizes prompts and validates requests against the model's limits.

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: token ids must lie in ``[0, vocab_size)``.
        max_model_len: prompt plus completion must fit in this many tokens.
        chat_template: the server's chat template (``--chat-template``), or
            ``None`` for the model's own.
        max_n: the largest ``n`` (``--max-n``).
        max_stop: the most stop strings a request may carry.
    Raises:
        ValueError: ``max_n`` outside ``[1, MAX_N]`` or a negative ``max_stop``.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int,
                 chat_template: str | None = None, max_n: int = MAX_N,
                 max_stop: int = DEFAULT_MAX_STOP):  # fmt: skip
        if not 1 <= max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {max_n}")
        if max_stop < 0:
            raise ValueError(f"max_stop must be >= 0, got {max_stop}")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.chat_template = chat_template
        self.max_n = max_n
        self.max_stop = max_stop

    # ---------------------------------------------------------------- prompts

    def tokenize(self, text: str, add_special_tokens: bool = True,
                 param: str = "prompt") -> list[int]:  # fmt: skip
        """Token ids of ``text``.

        Raises:
            InvalidRequestError: not valid Unicode, or no tokens (naming ``param``).
        """
        check_text(text, param)
        ids = list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
        if not ids:
            raise InvalidRequestError(f"{param} must not be empty", param)
        return ids

    def check_token_ids(self, ids: Sequence[int], param: str = "prompt") -> list[int]:
        """``ids`` as a list, checked: non-empty and inside the vocabulary.

        Raises:
            InvalidRequestError: naming ``param``.
        """
        if not ids:
            raise InvalidRequestError(f"{param} must not be empty", param)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token id {bad[0]} is out of range [0, {self.vocab_size})", param
            )
        return list(ids)

    def prompt(self, prompt: str | Sequence[int], add_special_tokens: bool = True,
               param: str = "prompt") -> list[int]:  # fmt: skip
        """Token ids of a text prompt, or the given ids checked.

        Raises:
            InvalidRequestError: naming ``param``.
        """
        if isinstance(prompt, str):
            return self.check_token_ids(self.tokenize(prompt, add_special_tokens, param), param)
        return self.check_token_ids(prompt, param)

    def chat(self, chat: ChatInput) -> tuple[str, list[int]]:
        """Messages through the chat template (the request's, the server's or
        the model's).

        Returns:
            ``(prompt text, token ids)``.
        Raises:
            InvalidRequestError: no messages, a message without content whose
                role needs it (naming ``messages[i].content``, as OpenAI),
                text that is not valid Unicode, or a template error (naming
                the field at fault).
        """
        if not chat.messages:
            raise InvalidRequestError("messages must not be empty", "messages")
        for i, m in enumerate(chat.messages):
            role, content = m.get("role"), m.get("content")
            check_text(role or "", "messages")
            if content is None and role in _CONTENT_REQUIRED:
                raise InvalidRequestError(
                    f"messages[{i}].content is missing: a '{role}' message must have content",
                    f"messages[{i}].content",
                )
            check_text(content or "", "messages")
        converted = [{**m, "content": m.get("content") or ""} for m in chat.messages]
        if chat.chat_template is not None:
            check_text(chat.chat_template, "chat_template")
        try:
            text, ids = render_chat(
                self.tokenizer, converted,
                chat_template=chat.chat_template or self.chat_template,
                add_generation_prompt=chat.add_generation_prompt,
                continue_final_message=chat.continue_final_message,
                add_special_tokens=chat.add_special_tokens,
                tools=chat.tools, template_kwargs=chat.template_kwargs,
            )  # fmt: skip
        except ChatTemplateError as e:
            raise InvalidRequestError(str(e), e.param) from e
        return text, self.check_token_ids(ids, "messages")

    # --------------------------------------------------------------- sampling

    def sampling_params(self, fields: Mapping[str, Any], prompt_lens: Sequence[int],
                        default_max_tokens: int | None = None,
                        prompt_param: str = "prompt") -> SamplingParams:  # fmt: skip
        """Validated :class:`SamplingParams` for prompts of ``prompt_lens`` tokens.

        ``max_tokens`` left out (or ``None``) becomes ``default_max_tokens``
        capped by the room the longest prompt leaves, or all of that room when
        there is no default (chat, as OpenAI).

        Args:
            fields: :class:`SamplingParams` fields by name (absent: default).
            prompt_lens: each prompt's length in tokens.
            default_max_tokens: the protocol's default ``max_tokens``.
            prompt_param: the field a prompt too long for the context is
                reported under (``messages`` for chat).
        Raises:
            InvalidRequestError: naming the field: ``n`` over ``max_n``, too
                many ``stop`` strings, a value out of range, token ids outside
                the vocabulary, or a prompt plus ``max_tokens`` over the context.
        """
        fields = dict(fields)
        n = fields.get("n", 1)
        if isinstance(n, int) and n > self.max_n:
            raise InvalidRequestError(f"n must be at most {self.max_n}, got {n}", "n")
        stop = fields.get("stop")
        if isinstance(stop, str):
            fields["stop"] = stop = [stop]
        if isinstance(stop, list) and len(stop) > self.max_stop:
            raise InvalidRequestError(
                f"stop may hold at most {self.max_stop} strings, got {len(stop)}", "stop"
            )
        longest = max(prompt_lens)
        room = self.max_model_len - longest
        if fields.get("max_tokens") is None:
            max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
            fields["max_tokens"] = max_tokens if room >= 1 else None  # None: say it is too long
        try:
            params = SamplingParams(**fields).prepare(self.tokenizer)
        except ValueError as e:
            raise InvalidRequestError(str(e), param_of(e)) from e
        except TypeError as e:  # an unknown field: a protocol mapping bug, not user input
            raise InvalidRequestError(str(e)) from e
        self._check_limits(params, longest, prompt_param)
        return params

    def fit(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """Already validated ``params`` fitted to a prompt of ``prompt_len``
        tokens: ``max_tokens=None`` becomes all the room left (the offline
        ``LLM``'s "up to the context"), then the limits are checked.

        Raises:
            InvalidRequestError: as :meth:`sampling_params`.
        """
        room = self.max_model_len - prompt_len
        if params.max_tokens is None and room >= 1:
            params = dataclasses.replace(params, max_tokens=room)
        self._check_limits(params, prompt_len)
        return params

    def _check_limits(self, params: SamplingParams, prompt_len: int,
                      prompt_param: str = "prompt") -> None:  # fmt: skip
        """Token ids against the vocabulary, prompt plus ``max_tokens`` against
        the context (the message gives both lengths, as OpenAI's does)."""
        try:
            params.check_token_ids(self.vocab_size)
        except ValueError as e:
            raise InvalidRequestError(str(e), param_of(e)) from e
        limit = self.max_model_len
        if params.max_tokens is None:
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens, but the prompt "
                f"has {prompt_len} tokens, leaving no room for the completion. "
                "Please reduce the length of the prompt.",
                prompt_param,
            )
        if prompt_len + params.max_tokens > limit:
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the "
                f"prompt, {params.max_tokens} for the completion). Please reduce the length "
                "of the prompt or max_tokens.",
                prompt_param if prompt_len >= limit else "max_tokens",  # what alone is too long
            )


def check_text(text: str, param: str) -> None:
    """Refuse text that is not valid Unicode (e.g. lone UTF-16 surrogates).

    Raises:
        InvalidRequestError: naming ``param``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{param} is not valid Unicode text: {e.reason}", param) from None


def check_tenant(tenant: object, param: str) -> str | None:
    """A tenant name, validated: ``None`` (the anonymous tenant) or a
    non-empty string of at most :data:`MAX_TENANT_LENGTH` printable
    characters that neither begins nor ends with a space.

    *Printable* is :meth:`str.isprintable`: no control characters (C0, DEL,
    C1), format characters (zero-width, bidirectional marks), surrogates,
    private-use or unassigned code points, and no separator but the ASCII
    space. A name is a ``tenant`` label in ``/metrics`` and a key in logs and
    the ``fair`` scheduler, so whatever could corrupt or disguise those is
    refused, not cleaned (the error gives the code point, never the character).

    Args:
        tenant: the value given.
        param: the field it came from (``user``, the header's name, ``tenant``),
            named in errors.
    Returns:
        ``tenant`` unchanged.
    Raises:
        InvalidRequestError: anything else, naming ``param``.
    """
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not tenant:
        raise InvalidRequestError(f"{param} must be a non-empty string, got {tenant!r}", param)
    if len(tenant) > MAX_TENANT_LENGTH:
        raise InvalidRequestError(
            f"{param} must be at most {MAX_TENANT_LENGTH} characters, got {len(tenant)}", param
        )
    if not tenant.isprintable():
        at, c = next((i, c) for i, c in enumerate(tenant) if not c.isprintable())
        raise InvalidRequestError(
            f"{param} must hold printable characters only, got U+{ord(c):04X} at "
            f"position {at}", param,
        )  # fmt: skip
    if tenant[0] == " " or tenant[-1] == " ":
        raise InvalidRequestError(f"{param} must not begin or end with a space", param)
    return tenant


def wire_tenant(tenant: str | None, param: str) -> str | None:
    """The tenant of a served request (HTTP ``user`` / ``X-Tenant-Id``, the
    ZeroMQ ``tenant`` field): an empty string is no tenant, the anonymous one
    (OpenAI accepts ``user: ""``), so both transports read it alike; any other
    name must pass :func:`check_tenant`.

    Raises:
        InvalidRequestError: as :func:`check_tenant`, naming ``param``.
    """
    return check_tenant(tenant or None, param)


def param_of(error: ValueError) -> str | None:
    """The field a :class:`SamplingParams` ``ValueError`` names (its first word)."""
    m = _PARAM_RE.match(str(error))
    return m.group(1) if m else None


def per_prompt(value: Any, n: int, name: str, single: type | tuple[type, ...]) -> list[Any]:
    """An offline argument given once for all ``n`` prompts or once per prompt.

    Args:
        value: ``None`` or an instance of ``single`` (repeated ``n`` times),
            or a list or tuple of ``n`` values.
        n: prompts.
        name: the argument's name, for the errors ("tenant", "priority").
        single: the type(s) of one value.
    Returns:
        ``n`` values; a sequence's items are unchecked.
    Raises:
        InvalidRequestError: neither ``None``, a ``single`` nor a list/tuple
            (a string where a number is expected is not read as a sequence of
            characters), or a sequence of another length.
    """
    if value is None or (isinstance(value, single) and not isinstance(value, bool)):
        return [value] * n
    if not isinstance(value, (list, tuple)):
        raise InvalidRequestError(
            f"{name} must be one value or a list of one per prompt, got {type(value).__name__}")
    if len(value) != n:
        raise InvalidRequestError(f"got {len(value)} {name} values for {n} prompts")
    return list(value)


def check_priority(value: Any, name: str = "priority") -> int:
    """An offline request's priority: ``None`` (0) or an int (not a bool).

    Raises:
        InvalidRequestError: any other type, naming ``name``.
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {type(value).__name__}")
    return value


def slo_targets(slo_ttft_s: Any, slo_itl_s: Any, n: int) -> list[tuple[float | None, float | None]]:
    """``(slo_ttft_s, slo_itl_s)`` for each of ``n`` prompts, each argument
    given once for all or once per prompt (``LLM.generate``).

    Raises:
        ValueError: a sequence of another length, or a target that is not a
            number of seconds > 0 (naming the argument).
    """
    ttft, itl = (
        [check_slo_target(v, name) for v in per_prompt(value, n, name, (int, float))]
        for name, value in (("slo_ttft_s", slo_ttft_s), ("slo_itl_s", slo_itl_s))
    )
    return list(zip(ttft, itl))


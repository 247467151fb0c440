"""Chat messages to a prompt through the model's chat template.

The template comes from, in order: the request (``chat_template``), the
server (``--chat-template FILE``), or the tokenizer (the model's own
``chat_template``). The rendered text is tokenized without the tokenizer's
special tokens by default (as vLLM and ``apply_chat_template(tokenize=True)``
do): the template writes any BOS itself. When special tokens are asked for
and the text already starts with the BOS token, it is not added twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# apply_chat_template's own arguments, which chat_template_kwargs may not shadow.
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "tokenize",
    "add_generation_prompt", "continue_final_message", "return_dict", "return_tensors",
    "padding", "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask",
})


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: no template, or the template failed.

    Attributes:
        param: the request field at fault (``"chat_template"`` or ``"messages"``).
    """

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def load_chat_template(path: str | Path) -> str:
    """Read a Jinja chat template from a file (``--chat-template FILE``).

    Returns:
        The template text.
    Raises:
        ValueError: the file does not exist, cannot be read or is empty.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read chat template {str(p)!r}: {e.strerror or e}") from e
    if not text.strip():
        raise ValueError(f"chat template {str(p)!r} is empty")
    return text


def has_chat_template(tokenizer: Any, chat_template: str | None = None) -> bool:
    """True when ``chat_template`` is given or the tokenizer has its own."""
    return bool(chat_template or getattr(tokenizer, "chat_template", None))


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    add_special_tokens: bool = False,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """Render a conversation and tokenize it.

    Args:
        tokenizer: a Hugging Face tokenizer.
        messages: ``{"role", "content", ...}`` maps (system/user/assistant/...).
        chat_template: a Jinja template overriding the tokenizer's own.
        add_generation_prompt: end with the assistant turn's header, so the
            model answers (default; the usual case).
        continue_final_message: leave the last message open so the model
            continues it (the last message must be the assistant's; excludes
            ``add_generation_prompt``).
        add_special_tokens: let the tokenizer add its special tokens (BOS...)
            to the rendered text; a BOS the template wrote is never doubled.
        tools: OpenAI ``tools`` items, rendered by templates that support
            tools (HF's ``apply_chat_template(tools=...)``); others ignore them.
        template_kwargs: extra variables for the template (``enable_thinking``
            and the like); names the renderer itself uses are refused.
    Returns:
        ``(text, token ids)``.
    Raises:
        ChatTemplateError: no template at all (param ``chat_template``), both
            ``add_generation_prompt`` and ``continue_final_message`` set, or
            the template failed on these messages (param ``messages``), or a
            template variable that shadows a renderer argument (param
            ``chat_template_kwargs``).
    """
    if not has_chat_template(tokenizer, chat_template):
        raise ChatTemplateError(
            "this model has no chat template: start the server with --chat-template FILE "
            "(or with --trust-request-chat-template and pass chat_template in the "
            "request), or use /v1/completions",
            "chat_template",
        )
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt cannot both be true; "
            "set add_generation_prompt to false",
            "continue_final_message",
        )
    if continue_final_message and (not messages or messages[-1].get("role") != "assistant"):
        raise ChatTemplateError(
            "continue_final_message needs an assistant message last", "continue_final_message"
        )
    reserved = sorted(set(template_kwargs or ()) & _RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise ChatTemplateError(
            f"chat_template_kwargs must not set {reserved[0]!r}: it is a request field "
            "or the renderer's own argument", "chat_template_kwargs")  # fmt: skip
    kwargs: dict[str, Any] = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    if continue_final_message:
        kwargs["continue_final_message"] = True
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **kwargs,
        )  # fmt: skip
    except Exception as e:  # a template may raise on roles or orders it does not know
        raise ChatTemplateError(f"cannot apply the chat template: {e}", "messages") from e
    if not isinstance(text, str):
        raise ChatTemplateError("the chat template did not render text", "chat_template")
    bos = getattr(tokenizer, "bos_token", None)
    if add_special_tokens and bos and text.startswith(bos):
        add_special_tokens = False  # the template wrote the BOS: don't add a second one
    return text, list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

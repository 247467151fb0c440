"""Structured outputs: constrain generation to a JSON schema, a regular
expression, a choice of strings or an EBNF grammar, with xgrammar (Dong et
al. 2024, "XGrammar: Flexible and Efficient Structured Generation Engine for
Large Language Models", arXiv:2411.15100; the default backend of vLLM,
SGLang and TensorRT-LLM).

A request carries its constraint as ``SamplingParams.structured_outputs``,
a map with exactly one of vLLM's keys:

- ``json``: a JSON schema (a dict, or its JSON text; properties are
  generated in the schema's order); the output is compact
  JSON (``", "`` and ``": "`` separators, no other whitespace: a free choice
  of whitespace lets small models pad forever);
- ``json_object``: ``True``: any JSON object (OpenAI's ``response_format``
  ``{"type": "json_object"}``);
- ``regex``: a regular expression the whole output matches;
- ``choice``: a non-empty list of strings, the output is one of them;
- ``grammar``: an EBNF grammar (xgrammar's GBNF dialect, rule ``root``).

and, for a reasoning model, optionally ``reasoning``: ``{"end": [token ids],
"start": [token id] or [], "in_reasoning": bool}``, the reasoning gate
(:mod:`paternoster.reasoning_gate`): the constraint applies to the answer
after the reasoning (from the token after ``end``), never to the reasoning;
``start`` (one token at most) may open the reasoning at the first token.
The gate is per request state, not part of the compiled grammar (grammars are
cached by the constraint alone).

:func:`normalize_spec` checks the map's shape without xgrammar (the engine
and the wire call it); :func:`check_spec` parses the constraint with xgrammar
(the frontend calls it, so a bad schema is a 400 naming it);
:class:`GrammarCompiler` compiles specs against the model's vocabulary (the
engine, cached by spec) and :class:`GrammarState` follows one request's
output through a ``GrammarMatcher``. The token mask is applied by the sampler
(:mod:`paternoster.model.sampler`).

xgrammar is an optional dependency (``make install`` installs it; with pip:
``pip install xgrammar``); a request with a constraint gets a clear error
without it.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from paternoster.reasoning_gate import ReasoningGate, normalize_gate

logger = logging.getLogger(__name__)

#: The constraint keys of a ``structured_outputs`` map (exactly one per request).
SPEC_KEYS = ("json", "json_object", "regex", "choice", "grammar")
#: The optional key of a ``structured_outputs`` map holding the reasoning gate.
GATE_KEY = "reasoning"
#: Longest constraint text accepted (characters of the schema, regex or grammar).
MAX_SPEC_CHARS = 1 << 20


def _xgrammar():
    """The xgrammar module. Raises ValueError (a 400 for a request) when not installed."""
    try:
        import xgrammar
    except ImportError as e:
        raise ValueError("structured outputs need the xgrammar package, which is not "
                         "installed (make install installs it; or pip install xgrammar)") from e
    return xgrammar


def normalize_spec(spec: Any) -> dict[str, Any]:
    """A ``structured_outputs`` map in canonical form: one key of
    :data:`SPEC_KEYS` first; ``json`` as compact JSON text, key order kept
    (the order properties are generated in); then, if given (not None), the
    reasoning gate under :data:`GATE_KEY` (``"reasoning"``) with all its keys:
    ``{"end": [token ids, at least one], "start": [] or [one token id],
    "in_reasoning": bool}`` (``start`` default ``[]``, ``in_reasoning``
    default false; see :mod:`paternoster.reasoning_gate`).

    Raises:
        ValueError: naming ``structured_outputs`` or ``structured_outputs.<key>``:
            not a map, no or several constraint keys, an unknown key, a value of
            the wrong type, an empty or oversized one, a bad gate (naming
            ``structured_outputs.reasoning[.<key>]``: e.g. a start tag of
            several tokens).
    """
    if not isinstance(spec, dict):
        raise ValueError(f"structured_outputs must be an object with one of "
                         f"{', '.join(SPEC_KEYS)}, got {type(spec).__name__}")
    gate = spec.get(GATE_KEY)
    if GATE_KEY in spec:
        spec = {k: v for k, v in spec.items() if k != GATE_KEY}
    keys = [k for k, v in spec.items() if v is not None and v is not False]
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"structured_outputs: unknown keys {unknown}; use one of "
                         f"{', '.join(SPEC_KEYS)} (and optionally {GATE_KEY})")
    if len(keys) != 1:
        raise ValueError(f"structured_outputs must set exactly one of {', '.join(SPEC_KEYS)}, "
                         f"got {sorted(keys) or 'none'}")
    key = keys[0]
    value = spec[key]
    where = f"structured_outputs.{key}"
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not valid JSON: {e}") from e
        if not isinstance(value, (dict, bool)):
            raise ValueError(f"{where} must be a JSON schema object, got {type(value).__name__}")
        _check_schema(value, where)
        value = json.dumps(value, separators=(",", ":"))
    elif key == "json_object":
        if value is not True:
            raise ValueError(f"{where} must be true")
    elif key == "choice":
        if (not isinstance(value, list) or not value
                or not all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"{where} must be a non-empty list of non-empty strings")
        if any("\x00" in c for c in value):
            raise ValueError(f"{where}: a choice may not contain the NUL character")
    elif not isinstance(value, str) or not value:
        raise ValueError(f"{where} must be a non-empty string")
    if isinstance(value, str) and len(value) > MAX_SPEC_CHARS:
        raise ValueError(f"{where} is longer than {MAX_SPEC_CHARS} characters")
    if key == "choice" and sum(len(c) for c in value) > MAX_SPEC_CHARS:
        raise ValueError(f"{where} is longer than {MAX_SPEC_CHARS} characters")
    if gate is None:
        return {key: value}
    return {key: value, GATE_KEY: normalize_gate(gate)}


def constraint(spec: dict[str, Any]) -> tuple[str, Any]:
    """The constraint of a normalized spec: ``(key, value)``, the reasoning
    gate left out."""
    return next((k, v) for k, v in spec.items() if k != GATE_KEY)


def gate_of(spec: dict[str, Any]) -> ReasoningGate | None:
    """A new reasoning gate for a request with this normalized spec, or None
    (no gate, or one that never holds the grammar back)."""
    return ReasoningGate.from_spec(spec.get(GATE_KEY))


def gate_token_ids(spec: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """``(field, token ids)`` of a normalized spec's reasoning gate (none
    without a gate), for the range check against the vocabulary."""
    gate = spec.get(GATE_KEY)
    if gate is None:
        return []
    return [(f"structured_outputs.{GATE_KEY}.end", gate["end"]),
            (f"structured_outputs.{GATE_KEY}.start", gate["start"])]


#: JSON Schema keywords xgrammar does not enforce (it would only log a warning
#: and generate output that breaks them): refused, as vLLM refuses them for xgrammar.
UNSUPPORTED_SCHEMA_KEYWORDS = frozenset({
    "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "uniqueItems", "multipleOf", "contains", "minContains", "maxContains",
    "unevaluatedProperties", "unevaluatedItems",
})
#: Deepest nesting of a schema accepted (xgrammar's parse grows steeply with it).
MAX_SCHEMA_DEPTH = 32
#: Keys whose value is a map of names to schemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _check_schema(schema: Any, where: str, depth: int = 0) -> None:
    """Refuse what xgrammar would not enforce: :data:`UNSUPPORTED_SCHEMA_KEYWORDS`,
    a ``pattern`` that is not a regular expression it supports, nesting
    deeper than :data:`MAX_SCHEMA_DEPTH`.

    Raises:
        ValueError: naming ``where`` and the keyword.
    """
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(schema, list):
        for item in schema:
            _check_schema(item, where, depth + 1)
        return
    if not isinstance(schema, dict):
        return
    found = sorted(UNSUPPORTED_SCHEMA_KEYWORDS & set(schema))
    if found:
        raise ValueError(f"{where}: JSON Schema keyword {found[0]!r} is not supported "
                         f"(the output could not be made to follow it)")
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and _xgrammar_available():
        try:
            _xgrammar().Grammar.from_regex(pattern)
        except Exception as e:  # noqa: BLE001 - xgrammar's RuntimeError
            raise ValueError(f"{where}: unsupported pattern {pattern!r}: "
                             f"{_first_line(str(e))}") from e
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                _check_schema(sub, where, depth + 1)
        elif isinstance(value, (dict, list)) and key not in ("enum", "const", "default",
                                                            "examples", "required"):
            _check_schema(value, where, depth + 1)


def _xgrammar_available() -> bool:
    try:
        _xgrammar()
    except ValueError:
        return False
    return True


def _choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices``: each choice a
    sequence of string literals (backslashes and quotes escaped, control
    characters as \\u escapes) with every non-ASCII character as a one-character
    class (xgrammar 0.2.9 mis-matches some literals that mix multi-byte and
    ASCII characters, e.g. ``"üa"``; ``[ü] "a"`` is matched right)."""
    def sequence(s: str) -> str:
        parts: list[str] = []
        run: list[str] = []
        for ch in s:
            if ord(ch) < 0x80:
                if ch in '"\\':
                    run.append("\\" + ch)
                elif ord(ch) < 0x20:
                    run.append(f"\\u{ord(ch):04x}")
                else:
                    run.append(ch)
                continue
            if run:
                parts.append('"' + "".join(run) + '"')
                run = []
            parts.append(f"[{ch}]")
        if run:
            parts.append('"' + "".join(run) + '"')
        return "(" + " ".join(parts) + ")"
    return "root ::= " + " | ".join(sequence(c) for c in choices)


def _grammar(spec: dict[str, Any]):
    """The ``xgrammar.Grammar`` of a normalized spec (raises xgrammar's errors)."""
    xgr = _xgrammar()
    key, value = constraint(spec)
    if key == "json":
        return xgr.Grammar.from_json_schema(value, any_whitespace=False)
    if key == "json_object":
        return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
    if key == "regex":
        return xgr.Grammar.from_regex(value)
    if key == "choice":
        return xgr.Grammar.from_ebnf(_choice_ebnf(value))
    return xgr.Grammar.from_ebnf(value)


def check_spec(spec: dict[str, Any]) -> None:
    """:func:`_check_spec` cached by the constraint (a repeated schema is
    parsed once; the reasoning gate is not parsed). Raises as it."""
    key = json.dumps(constraint(spec))
    with _checked_lock:
        cached = _checked.get(key)
    if cached is None:
        try:
            _check_spec(spec)
            cached = ""
        except ValueError as e:
            cached = str(e)
        with _checked_lock:
            _checked[key] = cached
            while len(_checked) > _CHECKED_MAX:
                _checked.pop(next(iter(_checked)))
    if cached:
        raise ValueError(cached)


_checked: dict[str, str] = {}  # spec -> "" (fine) or the error message
_checked_lock = threading.Lock()
_CHECKED_MAX = 1024


def _check_spec(spec: dict[str, Any]) -> None:
    """Parse a normalized spec with xgrammar, so that a bad constraint is
    refused before it reaches the engine.

    Raises:
        ValueError: naming ``structured_outputs.<key>``: an invalid or
            unsupported JSON schema, regex or grammar (xgrammar's message), or
            xgrammar not installed.
    """
    key = constraint(spec)[0]
    try:
        _grammar(spec)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError with its parser's message
        what = {"json": "JSON schema", "regex": "regular expression"}.get(key, "grammar")
        raise ValueError(f"structured_outputs.{key}: invalid {what}: "
                         f"{_first_line(str(e))}") from e


def _first_line(message: str) -> str:
    """xgrammar's message without its ``[time] file:line:`` prefix."""
    line = message.strip().splitlines()[0] if message.strip() else message
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
        parts = line.split(": ", 1)
        if len(parts) == 2 and ".cc:" in parts[0]:
            line = parts[1]
    return line


class GrammarCompiler:
    """Compiles specs against a model's vocabulary, once per distinct spec
    (kept for the process's life, and xgrammar's own cache beneath it), on
    a background thread. The engine waits briefly for a new request's
    compile on admission; one that takes longer (a 20000-string enum: about
    5 s) waits aside while the other requests keep stepping
    (``EngineCore._compiling``).

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: the model's logits width (may exceed the tokenizer's).
        stop_token_ids: the tokens that end a request (the model's EOS): the
            only ones allowed once a grammar is complete.
    Raises:
        ValueError: xgrammar not installed.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._compiled: dict[str, Future] = {}
        self.num_compiles = 0

    def compile_async(self, spec: dict[str, Any]) -> Future:
        """A future of the spec's ``xgrammar.CompiledGrammar`` (shared by
        every request with an equal constraint, whatever its reasoning gate)."""
        key = json.dumps(constraint(spec), sort_keys=True)
        with self._lock:
            future = self._compiled.get(key)
            if future is None:
                future = self._executor.submit(self._compile, spec)
                self._compiled[key] = future
                self.num_compiles += 1
            return future

    def _compile(self, spec: dict[str, Any]):
        return self._compiler.compile_grammar(_grammar(spec))


class GrammarState:
    """One request's position in its grammar: a ``GrammarMatcher`` over the
    compiled grammar, created when the grammar is first needed; with a
    reasoning gate, held back while the model reasons (the step's row is then
    not a grammar row: :meth:`constrains_next`).

    Args:
        compiled: the future from :meth:`GrammarCompiler.compile_async`.
        vocab_size: the model's logits width.
        gate: the request's reasoning gate (from the spec's ``reasoning``), or
            None: the grammar applies from the first token.
    """

    def __init__(self, compiled: Future, vocab_size: int,
                 gate: ReasoningGate | None = None) -> None:
        self._compiled = compiled
        self._matcher = None
        self._vocab_size = vocab_size
        # Dropped once the answer begins: from then on the state is an ungated one.
        self._gate = gate

    @property
    def gate(self) -> ReasoningGate | None:
        """The reasoning gate while the answer has not begun, else None."""
        return self._gate

    def constrains_next(self, output_token_ids: list[int]) -> bool:
        """Whether the grammar masks the request's next token (the sampler
        asks once per sampling step, before the bitmasks are filled): always
        without a gate; with one, at the first token when a start tag may
        open the reasoning, not while reasoning, and from the token after the
        end tag on (the grammar then takes any output tokens past the tag it
        has not seen: none in a normal step).

        Args:
            output_token_ids: the request's output so far.
        """
        gate = self._gate
        if gate is None or gate.start_token is not None:
            return True
        answer_from = gate.find_end(output_token_ids)
        if answer_from is None:
            return False
        self._gate = None
        for token in output_token_ids[answer_from:]:
            self.accept(token)
        return True

    @property
    def matcher(self):
        """The ``xgrammar.GrammarMatcher`` (waits for the compile the first time).

        Raises:
            ValueError: the grammar failed to compile.
        """
        if self._matcher is None:
            xgr = _xgrammar()
            self._matcher = xgr.GrammarMatcher(self._compiled.result())
        return self._matcher

    @property
    def terminated(self) -> bool:
        """The grammar accepted a stop token: nothing more to constrain."""
        return self._matcher is not None and self._matcher.is_terminated()

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 words,
        bit ``t`` of the row = token ``t`` allowed). Once the grammar is
        complete and a stop token accepted (the request goes on only with
        ``ignore_eos``), only the stop tokens are allowed: the text stays the
        grammar's. A start tag that may still open the reasoning is
        allowed too."""
        if not self.terminated:
            self.matcher.fill_next_token_bitmask(bitmask, row)
            if self._gate is not None:
                _allow(bitmask, row, self._gate.start_token)
            return
        bitmask[row] = 0
        for t in self.matcher.stop_token_ids:
            _allow(bitmask, row, t)

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar rejects it (then
        the state is unchanged). After termination a stop token is accepted.
        The first token of a gated state is the start tag (the reasoning
        begins; the grammar is not advanced) or the answer's first."""
        if self._gate is not None:
            if self._gate.opens_reasoning(int(token)):
                return True
            self._gate = None
        if self.terminated:
            return int(token) in self.matcher.stop_token_ids
        return bool(self.matcher.accept_token(int(token)))

    def admits_output(self) -> bool:
        """Whether the grammar allows any first token (an empty language,
        e.g. ``root ::= root``, allows none)."""
        xgr = _xgrammar()
        bitmask = xgr.allocate_token_bitmask(1, self._vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        return bool(bitmask.any())


def _allow(bitmask, row: int, token: int) -> None:
    """Set token ``token``'s bit in ``bitmask[row]`` (int32 words)."""
    bitmask[row, token // 32] |= 1 << (token % 32) if token % 32 < 31 else -(1 << 31)


def fill_bitmasks(states: list[GrammarState], rows: list[int],
                  vocab_size: int) -> tuple[list[int], Any]:
    """Each state's forbidden next tokens, one row per state, as a bool mask
    (unpacked from xgrammar's bitmask here, so that the runner's thread, which
    calls this during the forward pass, does that work too).

    Args:
        states: the constrained rows' states. rows: their row indices in the
            step's sampling logits (returned unchanged).
        vocab_size: V, the logits' width.
    Returns:
        (rows, bool tensor ``[len(states), V]``, True = forbidden).
    """
    import numpy as np
    import torch

    xgr = _xgrammar()
    bitmask = xgr.allocate_token_bitmask(len(states), vocab_size)
    for k, state in enumerate(states):
        state.fill_bitmask(bitmask, k)
    # Bit t of a row's int32 words (little-endian) = token t allowed.
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return rows, torch.from_numpy(bits[:, :vocab_size] == 0)


def apply_bitmasks(logits, rows: list[int], forbidden) -> None:
    """Set the logits of tokens the grammars forbid to -inf, in place.

    Args:
        logits: float32 ``[N, V]``. rows: the constrained rows (``len(rows)``
            = the mask's rows). forbidden: from :func:`fill_bitmasks`.
    """
    forbidden = forbidden.to(logits.device)
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(forbidden, float("-inf"))
        return
    for k, row in enumerate(rows):
        logits[row].masked_fill_(forbidden[k], float("-inf"))


def keep_grammar_rows(logits, rows: list[int], constrained) -> None:
    """Rows whose other masks (``allowed_token_ids``, ``bad_words``,
    ``min_tokens``) left no token the grammar allows get their
    grammar-masked logits back: the grammar wins, so the output still
    follows it.

    Args:
        logits: float32 ``[N, V]`` after every mask. rows: the constrained
            rows. constrained: those rows' logits after the grammar mask only.
    """
    import torch

    dead = torch.isneginf(logits[rows]).all(dim=1).nonzero().flatten().tolist()
    for k in dead:
        logits[rows[k]] = constrained[k]


def accept_tokens(states: list[GrammarState], tokens: list[int]) -> int:
    """Advance each state past its row's sampled token. A token the grammar
    rejects (only possible when other masks, e.g. ``min_tokens`` holding back
    the EOS a complete grammar requires, left the row no allowed token) leaves
    that state where it was and is logged.

    Returns:
        The number of rejected tokens.
    """
    rejected = 0
    for state, token in zip(states, tokens, strict=True):
        if not state.accept(token):
            rejected += 1
            logger.warning("structured outputs: token %d is outside the grammar (its mask "
                           "met another that allowed nothing, e.g. min_tokens)", token)
    return rejected

"""Structured outputs on admission: compiling a request's grammar, and the
requests that wait aside while theirs is still compiling."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait

from paternoster.request import Request
from paternoster.structured_outputs import GrammarCompiler, GrammarState, gate_of

#: Seconds ``add_request`` waits for a grammar to compile before parking the
#: request until it has (xgrammar compiles a 50-property schema in ~8 ms; a
#: 20000-string enum takes seconds, which must not stall the running requests).
COMPILE_WAIT_S = 0.05


class GrammarQueue:
    """Compiles requests' grammars and holds the requests whose grammar is still
    compiling (longer than :data:`COMPILE_WAIT_S`), in arrival order: they join
    the scheduler when it is done, so a slow compile never holds the other
    requests' steps (``EngineCore._compiling``).

    Args:
        load_tokenizer: returns the model's tokenizer; called on the first
            compile (the grammar compiler is built on first use: it reads the
            tokenizer).
        vocab_size: the model's logits width.
        eos_token_id: the model's EOS token (``None``: none).
    """

    def __init__(self, load_tokenizer: Callable[[], object], vocab_size: int,
                 eos_token_id: int | None) -> None:
        self._load_tokenizer = load_tokenizer
        self._vocab_size = vocab_size
        self._eos_token_id = eos_token_id
        # Structured outputs' grammar compiler (built on first use: it reads the tokenizer).
        self._compiler: GrammarCompiler | None = None
        # The parked requests by id: (request, its compile, its spec).
        self._parked: dict[str, tuple[Request, Future, dict]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._parked

    def __bool__(self) -> bool:
        return bool(self._parked)

    def start(self, spec: dict) -> tuple[Future, GrammarState | None]:
        """Start compiling a new request's grammar and wait up to
        :data:`COMPILE_WAIT_S` for it.

        Returns:
            The compile, and the request's grammar state when it finished in
            time (``None``: still compiling; :meth:`park` the request).
        Raises:
            ValueError: xgrammar is missing, the constraint did not compile or
                admits no output.
        """
        compiled = self._compile(spec)
        # most grammars compile (or come from the cache) within the wait; a
        # compile error is reported by state() below
        futures_wait([compiled], timeout=COMPILE_WAIT_S)
        return compiled, (self.state(compiled, spec) if compiled.done() else None)

    def _compile(self, spec: dict) -> Future:
        """Start compiling a request's grammar against the model's vocabulary
        (or take it from the cache) on the compiler's thread.

        Raises:
            ValueError: xgrammar is missing.
        """
        if self._compiler is None:
            eos = self._eos_token_id
            self._compiler = GrammarCompiler(
                self._load_tokenizer(), self._vocab_size, [] if eos is None else [eos])
        return self._compiler.compile_async(spec)

    def state(self, compiled: Future, spec: dict) -> GrammarState:
        """A request's structured-output state from its compiled grammar, and
        its reasoning gate (the spec's ``reasoning``), if any.

        Raises:
            ValueError: the constraint did not compile or admits no output.
        """
        try:
            compiled.result()
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar's compile errors
            raise ValueError(f"structured_outputs: cannot compile the constraint: {e}") from e
        state = GrammarState(compiled, self._vocab_size, gate_of(spec))
        if not state.admits_output():
            raise ValueError("structured_outputs: the constraint admits no output at all")
        return state

    def park(self, request: Request, compiled: Future, spec: dict) -> None:
        """Hold ``request`` until ``compiled`` is done (:meth:`pop_compiled`)."""
        self._parked[request.request_id] = (request, compiled, spec)

    def pop(self, request_id: str) -> Request:
        """Take a parked request out (an abort). Raises ``KeyError`` if not parked."""
        return self._parked.pop(request_id)[0]

    def pop_compiled(self) -> Iterator[tuple[Request, Future, dict]]:
        """Take out the parked requests whose grammar finished compiling
        (successfully or not), in arrival order, with their compile and spec."""
        for rid, (req, compiled, spec) in list(self._parked.items()):
            if not compiled.done():
                continue
            del self._parked[rid]
            yield req, compiled, spec

    def wait(self, timeout_s: float) -> None:
        """Idle until a grammar finishes compiling (at most ``timeout_s``)."""
        futures_wait([f for _, f, _ in self._parked.values()], timeout=timeout_s,
                     return_when=FIRST_COMPLETED)  # fmt: skip

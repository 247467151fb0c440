"""The blocking client of the ZeroMQ/msgpack protocol (docs/protocol.md).

One :class:`Client` is one DEALER connection. It is not thread-safe (use one
per thread), but several streams may be open at once: messages for the other
requests are buffered while one is read.

Example::

    from paternoster.client import Client

    with Client("ipc:///tmp/paternoster-8000.ipc") as c:
        print(c.generate("The capital of France is", max_tokens=8, temperature=0).text)
        for delta in c.stream("Once upon a time", max_tokens=32):
            print(delta.text, end="", flush=True)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import zmq

from paternoster.client import protocol as p
from paternoster.client._common import (
    Accumulator,
    ClientError,
    Completion,
    Delta,
    ProtocolError,
    dealer,
    delta_from,
    error_from,
    generate_message,
    hello_message,
    no_server_message,
    pack,
    unpack,
)

DEFAULT_MAX_INCOMING_BYTES = 256 * 1024 * 1024


class Client:
    """A blocking client: connect, handshake, then generate, stream, abort.

    Args:
        address: the server's ``--zmq-address`` (``ipc://...`` or ``tcp://host:port``).
        api_key: the server's ``--api-key``, if it has one.
        timeout: default seconds to wait for the handshake and for each
            message of a request (``None``: forever).
        client_name: sent in the handshake (for the server's logs).
        max_incoming_bytes: larger server messages are refused by ZeroMQ.
    Raises:
        TimeoutError: no ``welcome`` within ``timeout`` seconds (server down?).
        ProtocolError: the handshake failed (``unauthorized``, ``unsupported_version``).
        ValueError: ``address`` is not a ZeroMQ endpoint.
    """

    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        timeout: float | None = 30.0,
        client_name: str | None = "paternoster.client",
        max_incoming_bytes: int = DEFAULT_MAX_INCOMING_BYTES,
    ):
        self.timeout = timeout
        self._max_in = max_incoming_bytes
        self._ctx = zmq.Context()
        self._sock = dealer(self._ctx, address, max_incoming_bytes)
        self._inbox: dict[str, deque] = {}  # request id -> its messages not yet read
        self._replies: deque = deque()  # models / health / welcome / id-less errors
        self._draining: set[str] = set()  # aborted here; their final is still to come
        self._unanswered: dict[str, bytes] = {}  # request id -> its frame, until a reply
        self._hello = pack(hello_message(api_key, client_name))
        try:
            self._sock.send(self._hello)
            welcome = self._reply(p.WELCOME, None, timeout)
        except TimeoutError:
            self.close()
            raise TimeoutError(no_server_message(address, timeout)) from None
        except BaseException:
            self.close()
            raise
        self.server_info: dict = {k: v for k, v in welcome.items() if k not in ("v", "type")}

    # ------------------------------------------------------------ requests

    def generate(
        self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
        request_id: str | None = None, priority: int = 0, add_special_tokens: bool = True,
        timeout: float | None = None, **sampling: Any,
    ) -> Completion:
        """Run one request to its end (no streaming).

        Args:
            prompt: the prompt text (tokenized by the server), or
            prompt_token_ids: the prompt as token ids.
            request_id: a client-chosen id (default: a fresh one).
            priority: scheduling priority (lower first; the ``priority`` scheduler).
            add_special_tokens: let the tokenizer add BOS etc. to a text prompt.
            timeout: seconds for the whole request (default: the client's); on
                expiry the request is aborted and ``TimeoutError`` raised.
            **sampling: ``SamplingParams`` fields (``max_tokens=16``,
                ``temperature``, ``top_p``, ``stop``, ``seed``, ``logprobs``, ...),
                ``cache_salt`` (prefix-cache isolation), ``tenant`` (who the
                request is served for: the ``fair`` scheduler's unit of sharing)
                and ``slo_ttft_s`` / ``slo_itl_s`` (latency targets in seconds:
                the ``slo`` scheduler).
        Returns:
            The :class:`Completion`.
        Raises:
            ClientError: its subclass for the server's ``error`` (bad request,
                overloaded, engine unavailable).
            TimeoutError: the request did not finish in time (it is aborted).
            ValueError: bad arguments (see :func:`generate_message`).
        """
        rid = self._send_generate(prompt, prompt_token_ids, request_id, False, priority,
                                  add_special_tokens, sampling)  # fmt: skip
        acc = Accumulator(rid)
        deadline = _deadline(self.timeout if timeout is None else timeout)
        try:
            while True:
                msg = self._next_for(rid, deadline)
                done = acc.add(msg)
                if done is not None:
                    return done
        except TimeoutError:
            self._abandon(rid)
            raise
        finally:
            self._inbox.pop(rid, None)
            self._unanswered.pop(rid, None)

    def stream(
        self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
        request_id: str | None = None, priority: int = 0, add_special_tokens: bool = True,
        timeout: float | None = None, **sampling: Any,
    ) -> Stream:
        """Start a streamed request; iterate the returned :class:`Stream` for
        its :class:`Delta` pieces. Arguments as :meth:`generate`, except that
        ``timeout`` bounds the wait for each piece. Closing the stream early
        (``close()``, leaving a ``with`` block, ``break`` then garbage
        collection) aborts the request.
        """
        rid = self._send_generate(prompt, prompt_token_ids, request_id, True, priority,
                                  add_special_tokens, sampling)  # fmt: skip
        return Stream(self, rid, self.timeout if timeout is None else timeout)

    def abort(self, request_id: str) -> None:
        """Ask the server to abort a request (it still sends the request's final
        message, with ``finish_reason`` ``abort``; unknown ids are ignored)."""
        self._sock.send(pack(p.message(p.ABORT, id=request_id)))

    def models(self, timeout: float | None = None) -> list[dict]:
        """The served models: ``[{"id": name, "max_model_len": tokens}]``."""
        return list(self._query(p.MODELS, timeout).get("data", []))

    def health(self, timeout: float | None = None) -> dict:
        """``{"status": "ok"}`` or ``{"status": "unhealthy", "reason": ...}``."""
        reply = self._query(p.HEALTH, timeout)
        return {k: v for k, v in reply.items() if k in ("status", "reason")}

    def close(self) -> None:
        """Close the connection (the server aborts this client's requests when it
        next tries to send to it)."""
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- internals

    def _send_generate(self, prompt, prompt_token_ids, request_id, stream, priority,
                       add_special_tokens, sampling) -> str:  # fmt: skip
        rid, msg = generate_message(prompt, prompt_token_ids, request_id, stream, priority,
                                    add_special_tokens, sampling)  # fmt: skip
        if rid in self._inbox or rid in self._draining:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        self._inbox[rid] = deque()
        frame = pack(msg)
        self._unanswered[rid] = frame  # resent once if the server asks for a new hello
        self._sock.send(frame)
        return rid

    def _query(self, kind: str, timeout: float | None) -> dict:
        qid = f"q{id(self)}-{time.monotonic_ns()}"
        self._sock.send(pack(p.message(kind, id=qid)))
        return self._reply(kind, qid, self.timeout if timeout is None else timeout)

    def _reply(self, kind: str, qid: str | None, timeout: float | None) -> dict:
        """The next reply of ``kind`` (with id ``qid``); an id-less error raises."""
        deadline = _deadline(timeout)
        while True:
            for i, msg in enumerate(self._replies):
                if msg["type"] == kind and msg.get("id") == qid:
                    del self._replies[i]
                    return msg
                if msg["type"] == p.ERROR and msg.get("id") in (None, qid):
                    del self._replies[i]
                    raise error_from(msg)
            self._pump(deadline)

    def _next_for(self, rid: str, deadline: float | None) -> dict:
        """The next message of request ``rid``.

        Raises:
            ClientError: the request's final is an ``error``.
            TimeoutError: nothing for it before ``deadline``.
        """
        box = self._inbox[rid]
        while True:
            while not box:
                self._pump(deadline)
            msg = box.popleft()
            frame = self._unanswered.pop(rid, None)
            if msg["type"] != p.ERROR:
                return msg
            if msg.get("code") == p.HANDSHAKE_REQUIRED and frame is not None:
                # the server restarted (or ZeroMQ reconnected): _pump greeted it
                # again, so send the request once more behind that hello
                self._sock.send(frame)
                continue
            raise error_from(msg)

    def _pump(self, deadline: float | None) -> None:
        """Receive one message and file it under its request (or the replies)."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._sock.poll(None if wait is None else int(wait * 1000) + 1):
            raise TimeoutError("no message from the server in time")
        msg = unpack(self._sock.recv(), self._max_in)
        rid = msg.get("id")
        kind = msg["type"]
        if kind == p.ERROR and msg.get("code") == p.HANDSHAKE_REQUIRED:
            self._sock.send(self._hello)  # ZeroMQ reconnected: the server sees a new peer
        if kind in (p.DELTA, p.FINAL, p.ERROR) and rid in self._inbox:
            self._inbox[rid].append(msg)
        elif kind in (p.DELTA, p.FINAL, p.ERROR) and rid in self._draining:
            if kind != p.DELTA:  # the abandoned request's last message
                self._draining.discard(rid)
        elif kind in (p.DELTA, p.FINAL):
            pass  # not ours to wait for
        else:
            self._replies.append(msg)

    def _abandon(self, rid: str) -> None:
        """Abort ``rid`` and drop its messages until its final arrives."""
        self._inbox.pop(rid, None)
        self._unanswered.pop(rid, None)
        self._draining.add(rid)
        self.abort(rid)


class Stream:
    """The :class:`Delta` pieces of one streamed request (an iterator).

    Attributes:
        request_id: the request's id.
        completion: the joined result once the final piece was read.
    """

    def __init__(self, client: Client, request_id: str, timeout: float | None):
        self._client = client
        self.request_id = request_id
        self._timeout = timeout
        self._acc = Accumulator(request_id)
        self.completion: Completion | None = None
        self._open = True

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        if not self._open:
            raise StopIteration
        try:
            msg = self._client._next_for(self.request_id, _deadline(self._timeout))
        except (ClientError, ProtocolError):
            self._finish()
            raise
        except TimeoutError:
            self.close()
            raise
        done = self._acc.add(msg)
        if done is not None:
            self.completion = done
            self._finish()
        return delta_from(msg)

    def close(self) -> None:
        """Abort the request if it is still running, and stop iterating."""
        if self._open:
            self._open = False
            self._client._abandon(self.request_id)

    def _finish(self) -> None:
        self._open = False
        self._client._inbox.pop(self.request_id, None)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_open", False):
            try:
                self.close()
            except Exception:  # the client may be closed already
                pass


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout

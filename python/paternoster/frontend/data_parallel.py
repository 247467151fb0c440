"""N data-parallel engines behind one frontend (``--data-parallel-size N``).

:class:`DataParallelClient` presents the :class:`EngineClient` interface the
pipeline, the HTTP server and the CLI use, over N engine clients: each runs
one engine process with its own KV cache and its own cores or GPU
(:mod:`.placement`), its own link, supervision and restarts. A request goes
where the :class:`~.router.Router` sends it (prefix-cache affinity, then the
least loaded engine); its outputs, aborts and failures stay with that engine,
so one engine dying fails only its own in-flight requests while the others
keep serving. Of those, only the ones that already had output fail: a
request whose engine dies before its first output (queued there, in
prefill, or sent in the moment before the death was seen) is sent once more,
to a live engine the router picks, and its caller sees one stream. The
waiting-queue limits (``--max-waiting-requests``, ``--max-waiting-tokens``)
hold for the server as a whole: every engine client shares one
:class:`Admission`.

With one engine it is a thin wrapper: no hashing, no routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from paternoster.config import EngineConfig
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.frontend.admission import Admission, AdmissionCounts, Reservation
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.engine_status import describe_engine, join_reasons, sum_stats
from paternoster.frontend.errors import EngineDeadError
from paternoster.frontend.placement import place_engines
from paternoster.frontend.ray_executor import RayLauncher
from paternoster.frontend.router import (
    EngineLoad,
    NoEngineAvailableError,
    Router,
    prefix_block_hashes,
)

logger = logging.getLogger("paternoster.frontend")


class DataParallelClient(AdmissionCounts):
    """Routes requests over several :class:`EngineClient` s.

    Args:
        clients: one client per engine, not started, sharing one
            :class:`Admission` (:meth:`create` builds them).
        router: the routing policy (default: a :class:`Router` with its defaults).
        launcher: the Ray launcher the clients share, closed (its placement
            group released) on :meth:`shutdown`; ``None`` for local engines.
    Raises:
        ValueError: no clients, clients with admissions of their own, or a
            router for another number of engines.
    """

    def __init__(self, clients: Sequence[EngineClient], router: Router | None = None,
                 launcher: RayLauncher | None = None):
        if not clients:
            raise ValueError("DataParallelClient needs at least one engine client")
        if len({id(c.admission) for c in clients}) != 1:
            raise ValueError("data-parallel engine clients must share one Admission")
        router = router if router is not None else Router(len(clients))
        if router.num_engines != len(clients):
            raise ValueError(f"router is for {router.num_engines} engines, "
                             f"got {len(clients)} clients")  # fmt: skip
        self.engines = list(clients)
        self.router = router
        self.admission = clients[0].admission
        self._owner: dict[str, int] = {}  # in-flight request id -> engine index
        self._aborted: set[str] = set()  # in-flight ids the caller aborted: never re-routed
        self.num_rerouted = 0  # requests sent again after their engine died before output
        self._restarts = [0] * len(clients)  # num_restarts the router has seen
        self._refusing: str | None = None
        self.launcher = launcher

    @classmethod
    def create(cls, config: EngineConfig, data_parallel_size: int = 1,
               max_waiting_requests: int | None = None, max_waiting_tokens: int | None = None,
               router: Router | None = None, distributed_executor_backend: str = "mp",
               ray_address: str | None = None, routing: str = "affinity",
               **client_args: Any) -> DataParallelClient:  # fmt: skip
        """``data_parallel_size`` engine clients placed on their own cores or
        GPUs (:func:`~.placement.place_engines`), or as Ray actors.

        Args:
            config: the engines' shared configuration.
            data_parallel_size: engine processes (>= 1).
            max_waiting_requests: see :class:`EngineClient` (for the server
                as a whole).
            max_waiting_tokens: likewise.
            router: see the class.
            distributed_executor_backend: ``"mp"``: local engine processes;
                ``"ray"``: Ray actors on an existing cluster, one placement
                group bundle each of ``num_threads`` CPUs (1 when auto) and,
                for ``cuda``, one GPU (:mod:`.ray_executor`).
            ray_address: the Ray cluster (``ray`` only; see
                :func:`~.ray_executor.connect`).
            routing: the :class:`Router` policy when ``router`` is ``None``
                (``"affinity"`` or ``"round_robin"``).
            client_args: the other :class:`EngineClient` arguments.
        Raises:
            ValueError: see :func:`~.placement.place_engines` and
                :class:`~.ray_executor.RayLauncher`; a bad limit or backend;
                ``config.tensor_parallel_size`` > 1 with more than one engine
                or with the ``ray`` backend (not supported yet).
        """
        tp = config.tensor_parallel_size
        if tp > 1 and (data_parallel_size != 1 or distributed_executor_backend != "mp"):
            raise ValueError(
                f"--tensor-parallel-size {tp} with --data-parallel-size {data_parallel_size} "
                f"and --distributed-executor-backend {distributed_executor_backend}: tensor "
                "parallel runs in one local engine process (--data-parallel-size 1, backend "
                "mp); data parallel x tensor parallel is not supported yet")
        if router is None:
            router = Router(max(data_parallel_size, 1), policy=routing)
        admission = Admission(max_waiting_requests, max_waiting_tokens)
        if distributed_executor_backend == "mp":
            if ray_address is not None:
                raise ValueError("--ray-address needs --distributed-executor-backend ray")
            placements = place_engines(config, data_parallel_size)
            clients = [EngineClient(p.config, admission=admission, engine_env=p.env,
                                    index=i, **client_args)
                       for i, p in enumerate(placements)]  # fmt: skip
            return cls(clients, router)
        if distributed_executor_backend != "ray":
            raise ValueError(f"distributed_executor_backend must be 'mp' or 'ray', "
                             f"got {distributed_executor_backend!r}")  # fmt: skip
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        num_cpus = config.num_threads or 1
        engine_config = dataclasses.replace(config, num_threads=num_cpus, cpus=None)
        num_gpus = 1 if config.model.device.startswith("cuda") else 0
        launcher = RayLauncher(data_parallel_size, num_cpus, num_gpus, ray_address)
        clients = [EngineClient(engine_config, admission=admission, launcher=launcher,
                                index=i, **client_args)
                   for i in range(data_parallel_size)]  # fmt: skip
        return cls(clients, router, launcher)

    # ------------------------------------------------------------ state

    @property
    def num_engines(self) -> int:
        """Engines behind this client."""
        return len(self.engines)

    @property
    def info(self) -> dict:
        """Engine 0's ``info`` (every engine serves the same model); empty
        before :meth:`start`."""
        return self.engines[0].info

    @property
    def stats(self) -> dict:
        """The engines' latest stats added up (usage fractions averaged)."""
        if len(self.engines) == 1:
            return self.engines[0].stats
        return sum_stats([c.stats for c in self.engines if c.stats])

    def engine_stats(self) -> list[dict]:
        """Each engine's latest stats, engine 0 first (for the metrics)."""
        return [c.stats for c in self.engines]

    @property
    def dead_reason(self) -> str | None:
        """Why every engine is dead, or ``None`` while one lives."""
        reasons = [c.dead_reason for c in self.engines]
        if any(r is None for r in reasons):
            return None
        return join_reasons(reasons)

    @property
    def num_restarts(self) -> int:
        """Engine restarts so far, all engines."""
        return sum(c.num_restarts for c in self.engines)

    @property
    def pid(self) -> int | None:
        """Engine 0's process id (every engine's: :meth:`describe_engines`)."""
        return self.engines[0].pid

    @property
    def is_alive(self) -> bool:
        """True while at least one engine takes new requests."""
        return self.unavailable_reason is None

    @property
    def unavailable_reason(self) -> str | None:
        """Why new requests are refused (every engine dead, stalled or
        restarting, or shutting down), or ``None`` when one engine takes them."""
        if self._refusing is not None:
            return self._refusing
        reasons = [c.unavailable_reason for c in self.engines]
        if any(r is None for r in reasons):
            return None
        return join_reasons(reasons)

    def describe_engines(self) -> list[dict]:
        """Each engine's state for ``/health`` and ``/stats`` (:func:`describe_engine`)."""
        return [describe_engine(i, c) for i, c in enumerate(self.engines)]

    def stop_accepting(self, reason: str = "server is shutting down") -> None:
        """Refuse new requests from now on (every engine); in-flight ones go on."""
        if self._refusing is None:
            self._refusing = reason
        for c in self.engines:
            c.stop_accepting(reason)

    def fail_in_flight(self, reason: str) -> None:
        """End every in-flight request, on every engine, with :class:`EngineDeadError`."""
        for c in self.engines:
            c.fail_in_flight(reason)

    # ------------------------------------------------------------- life

    async def start(self) -> dict:
        """Start every engine, concurrently, and wait until all are ready.

        Returns:
            Engine 0's ``info``.
        Raises:
            EngineStartupError: an engine failed to start (the message names
                it; every engine is shut down).
        """
        results = await asyncio.gather(*(c.start() for c in self.engines),
                                       return_exceptions=True)  # fmt: skip
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                await self.shutdown()
                if len(self.engines) > 1 and r.args:
                    r.args = (f"engine {i}: {r.args[0]}", *r.args[1:])
                raise r
        return self.info

    async def shutdown(self) -> None:
        """Shut every engine down (:meth:`EngineClient.shutdown`). Idempotent."""
        await asyncio.gather(*(c.shutdown() for c in self.engines))
        if self.launcher is not None:
            self.launcher.close()

    # --------------------------------------------------------- requests

    def check_capacity(self, num_requests: int, num_tokens: int) -> Reservation:
        """Admit new work unless the server's waiting queue is full
        (:meth:`Admission.check_capacity`).

        Raises:
            EngineOverloadedError: a waiting-queue limit would be exceeded.
        """
        return self.admission.check_capacity(num_requests, num_tokens)

    def load(self, engine: int) -> EngineLoad:
        """Engine ``engine``'s load for the router: its requests are the more
        of the frontend's in-flight count (exact, and current) and the engine's
        last reported waiting + running (one step old)."""
        c = self.engines[engine]
        stats = c.stats
        reported = int(stats.get("num_waiting", 0)) + int(stats.get("num_running", 0))
        return EngineLoad(available=c.is_alive, num_requests=max(c.num_in_flight, reported),
                          kv_cache_usage=float(stats.get("kv_cache_usage", 0.0)))  # fmt: skip

    def route(self, request: EngineCoreRequest, exclude: int | None = None) -> int:
        """The engine index for ``request`` (:class:`Router`).

        Args:
            request: the request to place.
            exclude: an engine not to choose (the one it just failed on).
        Raises:
            EngineDeadError: no engine (but ``exclude``) takes new requests.
        """
        if len(self.engines) == 1:
            return 0
        for i, c in enumerate(self.engines):  # a restarted engine's cache is empty
            if c.num_restarts != self._restarts[i]:
                self._restarts[i] = c.num_restarts
                self.router.forget(i)
        block_size = int(self.info.get("block_size") or 0)
        hashes = (prefix_block_hashes(request.prompt_token_ids, block_size, request.cache_salt)
                  if block_size > 0 else [])  # fmt: skip
        loads = [self.load(i) for i in range(len(self.engines))]
        if exclude is not None:
            loads[exclude] = dataclasses.replace(loads[exclude], available=False)
        try:
            return self.router.route(hashes, loads)
        except NoEngineAvailableError:
            raise EngineDeadError(self.unavailable_reason or "no engine is available") from None

    async def generate(
        self, request: EngineCoreRequest, reservation: Reservation | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        """Route a request to one engine and yield its outputs
        (:meth:`EngineClient.generate`, whose errors it raises).

        If that engine dies before the request's first output, the request
        is sent once more, to another live engine (:meth:`reroute`), and its
        outputs come from there: the caller sees one stream. Its waiting
        entry moves with it (its share of ``reservation`` was taken by the
        first send), and :meth:`abort` reaches the engine it runs on.

        Raises:
            EngineDeadError: no engine takes new requests; or its engine died
                after its first output, or before it with no other engine
                live, or for the second time (only that engine's requests fail).
            ValueError: the id is already in flight.
        """
        if self._refusing is not None:
            raise EngineDeadError(self._refusing)
        rid = request.request_id
        if rid in self._owner:
            raise ValueError(f"request id {rid!r} is already in flight")
        engine = self.route(request)
        self._owner[rid] = engine
        try:
            for attempt in range(2):
                client = self.engines[engine]
                restarts, started = client.num_restarts, False
                try:
                    outputs = client.generate(request, reservation if attempt == 0 else None)
                    async with contextlib.aclosing(outputs):
                        async for out in outputs:
                            started = True
                            yield out
                    return
                except EngineDeadError as e:
                    if started or attempt or not self._died(engine, restarts, rid):
                        raise
                    engine = self.reroute(request, engine, e)
                    self._owner[rid] = engine
        finally:
            self._owner.pop(rid, None)
            self._aborted.discard(rid)

    def _died(self, engine: int, restarts: int, request_id: str) -> bool:
        """True when a request's :class:`EngineDeadError` on ``engine`` came from
        the engine dying (it is dead, or was restarted since ``restarts``), not
        from a shutdown, :meth:`fail_in_flight` or the caller's abort."""
        c = self.engines[engine]
        return (self._refusing is None and request_id not in self._aborted
                and (c.dead_reason is not None or c.num_restarts != restarts))  # fmt: skip

    def reroute(self, request: EngineCoreRequest, dead: int, error: EngineDeadError) -> int:
        """The live engine a request that had no output goes to after engine
        ``dead`` died (:meth:`route` without it).

        Raises:
            EngineDeadError: ``error``, when no other engine takes new requests.
        """
        if len(self.engines) == 1:
            raise error
        try:
            engine = self.route(request, exclude=dead)
        except EngineDeadError:
            raise error from None
        self.num_rerouted += 1
        logger.info("request %s re-routed from engine %d to engine %d before any output: %s",
                    request.request_id, dead, engine, error)  # fmt: skip
        return engine

    def engine_of(self, request_id: str) -> int | None:
        """The engine an in-flight request runs on, or ``None``."""
        return self._owner.get(request_id)

    def abort(self, request_ids: Iterable[str]) -> None:
        """Ask the engines running these requests to abort them (unknown ids
        are ignored)."""
        by_engine: dict[int, list[str]] = {}
        for rid in map(str, request_ids):
            engine = self._owner.get(rid)
            if engine is not None:
                self._aborted.add(rid)
                by_engine.setdefault(engine, []).append(rid)
        for engine, ids in by_engine.items():
            self.engines[engine].abort(ids)

    @property
    def num_in_flight(self) -> int:
        """Requests whose outputs are still awaited, all engines."""
        return sum(c.num_in_flight for c in self.engines)

    # ------------------------------------------------------ control calls

    async def timeline(self, timeout: float = 30.0, engine: int = 0) -> dict:
        """Engine ``engine``'s request timeline (:meth:`EngineClient.timeline`).

        Raises:
            ValueError: no such engine.
            TimelineUnavailableError, EngineDeadError, TimeoutError: see there.
        """
        if not 0 <= engine < len(self.engines):
            raise ValueError(f"engine must be in [0, {len(self.engines)}), got {engine}")
        return await self.engines[engine].timeline(timeout)

    async def reset_prefix_cache(self, timeout: float = 30.0) -> int:
        """Reset every live engine's prefix cache (:meth:`EngineClient.reset_prefix_cache`)
        and forget where prefixes were sent.

        Returns:
            Blocks uncached, all engines.
        Raises:
            ValueError: an engine has no prefix cache.
            EngineDeadError: no engine is live.
            TimeoutError: an engine did not reply within ``timeout`` seconds.
        """
        live = [c for c in self.engines if c.is_alive]
        if not live:
            raise EngineDeadError(self.unavailable_reason or "no engine is available")
        counts = await asyncio.gather(*(c.reset_prefix_cache(timeout) for c in live))
        self.router.forget()
        return sum(counts)

    def add_iteration_listener(self, listener: Callable[[list[int], int], None]) -> None:
        """Call ``listener(tokens, engine)`` for each ``Outputs`` message of
        each engine (:meth:`EngineClient.add_iteration_listener`)."""
        for i, c in enumerate(self.engines):
            c.add_iteration_listener(lambda tokens, i=i: listener(tokens, i))

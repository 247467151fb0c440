"""Engines as Ray actors on an existing Ray cluster
(``--distributed-executor-backend ray``).

Ray places the engines; Paternoster never runs a cluster manager of its own.
The frontend joins the cluster as a driver (``ray.init(address=...)``: the
``--ray-address`` given, else ``RAY_ADDRESS`` or the cluster started on this
node with ``ray start --head``), reserves one placement group of N bundles,
one per engine, ``{"CPU": threads per engine}`` (plus ``{"GPU": 1}`` for
``--device cuda``), with the ``SPREAD`` strategy: Ray puts the bundles on as
many nodes as it can (one engine per node when there are N nodes with room)
and packs the rest.

Each engine is an actor in its bundle whose ``run`` call is the engine main
loop of :func:`paternoster.engine.process.run_engine`, in the actor's own
process on the node Ray chose. It connects back over ``tcp://`` to the
frontend's link bound on the frontend node's IP: the same typed msgpack
messages as a local engine, the same ``Config``/``Ready`` handshake token,
encrypted with ZeroMQ CURVE (:mod:`paternoster.engine.curve`). The token and
the engine's CURVE keys, made by the frontend for each engine when its link
binds, are arguments of ``run``: they travel over Ray's own channel, and the
link admits no client but the holder of those keys. Without CURVE in this
libzmq the launcher refuses to start (never plain text over tcp).

Liveness: the actor's ``run`` reference resolves when the actor ends, with
its exit code or with Ray's error when the actor died (``ray.kill``, a
crash, its node lost); the supervisor's watchdog polls it every 50 ms, as it
polls a local process, so a killed actor's requests fail within ~1 s.
Heartbeat stalls are detected on the link as for a local engine.
Non-detached actors share their driver's fate: when the frontend exits, Ray
ends its engines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from typing import Any

from paternoster.engine.curve import EngineKeys, require_curve

logger = logging.getLogger("paternoster.frontend")

#: The Ray namespace of the engine actors (``ray.get_actor(name, namespace=...)``).
NAMESPACE = "paternoster"
#: Seconds to wait for the cluster to have room for every bundle.
PLACEMENT_TIMEOUT_S = 60.0
#: Seconds to wait for the cluster's address to accept a connection.
CONNECT_TIMEOUT_S = 5.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--distributed-executor-backend ray needs Ray on every node: "
            "pip install 'paternoster[ray]'"
        ) from None
    return ray


def connect(address: str | None) -> Any:
    """Join an existing Ray cluster as a driver (once per process).

    Args:
        address: the cluster's address (``HEAD_IP:6379``); ``None``:
            ``RAY_ADDRESS`` or the cluster running on this node.
    Returns:
        The ``ray`` module.
    Raises:
        ValueError: Ray is not installed, or no cluster answers at the address.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    hint = ("start one first: `ray start --head` on the head node, `ray start --address "
            "HEAD_IP:6379` on each worker, then pass --ray-address HEAD_IP:6379 (or run on "
            "the head node)")  # fmt: skip
    if target != "auto":  # ray.init retries an unreachable address for minutes
        host, _, port = target.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except ValueError:
            raise ValueError(f"--ray-address must be HOST:PORT, got {target!r}") from None
        except OSError as e:
            raise ValueError(f"no Ray cluster at {target!r} ({e}); {hint}") from None
    try:
        ray.init(address=target, namespace=NAMESPACE, log_to_driver=True,
                 logging_level=logging.WARNING)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ValueError(f"no Ray cluster at {target!r} ({type(e).__name__}: {e}); {hint}"
                         ) from None
    return ray


class _EngineActor:
    """The Ray actor of one engine (made remote in :meth:`RayLauncher.launch`)."""

    def where(self) -> dict:
        """This actor's process id, node IP and node id."""
        import ray

        return {"pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id()}  # fmt: skip

    def run(self, input_address: str, output_address: str, token: str, engine_cls: str,
            heartbeat_interval: float, log_level: str, env: dict[str, str],
            keys: EngineKeys) -> int:  # fmt: skip
        """Run the engine main loop until shutdown; returns its exit code."""
        from paternoster.engine.process import run_engine

        os.environ.update(env)
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s [engine] %(message)s")  # fmt: skip
        return run_engine(input_address, output_address, None, engine_cls,
                          heartbeat_interval, token, keys)  # fmt: skip


class RayActorEngine:
    """One engine actor, as the supervisor watches it
    (:class:`~.launcher.EngineHandle`).

    Args:
        ray: the ``ray`` module.
        actor: the actor handle.
        name: the actor's name in :data:`NAMESPACE`.
        where_ref: the reference of its ``where()`` call.
        run_ref: the reference of its ``run(...)`` call.
    """

    def __init__(self, ray: Any, actor: Any, name: str, where_ref: Any, run_ref: Any):
        self._ray = ray
        self.actor = actor
        self.name = name
        self._where_ref = where_ref
        self._where: dict = {}
        self._run_ref = run_ref
        self._code: int | None = None
        self._error: str | None = None

    def _lookup(self) -> dict:
        if not self._where:
            ready, _ = self._ray.wait([self._where_ref], timeout=0)
            if ready:
                with contextlib.suppress(self._ray.exceptions.RayError):
                    self._where = self._ray.get(self._where_ref)
        return self._where

    @property
    def pid(self) -> int | None:
        """The actor's process id on its node, once it reported it."""
        return self._lookup().get("pid")

    def poll(self) -> int | None:
        """The engine's exit code once the actor's ``run`` ended (1 when the
        actor died), ``None`` while it runs."""
        if self._code is not None:
            return self._code
        ready, _ = self._ray.wait([self._run_ref], timeout=0)
        if not ready:
            return None
        try:
            self._code = int(self._ray.get(self._run_ref))
        except self._ray.exceptions.RayError as e:
            self._code = 1
            self._error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return self._code

    def kill(self) -> None:
        """``ray.kill`` the actor (no restart by Ray: the supervisor decides)."""
        with contextlib.suppress(Exception):
            self._ray.kill(self.actor, no_restart=True)

    def exit_message(self) -> str:
        """Why the actor is gone, naming it and its node."""
        where = self._lookup().get("node_ip", "an unknown node")
        if self._error is not None:
            return f"engine actor {self.name} on {where} died ({self._error})"
        return f"engine actor {self.name} on {where} exited with code {self._code}"

    def location(self) -> dict:
        """``ray_actor`` (its name), ``node_ip``, ``node_id`` and ``pid``."""
        return {"ray_actor": self.name, **self._lookup()}


class RayLauncher:
    """Starts engines as actors in one placement group on a Ray cluster
    (:class:`~.launcher.EngineLauncher`).

    Args:
        num_engines: bundles to reserve, one per engine.
        num_cpus: CPUs per engine (its threads).
        num_gpus: GPUs per engine (0 or 1).
        address: see :func:`connect`.
        strategy: the placement group strategy (``SPREAD``, ``STRICT_SPREAD``,
            ``PACK``, ``STRICT_PACK``).
        placement_timeout: seconds to wait for room for every bundle.
    Raises:
        ValueError: no CURVE in this libzmq (the tcp link would be plain
            text), Ray missing, no cluster, or the cluster cannot hold the
            bundles (the message says what it needs and what is free).
    """

    def __init__(self, num_engines: int, num_cpus: int, num_gpus: int = 0,
                 address: str | None = None, strategy: str = "SPREAD",
                 placement_timeout: float = PLACEMENT_TIMEOUT_S):  # fmt: skip
        if num_engines < 1 or num_cpus < 1 or num_gpus < 0:
            raise ValueError(f"need num_engines >= 1, num_cpus >= 1 and num_gpus >= 0, got "
                             f"{num_engines}, {num_cpus}, {num_gpus}")  # fmt: skip
        require_curve()  # before anything starts on the cluster
        self._ray = ray = connect(address)
        from ray.util.placement_group import placement_group, remove_placement_group

        self._remove = remove_placement_group
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.bind_host: str | None = ray.util.get_node_ip_address()
        self._prefix = f"engine-{secrets.token_hex(4)}"
        self._generation = 0
        bundle: dict[str, float] = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self.placement_group = placement_group([dict(bundle) for _ in range(num_engines)],
                                               strategy=strategy)  # fmt: skip
        try:
            ray.get(self.placement_group.ready(), timeout=placement_timeout)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise ValueError(
                f"the Ray cluster has no room for {num_engines} engine(s) of {bundle} "
                f"({strategy}) after {placement_timeout:.0f} s: it has "
                f"{ray.available_resources()} free; add nodes, or lower --data-parallel-size or "
                "--num-threads"
            ) from None
        logger.info("Ray placement group: %d bundle(s) of %s (%s)", num_engines, bundle,
                    strategy)  # fmt: skip

    def launch(self, index: int, input_address: str, output_address: str, token: str,
               engine_cls: str, heartbeat_interval: float, log_level: str,
               env: dict[str, str], keys: EngineKeys | None = None) -> RayActorEngine:  # fmt: skip
        """Create engine ``index``'s actor in bundle ``index`` and start its
        ``run`` call (see :meth:`~.launcher.EngineLauncher.launch`), the token
        and the CURVE ``keys`` among its arguments.

        Raises:
            ValueError: no ``keys`` (the tcp link is always CURVE).
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if keys is None:
            raise ValueError("a Ray engine's tcp link needs its CURVE keys")

        ray = self._ray
        self._generation += 1
        name = f"{self._prefix}-{index}.{self._generation}"
        actor_cls = ray.remote(_EngineActor)
        actor = actor_cls.options(
            name=name, namespace=NAMESPACE, num_cpus=self.num_cpus, num_gpus=self.num_gpus,
            max_restarts=0, max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=index),
        ).remote()  # fmt: skip
        where_ref = actor.where.remote()
        run_ref = actor.run.remote(input_address, output_address, token, engine_cls,
                                   heartbeat_interval, log_level, dict(env), keys)  # fmt: skip
        return RayActorEngine(ray, actor, name, where_ref, run_ref)

    def close(self) -> None:
        """Release the placement group (its engines' actors end with it). Idempotent."""
        if self.placement_group is not None:
            with contextlib.suppress(Exception):
                self._remove(self.placement_group)
            self.placement_group = None

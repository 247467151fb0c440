"""Which engine a request goes to, with N data-parallel engines.

The rule, in order:

1. **Prefix-cache affinity.** A prompt's leading full blocks are hashed as the
   engine's prefix cache hashes them (:func:`prefix_block_hashes`: the core's
   own chained FNV-1a hashes, ``cache_salt`` included, so prompts with
   different salts never share). The router remembers, in a bounded LRU map,
   block hash -> the engine it last sent that prefix to. A request goes to the
   engine holding its longest remembered prefix, unless that engine is
   *overloaded*: it has more than ``balance_abs_threshold`` requests more than
   the least loaded engine *and* more than ``balance_rel_threshold`` times as
   many (the two-threshold rule of SGLang's cache-aware router: a small
   imbalance is worth a cache hit, a large one is not).
2. **Least loaded.** Otherwise the available engine with the fewest requests
   (:attr:`EngineLoad.num_requests`), then the lowest KV cache usage; ties go
   round-robin so that an idle server spreads its first requests.

``policy="round_robin"`` replaces both with plain rotation over the
available engines (SGLang's ``round_robin`` router policy): the baseline the
affinity rule is measured against (bench/dp_routing.py).

Engines that cannot take work (dead, stalled, restarting) are never chosen.
The router is pure bookkeeping: it never looks at a clock or a socket, so it
is tested on made-up loads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from paternoster import _core

#: Leading full blocks of a prompt that are hashed and remembered (4096 tokens
#: at block size 16): enough to tell long shared prefixes apart.
DEFAULT_MAX_PREFIX_BLOCKS = 256
#: Block hashes remembered (LRU), all engines together.
DEFAULT_MAX_ENTRIES = 1 << 16
#: The routing policies :class:`Router` knows (``--data-parallel-routing``).
ROUTING_POLICIES = ("affinity", "round_robin")


def prefix_block_hashes(token_ids: Sequence[int], block_size: int,
                        cache_salt: str | None = None,
                        max_blocks: int = DEFAULT_MAX_PREFIX_BLOCKS) -> list[int]:  # fmt: skip
    """The prefix-cache hashes of a prompt's leading full blocks, as the
    engine's KV cache manager computes them (``paternoster._core``).

    Args:
        token_ids: the prompt's token ids.
        block_size: the engine's KV block size in tokens (>= 1).
        cache_salt: the request's ``cache_salt`` (``None``: none).
        max_blocks: hash at most this many leading blocks (>= 0).
    Returns:
        One hash per full block, first block first (a partial last block has none).
    Raises:
        ValueError: ``block_size`` < 1 or ``max_blocks`` < 0.
    """
    return _core.prefix_block_hashes(token_ids, block_size, cache_salt, max_blocks)


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load as the router sees it.

    Attributes:
        available: the engine takes new requests (not dead, stalled,
            restarting or shutting down).
        num_requests: requests in the engine (waiting and running), counting
            those routed to it and not yet reflected in its stats.
        kv_cache_usage: fraction of its KV cache blocks in use (0-1).
    """

    available: bool
    num_requests: int = 0
    kv_cache_usage: float = 0.0


class NoEngineAvailableError(Exception):
    """No engine can take a request now (the router's callers map it to
    :class:`~paternoster.frontend.errors.EngineDeadError`)."""


class Router:
    """Prefix-affinity-then-least-loaded routing over ``num_engines`` engines.

    Args:
        num_engines: engines to route between (>= 1).
        policy: ``"affinity"`` (the module's rule) or ``"round_robin"``
            (rotation over the available engines, prefixes and loads ignored).
        max_entries: block hashes remembered (LRU), >= 1.
        balance_abs_threshold: an affinity engine is overloaded only with more
            than this many requests above the least loaded one (>= 0).
        balance_rel_threshold: ... and more than this many times its
            requests (>= 1.0).
    Raises:
        ValueError: a value out of range, naming it.
    """

    def __init__(self, num_engines: int, max_entries: int = DEFAULT_MAX_ENTRIES,
                 balance_abs_threshold: int = 8, balance_rel_threshold: float = 1.5,
                 policy: str = "affinity"):  # fmt: skip
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(ROUTING_POLICIES)}, got {policy!r}")
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}")
        if balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        self.num_engines = num_engines
        self.policy = policy
        self.max_entries = max_entries
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self._where: OrderedDict[int, int] = OrderedDict()  # block hash -> engine
        self._next = 0  # round-robin start among equally loaded engines
        self.num_affinity_routed = 0  # affinity: sent where the prefix is cached
        self.num_load_routed = 0  # affinity: sent to the least loaded engine
        self.num_round_robin_routed = 0  # round_robin: every request

    def __len__(self) -> int:
        """Block hashes remembered."""
        return len(self._where)

    def cached_engine(self, hashes: Sequence[int]) -> tuple[int, int] | None:
        """Where the longest remembered prefix of a prompt was sent.

        Args:
            hashes: the prompt's leading block hashes (:func:`prefix_block_hashes`).
        Returns:
            ``(engine, number of blocks of that prefix)``, or ``None``.
        """
        for i in range(len(hashes) - 1, -1, -1):  # chained: the deepest hit is the longest
            engine = self._where.get(hashes[i])
            if engine is not None:
                return engine, i + 1
        return None

    def is_overloaded(self, load: EngineLoad, least: EngineLoad) -> bool:
        """True when ``load`` is too far above ``least`` for affinity to win."""
        extra = load.num_requests - least.num_requests
        ratio_cap = self.balance_rel_threshold * least.num_requests
        return extra > self.balance_abs_threshold and load.num_requests > ratio_cap

    def route(self, hashes: Sequence[int], loads: Sequence[EngineLoad]) -> int:
        """Choose the engine for a request and remember its prefix there.

        Args:
            hashes: the request's leading block hashes (may be empty).
            loads: every engine's load, by engine index.
        Returns:
            The engine index.
        Raises:
            NoEngineAvailableError: no engine is available.
            ValueError: ``loads`` does not have one entry per engine.
        """
        if len(loads) != self.num_engines:
            raise ValueError(f"expected {self.num_engines} engine loads, got {len(loads)}")
        if self.policy == "round_robin":
            chosen = self.next_available(loads)
            self.num_round_robin_routed += 1
            return chosen
        least = self.least_loaded(loads)
        chosen = least
        cached = self.cached_engine(hashes)
        if cached is not None:
            engine = cached[0]
            if loads[engine].available and not self.is_overloaded(loads[engine], loads[least]):
                chosen = engine
        if chosen == least:
            self.num_load_routed += 1
            self._next = (least + 1) % self.num_engines
        else:
            self.num_affinity_routed += 1
        self.record(hashes, chosen)
        return chosen

    def next_available(self, loads: Sequence[EngineLoad]) -> int:
        """The first available engine at or after the rotation point, which
        then moves past it (``round_robin``).

        Raises:
            NoEngineAvailableError: no engine is available.
        """
        n = len(loads)
        for k in range(n):
            i = (self._next + k) % n
            if loads[i].available:
                self._next = (i + 1) % n
                return i
        raise NoEngineAvailableError("no engine is available")

    def least_loaded(self, loads: Sequence[EngineLoad]) -> int:
        """The available engine with the fewest requests, then the lowest KV
        usage; ties round-robin.

        Raises:
            NoEngineAvailableError: no engine is available.
        """
        n = len(loads)
        candidates = [i for i in range(n) if loads[i].available]
        if not candidates:
            raise NoEngineAvailableError("no engine is available")
        return min(candidates, key=lambda i: (loads[i].num_requests, loads[i].kv_cache_usage,
                                              (i - self._next) % n))  # fmt: skip

    def record(self, hashes: Sequence[int], engine: int) -> None:
        """Remember that the prefix ``hashes`` was sent to ``engine`` (latest wins).

        Raises:
            ValueError: ``engine`` out of range.
        """
        if not 0 <= engine < self.num_engines:
            raise ValueError(f"engine must be in [0, {self.num_engines}), got {engine}")
        where = self._where
        for h in hashes:
            where[h] = engine
            where.move_to_end(h)
        while len(where) > self.max_entries:
            where.popitem(last=False)

    def forget(self, engine: int | None = None) -> None:
        """Forget the prefixes sent to ``engine`` (its cache is gone: it
        restarted, or was reset), or to every engine with ``None``."""
        if engine is None:
            self._where.clear()
            return
        for h in [h for h, e in self._where.items() if e == engine]:
            del self._where[h]

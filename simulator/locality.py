"""The router's KV locality index and the ``stale_kv_index`` fault.

Each pod holds the KV of its ``capacity`` most recent prompt prefixes (LRU): that is the
truth. The router keeps an *index* (prefix → pod) that it routes by: a prefix it knows
goes to the indexed pod (the hint), an unknown one to a pod drawn at random (seeded): a
load-balancing fallback spreads without a period, where round robin would send every
k-th request back to the same pod and fake locality. A hint
is a **cache hit** when the pod really holds the prefix; otherwise the engine **rejects the
hint** (it recomputes the prefill). Healthy, the index
is updated on every request, so hints are right until the LRU evicts.

``stale_kv_index``: the index stops being updated and its entries point one pod over
(what an index that missed a rebalance looks like): every known prefix's next hint is
rejected, and prefixes seen since are never indexed, so they scatter and miss; the cache
hit ratio drops. Clearing the fault rebuilds the index from the truth.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LocalityIndex", "RouteChoice", "prefix_key"]


def prefix_key(prompt: str, chars: int = 256) -> str:
    """The cache key of a prompt: a hash of its first ``chars`` characters."""
    return hashlib.blake2b(prompt[:chars].encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class RouteChoice:
    """Where the router sent a request and what the hint turned out to be."""

    upstream: str
    hinted: bool  # the index had the prefix
    hit: bool  # the pod held its KV
    hint_rejected: bool  # hinted, but the pod did not hold it


class LocalityIndex:
    """Prefix → pod index over ``upstreams``, each pod caching ``capacity`` prefixes."""

    def __init__(self, upstreams: Sequence[str], capacity: int = 64, seed: int = 0) -> None:
        self.upstreams = list(upstreams)
        self.capacity = capacity
        self.cached: dict[str, OrderedDict[str, None]] = {u: OrderedDict() for u in self.upstreams}
        self.index: dict[str, str] = {}
        self.stale = False
        self.lookups = self.hits = self.hints_rejected = 0
        self._rng = random.Random(seed)

    def route(self, key: str, eligible: Sequence[str]) -> RouteChoice:
        """Pick the pod for prefix ``key`` among ``eligible`` and record the outcome."""
        hint = self.index.get(key)
        hinted = hint is not None and hint in eligible
        # no hint: spread, as a router without locality would
        upstream = hint if hint is not None and hinted else self._rng.choice(list(eligible))
        hit = key in self.cached[upstream]
        self.lookups += 1
        self.hits += hit
        self.hints_rejected += hinted and not hit
        self._cache(upstream, key)
        if not self.stale:
            self.index[key] = upstream
        return RouteChoice(upstream, hinted, hit, hinted and not hit)

    def _cache(self, upstream: str, key: str) -> None:
        lru = self.cached[upstream]
        lru[key] = None
        lru.move_to_end(key)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def set_stale(self) -> None:
        """The ``stale_kv_index`` fault: freeze the index, each entry one pod over."""
        n = len(self.upstreams)
        shifted = {u: self.upstreams[(i + 1) % n] for i, u in enumerate(self.upstreams)}
        self.index = {key: shifted[u] for key, u in self.index.items()}
        self.stale = True

    def clear_stale(self) -> None:
        """Rebuild the index from what the pods really hold and resume updating it."""
        self.index = {key: u for u, lru in self.cached.items() for key in lru}
        self.stale = False

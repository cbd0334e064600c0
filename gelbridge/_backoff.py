"""Exponential backoff with a cap and jitter: the one delay rule every retry and
reconnect loop uses (PDS client, Jetstream, firehose sources, provider transport)."""

from __future__ import annotations

import random
from typing import Protocol

__all__ = ["backoff_delay"]


class _Rng(Protocol):
    def random(self) -> float: ...


def backoff_delay(
    failures: int,
    *,
    base: float,
    cap: float,
    spread: tuple[float, float] = (0.75, 1.25),
    rng: _Rng = random,
    max_doublings: int = 10,
) -> float:
    """Seconds to wait after ``failures`` consecutive failures (1-based).

    ``min(cap, base * 2**(failures-1))``, the doublings stopped at ``max_doublings`` (no
    overflow however long a peer stays away), times a factor drawn uniformly from
    ``spread`` (low, high) so that many clients do not retry in step. The jitter stays
    inside the cap: near it the factor's upper end shrinks to ``cap / raw``, so the
    delay never exceeds ``cap`` and is still spread below it.
    """
    raw = min(cap, base * 2.0 ** min(max(failures - 1, 0), max_doublings))
    low, high = spread
    if raw > 0:
        high = max(low, min(high, cap / raw))
    return min(cap, raw * (low + (high - low) * rng.random()))

"""backoff_delay: grows exponentially, stops at the cap, stays within its jitter spread."""

from __future__ import annotations

import random

import pytest

from gelbridge._backoff import backoff_delay


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_doubles_per_failure_until_the_cap() -> None:
    mid = _Fixed(0.5)  # factor 1.0 with the default spread; at the cap the spread is 0.75..1.0
    assert [backoff_delay(n, base=0.5, cap=5.0, rng=mid) for n in range(1, 7)] == [0.5, 1, 2, 4, 4.375, 4.375]


def test_stays_within_the_spread_and_never_above_the_cap() -> None:
    rng = random.Random(7)
    for n in range(1, 20):
        raw = min(30.0, 0.5 * 2 ** min(n - 1, 10))
        d = backoff_delay(n, base=0.5, cap=30.0, rng=rng)
        assert 0.75 * raw <= d < 1.25 * raw and d <= 30.0


def test_jitter_near_the_cap_is_inside_it() -> None:
    """33.4 s was seen with a 30 s cap: the spread went above it. At and near the cap the
    delays stay at most the cap and are still spread (not all equal to it)."""
    assert backoff_delay(50, base=0.5, cap=30.0, rng=_Fixed(0.999)) <= 30.0
    assert backoff_delay(6, base=1.0, cap=30.0, rng=_Fixed(0.999)) <= 30.0  # raw 32 -> 30, factor capped
    rng = random.Random(3)
    at_cap = [backoff_delay(40, base=0.5, cap=30.0, rng=rng) for _ in range(200)]
    assert max(at_cap) <= 30.0 and min(at_cap) >= 22.5 and len(set(at_cap)) > 150
    near = [backoff_delay(6, base=1.0, cap=40.0, rng=rng) for _ in range(200)]  # raw 32, spread 24..40
    assert max(near) <= 40.0 and min(near) >= 24.0


def test_custom_spread_bounds() -> None:
    assert backoff_delay(1, base=2.0, cap=8.0, spread=(0.5, 1.0), rng=_Fixed(0.0)) == 1.0
    assert backoff_delay(1, base=2.0, cap=8.0, spread=(0.5, 1.0), rng=_Fixed(0.999)) == pytest.approx(1.999)


def test_doublings_stop_so_a_huge_failure_count_does_not_overflow() -> None:
    d = backoff_delay(10_000, base=0.001, cap=1e9, spread=(1.0, 1.0))
    assert d == pytest.approx(0.001 * 2**10)
    assert backoff_delay(10_000, base=0.001, cap=1e9, spread=(1.0, 1.0), max_doublings=20) == pytest.approx(0.001 * 2**20)


def test_jitter_varies_the_delay() -> None:
    rng = random.Random(1)
    assert len({backoff_delay(3, base=1.0, cap=30.0, rng=rng) for _ in range(50)}) > 40

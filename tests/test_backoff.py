"""backoff_delay: grows exponentially, stops at the cap, stays within its jitter spread."""

from __future__ import annotations

import random

import pytest

from gelbridge.backoff import backoff_delay


class _Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_doubles_per_failure_until_the_cap() -> None:
    mid = _Fixed(0.5)  # factor 1.0 with the default spread
    assert [backoff_delay(n, base=0.5, cap=5.0, rng=mid) for n in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]


def test_stays_within_the_spread() -> None:
    rng = random.Random(7)
    for n in range(1, 20):
        raw = min(30.0, 0.5 * 2 ** min(n - 1, 10))
        d = backoff_delay(n, base=0.5, cap=30.0, rng=rng)
        assert 0.75 * raw <= d < 1.25 * raw


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

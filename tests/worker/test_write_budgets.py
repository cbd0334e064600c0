"""The write budgets a reply spends from, without a PDS: the relay's per-host event
windows (``RelayBudget``), the PDS budget's pressure, the one progress policy
(``progress_gap``: spaced out at half, skipped at 80 %, never for claims or finals), where
``[relay] limits = "auto"`` applies, and the points kept per turn for ``gelbridge status``."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gelbridge._config import RelayConfig, Settings
from gelbridge._pds import RelayBudget, WriteBudget
from gelbridge._runtime.status import status_report
from gelbridge._state import SCHEMA_VERSION, SqliteStore, TurnTiming
from gelbridge._worker.writer import SKIP_AT, SPACE_OUT_AT, SPACING, progress_gap


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def test_relay_windows_count_what_falls_inside_them_and_forget_the_rest() -> None:
    clock = Clock()
    r = RelayBudget("pds.example", 50, 2600, 21000, clock=clock)
    r.note(10)
    assert r.counts() == {"second": 10, "hour": 10, "day": 10}
    clock.t += 1.0
    r.note(5)
    assert r.counts() == {"second": 5, "hour": 15, "day": 15}
    assert r.pressure() == pytest.approx(5 / 50)
    clock.t += 3600 + 60  # past the hour window (minute buckets)
    assert r.counts() == {"second": 0, "hour": 0, "day": 15}
    clock.t += 86400 + 3600
    r.note()
    assert r.counts() == {"second": 1, "hour": 1, "day": 1}
    assert sum(len(b) for b in r._buckets.values()) <= 3  # old buckets are dropped, memory stays bounded
    r.note(2600)
    assert r.pressure() == pytest.approx(2601 / 50)  # the second window is far over


def test_the_pds_budget_pressure_is_the_share_used_until_the_reset() -> None:
    b = WriteBudget()
    assert b.pressure() == 0.0  # nothing stated yet
    b.seen({"ratelimit-limit": "5000;w=3600", "ratelimit-remaining": "1000",
            "ratelimit-reset": str(time.time() + 600)})
    assert b.pressure() == pytest.approx(0.8)
    b.reset_at = time.time() - 1
    assert b.pressure() == 0.0  # a new window began


def pds(remaining: int | None = None, limit: int = 5000, relay_used: int = 0) -> SimpleNamespace:
    budget = WriteBudget(limit=limit if remaining is not None else None, remaining=remaining,
                         reset_at=time.time() + 3600)
    relay = RelayBudget("h", 1_000_000, 100, 1_000_000)
    relay.note(relay_used) if relay_used else None
    return SimpleNamespace(budget=budget, relay=relay)


@pytest.mark.parametrize(("p", "expected"), [
    (pds(), 2.0),
    (pds(remaining=4000), 2.0),                     # 20 % used
    (pds(remaining=2000), 2.0 * SPACING),           # 60 %: spaced out
    (pds(remaining=900), None),                     # 82 %: skipped
    (pds(remaining=50, limit=60), None),            # under the reserve (100 points)
    (pds(relay_used=49), 2.0),
    (pds(relay_used=int(SPACE_OUT_AT * 100)), 2.0 * SPACING),
    (pds(relay_used=int(SKIP_AT * 100)), None),
    (SimpleNamespace(), 2.0),                       # a client without budgets (a fake)
])
def test_progress_updates_are_spaced_out_then_skipped_as_a_budget_runs_low(p: SimpleNamespace,
                                                                           expected: float | None) -> None:
    assert progress_gap(2.0, p, reserve_points=100) == expected


def test_relay_limits_apply_to_a_self_hosted_pds_and_not_to_bluesky_or_loopback() -> None:
    auto = RelayConfig()
    assert auto.applies_to("https://pds.example.com")
    assert not auto.applies_to("https://morel.us-east.host.bsky.network")
    assert not auto.applies_to("https://bsky.social")
    assert not auto.applies_to("http://127.0.0.1:2583") and not auto.applies_to("http://localhost:2583")
    assert RelayConfig(limits="on").applies_to("http://127.0.0.1:1")
    assert not RelayConfig(limits="off").applies_to("https://pds.example.com")
    with pytest.raises(ValueError):
        Settings.model_validate({"relay": {"events_per_hour": 0}})


async def test_turns_keep_their_points_and_status_sums_them_by_hour_and_day(tmp_path: Path) -> None:
    clock = Clock()
    did = "did:plc:pointsaaaaaaaaaaaaaaaaa"
    with SqliteStore.open_dir(tmp_path, clock=clock) as s:
        assert await s.schema_version() == SCHEMA_VERSION >= 4
        await s.save_session("http://pds.test|bot.test", {"did": did, "handle": "bot.test", "accessJwt": "a",
                                                    "refreshJwt": "r"})
        for ago, points in ((7200, 30), (1800, 6), (60, 4)):
            await s.record_turn(TurnTiming(f"3m{ago}.r0", did, "complete", 1, 2, 3, 4, at=clock.t - ago, points=points))
        await s.record_turn(TurnTiming("3mother.r0", "did:plc:other", "complete", 1, 2, 3, 4, points=100))
        await s.save_write_budget(did, 5000, 4321, clock.t + 900)
        assert await s.points_since(did, clock.t - 3600) == 10 and await s.points_since(did, clock.t - 86400) == 40
        settings = Settings.model_validate({"state": {"dir": str(tmp_path)},
                                            "account": {"pds": "http://pds.test", "identifier": "bot.test"}})
        rep = await status_report(settings, s, now=clock.t)
    [acct] = rep["accounts"]
    assert acct["points"] == {"last_hour": 10, "last_day": 40}
    assert acct["budget"]["remaining"] == 4321 and acct["budget"]["limit"] == 5000
    assert [t["points"] for t in acct["turns"]] == [4, 6, 30]  # this account's turns only


def test_a_saved_budget_is_restored_only_while_its_window_is_open() -> None:
    """A worker taking an account over (a restart, or another worker of the fleet) starts
    from the budget the PDS last stated, until that budget's reset."""
    from gelbridge._pds import WriteBudget

    open_window = WriteBudget()
    open_window.restore(5000, 40, time.time() + 600)
    assert open_window.low(100) and open_window.remaining == 40
    past = WriteBudget()
    past.restore(5000, 40, time.time() - 1)
    assert past.remaining is None and not past.low(100)

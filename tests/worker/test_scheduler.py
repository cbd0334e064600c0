"""Scheduling: one conversation in order, others in parallel, regeneration cancels, shutdown."""

from __future__ import annotations

import asyncio

from gelbridge._worker.decide import Ask
from gelbridge._worker.scheduler import Scheduler
from gelbridge._worker.turn import TurnJob, TurnReport


def job(msg: str, conv: str, attempt: int = 0) -> TurnJob:
    return TurnJob(ask=Ask(msg, attempt, f"{msg}.r{attempt}", conv, None), writer=None, received_at=0.0)  # type: ignore[arg-type]


class Recorder:
    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.log: list[tuple[str, str]] = []
        self.cancelled: list[tuple[str, str | None]] = []
        self.queued_cancel: list[str] = []
        self.running = 0
        self.peak = 0

    async def run(self, j: TurnJob) -> TurnReport:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.log.append(("start", j.ask.reply_rkey))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled.append((j.ask.reply_rkey, j.cancel_reason))
            raise
        finally:
            self.running -= 1
        self.log.append(("end", j.ask.reply_rkey))
        return TurnReport("complete", None, None, 1)  # type: ignore[arg-type]

    async def cancel_queued(self, j: TurnJob) -> None:
        self.queued_cancel.append(j.ask.reply_rkey)


async def test_one_conversation_runs_in_order_while_others_run_in_parallel() -> None:
    r = Recorder()
    s = Scheduler(r.run, r.cancel_queued, concurrency=4)
    for m in ("a1", "a2", "a3"):
        s.submit(job(m, "A"))
    for m in ("b1", "c1", "d1"):
        s.submit(job(m, m))
    assert await s.wait_idle(5)
    a = [rk for ev, rk in r.log if rk.startswith("a")]
    assert a == ["a1.r0", "a1.r0", "a2.r0", "a2.r0", "a3.r0", "a3.r0"]
    assert r.peak == 4


async def test_concurrency_is_bounded() -> None:
    r = Recorder(0.02)
    s = Scheduler(r.run, r.cancel_queued, concurrency=3)
    for i in range(12):
        s.submit(job(f"m{i}", f"c{i}"))
    assert await s.wait_idle(5)
    assert r.peak == 3 and len(r.log) == 24


async def test_newer_attempt_cancels_the_running_older_one_and_drops_a_queued_one() -> None:
    r = Recorder(1.0)
    s = Scheduler(r.run, r.cancel_queued, concurrency=2)
    s.submit(job("k", "A", 0))
    await asyncio.sleep(0.05)
    s.submit(job("k", "A", 1))   # queued behind r0 in the same conversation
    s.submit(job("k", "A", 2))   # cancels running r0 and queued r1
    assert await s.wait_idle(5)
    assert r.cancelled == [("k.r0", "superseded")]
    assert r.queued_cancel == ["k.r1"]
    assert ("end", "k.r2") in r.log
    s.submit(job("k", "A", 1))   # an older attempt arriving late is cancelled at once
    await s.wait_idle(5)
    assert r.queued_cancel == ["k.r1", "k.r1"]


async def test_shutdown_cancels_running_turns_after_grace_and_leaves_queued_ones() -> None:
    r = Recorder(10.0)
    s = Scheduler(r.run, r.cancel_queued, concurrency=1)
    s.submit(job("x", "A"))
    s.submit(job("y", "B"))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(s.shutdown(grace=0.1), 5)
    assert r.cancelled == [("x.r0", "shutdown")]
    assert ("start", "y.r0") not in r.log

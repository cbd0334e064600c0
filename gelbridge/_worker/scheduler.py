"""Turn scheduling: one conversation's turns in order, many conversations at once (bounded),
and a newer attempt of a message cancelling an older one (PROTOCOL.md §4.1).

- Each conversation has a FIFO; a runner task per busy conversation drains it, taking a
  slot of the global ``concurrency`` semaphore for each turn.
- ``submit`` of attempt ``n`` of message ``K``: an older attempt of ``K`` still queued is
  dropped and written ``cancelled``; one still running is cancelled (its turn writes
  ``cancelled``); an attempt older than one already seen is cancelled at once.
- ``shutdown(grace)``: stop taking work, let running turns finish for ``grace`` seconds,
  then cancel them (they write ``error``/``interrupted``). Queued turns are left claimed
  (``pending``) in the state store: the next start finishes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gelbridge._errors import where_it_failed
from gelbridge._worker.turn import TurnJob, TurnReport

log = logging.getLogger("gelbridge.worker.scheduler")

RunTurn = Callable[[TurnJob], Coroutine[Any, Any, TurnReport]]
CancelQueued = Callable[[TurnJob], Awaitable[None]]


class Scheduler:
    def __init__(self, run: RunTurn, cancel_queued: CancelQueued, *, concurrency: int = 8) -> None:
        self._run = run
        self._cancel_queued = cancel_queued
        self._sem = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self._queues: dict[str, deque[TurnJob]] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, tuple[TurnJob, asyncio.Task[TurnReport]]] = {}
        self._jobs: dict[str, TurnJob] = {}  # every queued or running job by reply rkey
        self._latest: dict[str, int] = {}  # message rkey -> highest attempt seen
        self._side: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False
        self.completed = 0

    # --- queries ------------------------------------------------------------------------

    def is_active(self, reply_rkey: str) -> bool:
        return reply_rkey in self._jobs

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def running(self) -> int:
        return len(self._running)

    def active_rkeys(self) -> list[str]:
        return sorted(self._jobs)

    # --- submit ------------------------------------------------------------------------------

    def submit(self, job: TurnJob) -> None:
        """Queue a claimed turn (never blocks)."""
        if self.closed:
            raise RuntimeError("the scheduler is shut down")
        ask = job.ask
        if ask.reply_rkey in self._jobs:
            return
        latest = self._latest.get(ask.message_rkey, -1)
        if ask.attempt < latest:
            log.info("reply %s superseded before it started", ask.reply_rkey)
            job.cancel_reason = "superseded"
            self._side_task(self._cancel_queued(job))
            return
        self._latest[ask.message_rkey] = ask.attempt
        self._supersede(ask.message_rkey, ask.attempt)
        self._jobs[ask.reply_rkey] = job
        self._idle.clear()
        self._queues.setdefault(ask.conversation, deque()).append(job)
        if ask.conversation not in self._runners:
            self._runners[ask.conversation] = asyncio.create_task(
                self._drain(ask.conversation), name=f"conversation {ask.conversation}"
            )

    def _supersede(self, message_rkey: str, attempt: int) -> None:
        for rk, job in list(self._jobs.items()):
            if job.ask.message_rkey != message_rkey or job.ask.attempt >= attempt:
                continue
            job.cancel_reason = "superseded"
            running = self._running.get(rk)
            if running is not None:
                log.info("reply %s superseded by attempt %d: cancelling it", rk, attempt)
                running[1].cancel()
                continue
            q = self._queues.get(job.ask.conversation)
            if q is not None and job in q:
                q.remove(job)
            self._jobs.pop(rk, None)
            self._side_task(self._cancel_queued(job))

    def _side_task(self, coro: Awaitable[None]) -> None:
        async def wrap() -> None:
            try:
                await coro
            except Exception as e:  # noqa: BLE001
                log.warning("writing a cancelled reply failed (%s)", type(e).__name__)

        t = asyncio.create_task(wrap())
        self._side.add(t)
        t.add_done_callback(self._side.discard)

    # --- running ---------------------------------------------------------------------------------

    async def _drain(self, conversation: str) -> None:
        q = self._queues[conversation]
        try:
            while q and not self.closed:
                job = q.popleft()
                async with self._sem:
                    if self.closed:
                        q.appendleft(job)
                        break
                    task = asyncio.create_task(self._run(job), name=f"turn {job.ask.reply_rkey}")
                    self._running[job.ask.reply_rkey] = (job, task)
                    try:
                        await asyncio.wait({task})
                    finally:
                        self._running.pop(job.ask.reply_rkey, None)
                        self._jobs.pop(job.ask.reply_rkey, None)
                    self.completed += 1
                    exc = None if task.cancelled() else task.exception()
                    if exc is not None:
                        log.error("turn %s crashed (%s)", job.ask.reply_rkey, where_it_failed(exc))
        finally:
            if not q:
                self._queues.pop(conversation, None)
            self._runners.pop(conversation, None)
            if not self._jobs:
                self._idle.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no turn is queued or running; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        if self._side:
            await asyncio.wait(set(self._side), timeout=timeout)
        return True

    async def shutdown(self, grace: float, *, before_cancel: Callable[[], None] | None = None) -> None:
        """Stop; running turns get ``grace`` seconds, then are cancelled (bounded).
        ``before_cancel`` runs first when some are still running (the fleet revokes the
        lease there: those turns are handed over, not ended)."""
        self.closed = True
        running = [t for _, t in self._running.values()]
        if running and grace > 0:
            await asyncio.wait(running, timeout=grace)
        if before_cancel is not None and any(not t.done() for _, t in self._running.values()):
            before_cancel()
        for job, task in list(self._running.values()):
            if not task.done():
                job.cancel_reason = job.cancel_reason or "shutdown"
                task.cancel()
        left = [t for _, t in self._running.values()] + list(self._side)
        if left:
            await asyncio.wait(left, timeout=20)
        for r in list(self._runners.values()):
            r.cancel()
        if self._runners:
            await asyncio.wait(list(self._runners.values()), timeout=5)

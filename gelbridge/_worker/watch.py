"""The one intake of :meth:`gelbridge._bridge.Bridge.run` (``gelbridge run``, one account
or many) and of :meth:`Bridge.serve`: the event sources ``[watch]`` asks for, built by
their own modules (``config.SOURCE_BUILDERS``) for a set of workers, and where their
events, gaps and reconnects go.

- ``firehose``: one :class:`FirehoseSource` per PDS host, carrying every account on it;
  ``poll``: one :class:`PollSource` per account; ``jetstream``: one
  :class:`~gelbridge._jetstream.JetstreamSource` for all accounts. Each is an
  :class:`~gelbridge._worker.sources.EventSource`.
- Every record goes to one handler as an :class:`IncomingRecord` (``Bridge.process``,
  which routes by DID and checks the account; :func:`deliver` hands it to the worker's
  ``handle_event``); it returns once the record's effects are durable, so the source
  may move its cursor past it.
- A firehose gap (``OutdatedCursor``, a repo's ``#sync``, ``FutureCursor``) backfills the
  accounts it concerns (:func:`backfill_logged`); a reconnect of any source (firehose,
  Jetstream, a poll that works again) tells their workers (:meth:`Worker.reconnected`:
  cached side records dropped, recovery sweep now).

The per-account work itself stays on the :class:`~gelbridge._worker.Worker`:
``backfill``, ``recover_claims`` and ``sweep_loop``. Both run their tasks until stopped
with :func:`run_until` and stop them with :func:`stop_tasks`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gelbridge._config import SOURCE_BUILDERS, WatchConfig
from gelbridge._errors import ConfigError
from gelbridge._ingest import IncomingRecord
from gelbridge._worker.sources import EventSource, GapHandler, RecordHandler, SourceHooks

if TYPE_CHECKING:
    pass

log = logging.getLogger("gelbridge.worker.watch")



async def deliver(worker: Any, rec: IncomingRecord, received_at: float | None = None) -> str:
    """Hand ``rec`` to ``worker.handle_event``; its decision, once the effects are durable."""
    result: str = await worker.handle_event(
        rec.did, rec.collection, rec.rkey, rec.cid, rec.record, action=rec.action, received_at=received_at,
    )
    return result


async def backfill_logged(label: str, worker: Any, why: str = "start-up") -> None:
    """``worker.backfill()`` in the background: its outcome is logged, never raised (the
    live source and the recovery sweeps carry on either way)."""
    try:
        rep = await worker.backfill()
    except Exception as e:  # noqa: BLE001
        log.error("account %s: %s backfill failed (%s)", label, why, type(e).__name__)
        return
    log.info("account %s: %s backfill found %d owed, resumed %d", label, why, rep.owed, rep.resumed)


def watch_sources(
    watch: WatchConfig,
    workers: Mapping[str, Any],
    store: Any,
    handler: RecordHandler,
    *,
    firehose_in_flight: int = 64,
) -> list[tuple[str, EventSource]]:
    """``(name, source)`` for every event source ``watch`` asks for, serving ``workers``
    (started, by account label): built by the source's own module, named in
    ``config.SOURCE_BUILDERS``. ``store`` keeps the firehose and Jetstream cursors (a poll
    source uses its worker's own store); ``firehose_in_flight`` bounds the records of one
    subscription handled at once. Run each with ``await source.run()``."""
    target = SOURCE_BUILDERS.get(watch.source)
    if target is None:  # pragma: no cover - the config's Literal admits only known names
        raise ConfigError(f"[watch] source = {watch.source!r} is not a source gelbridge has")
    module, _, name = target.partition(":")
    build = getattr(importlib.import_module(module), name)
    hooks = SourceHooks(gap=_backfill_gap, reconnected=_tell_reconnected, firehose_in_flight=firehose_in_flight)
    return list(build(watch, workers, store, handler, hooks))


async def run_until(stop: asyncio.Event, tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait until ``stop`` is set or one of ``tasks`` ends; a task that failed has its
    exception raised here (a source or sweep never ends by itself)."""
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    for t in done:
        if t is not stopper and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


async def stop_tasks(tasks: Sequence[asyncio.Task[Any]], sources: Iterable[Any] = (), timeout: float = 5.0) -> None:
    """Cancel ``tasks`` (sources, sweeps, backfills), then let the records a firehose source
    still has in flight finish, so their claims and its cursor are saved; each step bounded
    by ``timeout`` s."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    for src in sources:
        await src.drain(timeout=timeout)


def _backfill_gap(group: Sequence[tuple[str, Any]]) -> GapHandler:
    """Backfill the accounts of ``group`` a gap concerns (``did``, or all of them for None)."""

    async def on_gap(did: str | None) -> None:
        await asyncio.gather(*(backfill_logged(label, w, "gap") for label, w in group if did in (None, w.did)))

    return on_gap


def _tell_reconnected(group: Sequence[tuple[str, Any]]) -> Callable[[], None]:
    def on_reconnect() -> None:
        for _, w in group:
            w.reconnected()

    return on_reconnect

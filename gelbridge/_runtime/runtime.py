"""The one run loop of a process: its state store, its accounts (a
:class:`~gelbridge._runtime.router.Router`), their intake, their upkeep, health and metrics.

``gelbridge run`` is ``Runtime(settings).run(stop, accounts)`` where ``accounts`` says which
accounts the process serves and when (:class:`AccountSet`):

- :class:`StaticAccounts`: the config's ``[account]`` or ``[[accounts]]``, all at start;
- :class:`gelbridge._fleet.Fleet`: those this fleet member holds leases on, coming and
  going with the leases (``[state] url``).

Both go through the same doors: :meth:`Runtime.attach` (start the account's worker, route
its DID, follow it), :meth:`Runtime.upkeep` (its backfill and recovery sweep) and
:meth:`Runtime.detach` (stop following it, give its running replies a grace period, close
it). The library :class:`~gelbridge._bridge.Bridge` uses the same runtime, fed by its
consumer instead of sources of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gelbridge import _tracing as tracing
from gelbridge._config import AccountEntry, Settings
from gelbridge._observability import AccountGauges, HttpLimits, Metrics, Watched
from gelbridge._runtime.intake import Intake, backfill_logged, run_until, stop_tasks
from gelbridge._runtime.router import Account, Router
from gelbridge._runtime.shared import SharedClients
from gelbridge._seams import ModelCaller, Printer
from gelbridge._state import Fence, StateStore, open_state, state_location
from gelbridge._tools.registry import ToolRegistry
from gelbridge._worker import Worker
from gelbridge._worker.service import RelayBudgets
from gelbridge._worker.sources import EventSource

if TYPE_CHECKING:
    from gelbridge._adapters.client import ModelClient

log = logging.getLogger("gelbridge.runtime")

#: one line of start-up output
Say = Callable[[str], None]


class WorkerFactory(Protocol):
    """Makes the (not yet started) worker of one account; the default is :class:`Worker`.
    ``model`` and ``registry`` are passed only when the runtime has a pool of shared
    clients (:class:`~gelbridge._runtime.shared.SharedClients`)."""

    def __call__(self, settings: Settings, *, keyring: Mapping[str, bytes] | None, store: StateStore | None,
                 environ: Mapping[str, str], metrics: Metrics | None, label: str, fence: Fence | None,
                 relays: RelayBudgets, model: ModelCaller | None = None,
                 registry: ToolRegistry | None = None) -> Worker: ...


class AccountSet(Protocol):
    """Which accounts a process serves, and when: it attaches them to the runtime (and
    detaches them), says ``ready`` once it serves, and returns when ``stop`` is set."""

    async def serve(self, runtime: Runtime, stop: asyncio.Event, say: Say, ready: Callable[[], None]) -> None: ...


class Runtime:
    """One process's accounts, their intake and upkeep (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        store: StateStore | None = None,
        keyrings: Mapping[str, Mapping[str, bytes]] | None = None,
        worker_factory: WorkerFactory | None = None,
        sweep_interval: float = 30.0,
        member: str | None = None,
        stats: Counter[str] | None = None,
        shared: SharedClients | None = None,
    ) -> None:
        """``keyrings`` (by account label) replace the keyring files; ``environ``: where app
        passwords are read (default ``os.environ``); ``store``: the state store to use, left
        open at the end (default: opened from ``[state]`` and closed with the runtime);
        ``member``: a fleet member's id (accounts come and go; one shared store);
        ``shared``: the process's model clients and MCP servers, given to every worker and
        left open at the end (default: the runtime's own, closed last; none with a
        ``worker_factory``, whose workers open their own)."""
        self.settings = settings
        self.environ = environ if environ is not None else os.environ
        self.member = member
        self.sweep_interval = sweep_interval
        self.router = Router(stats)
        self.metrics: Metrics | None = None
        self.watched: Watched | None = None
        #: True while the process follows sources of its own (else a consumer feeds it)
        self.following = False
        self._keyrings = dict(keyrings or {})
        self._factory: WorkerFactory = worker_factory or _new_worker
        self._given_store = store
        self._store: StateStore | None = None
        self._intake: Intake | None = None
        self._relays: RelayBudgets = {}
        self._upkeep: dict[str, list[asyncio.Task[None]]] = {}  # by DID
        self._observing: asyncio.Task[None] | None = None
        self._shared = shared
        self._own_shared = shared is None and worker_factory is None
        self._held: dict[int, list[ModelClient | ToolRegistry]] = {}  # by id() of the worker

    @property
    def store(self) -> StateStore:
        """The state store of the process (shared-source cursors; the accounts that keep their state there)."""
        if self._store is None:
            raise RuntimeError("the runtime is not open: await runtime.open() first")
        return self._store

    @property
    def intake(self) -> Intake:
        if self._intake is None:
            raise RuntimeError("the runtime is not open: await runtime.open() first")
        return self._intake

    @property
    def accounts(self) -> Mapping[str, Account]:
        """The served accounts by DID (read-only, live)."""
        return self.router.view()

    @property
    def sources(self) -> Mapping[str, EventSource]:
        """The intake's sources by name (empty before :meth:`open`; kept, stopped, after
        :meth:`close`: what was followed can still be read)."""
        return self._intake.sources if self._intake is not None else {}

    # --- open and close ------------------------------------------------------------------------

    async def open(self) -> None:
        """Bind the health/metrics listener (first: a taken port ends the start before any
        login or write), then open the state store."""
        tracing.configure(self.settings.observability)
        if self._own_shared and self._shared is None:
            # one per process, for the accounts that share a configuration; API keys and MCP
            # servers' variables come from the process environment, as a worker's own did
            # (``environ`` is where app passwords are read)
            self._shared = SharedClients()
        listen = self.settings.observability.listen
        if listen:
            self.metrics = Metrics()  # one registry for every account (labelled by account)
            self.watched = Watched(self.metrics, self._gauges, lambda: self.intake.sources if self.following else None)
            await self.watched.bind(listen, HttpLimits.of(self.settings.observability))
        try:
            self._store = self._given_store if self._given_store is not None else await open_state(self.settings)
            self._intake = Intake(self.settings.watch, self._store, self.router, member=self.member)
        except BaseException:
            await self._close_store()
            self._close_watched()
            raise
        if listen and self.watched is not None:
            self._observing = asyncio.create_task(self.watched.serve(listen), name="observability")

    async def close(self, grace: float | None = None) -> None:
        """Stop every source and upkeep; give running replies ``grace`` s (default
        ``[worker] shutdown_grace``), all accounts together; close what was opened."""
        g = self.settings.worker.shutdown_grace if grace is None else grace
        self.following = False
        if self._intake is not None:
            await self._intake.stop()
        await stop_tasks([t for tasks in self._upkeep.values() for t in tasks])
        self._upkeep.clear()
        accounts = list(self.router)
        closed = await asyncio.gather(*(a.worker.aclose(g) for a in accounts), return_exceptions=True)
        for account, res in zip(accounts, closed):
            self.router.remove(account.did)
            await self._release(account.worker)
            if isinstance(res, Exception):
                log.error("closing account %s failed (%s)", account.label, type(res).__name__)
        if self._observing is not None:
            self._observing.cancel()
            await asyncio.gather(self._observing, return_exceptions=True)
            self._observing = None
        self._close_watched()
        await self._close_store()  # the intake stays, stopped: what it followed can still be read
        if self._own_shared and self._shared is not None:
            await self._shared.aclose()  # last: every worker that used it has stopped
            self._shared = None

    async def _close_store(self) -> None:
        if self._store is not None and self._given_store is None:
            await self._store.aclose()
        self._store = None

    def _close_watched(self) -> None:
        if self.watched is not None:
            self.watched.close()

    # --- the doors: attach, upkeep, detach -----------------------------------------------------

    async def attach(self, entry: AccountEntry, *, fence: Fence | None = None) -> Account:
        """Start the worker of ``entry`` (log in, keyring, tools, model: the process's
        shared ones), route its DID here and follow it; its worker is closed again, and
        what it held given back, if any of that fails."""
        settings = self.settings.for_account(entry)
        shared = self.member is not None or state_location(settings) == state_location(self.settings)
        clients = await self._clients_for(settings)
        try:
            worker = self._factory(settings, keyring=self._keyrings.get(entry.label),
                                   store=self.store if shared else None, environ=self.environ, metrics=self.metrics,
                                   label=entry.label, fence=fence, relays=self._relays, **clients)
        except BaseException:
            await self._give_back(list(clients.values()))
            raise
        self._held[id(worker)] = list(clients.values())
        try:
            await worker.start()
            account = Account(entry.label, worker.did, settings, worker, fence)
            self.router.add(account)
        except BaseException:
            await worker.aclose(0)  # what it opened before failing
            await self._release(worker)
            raise
        self.intake.attach(account)
        return account

    async def _clients_for(self, settings: Settings) -> dict[str, Any]:
        """``model=`` and ``registry=`` for one account's worker, from the process's pool."""
        if self._shared is None:
            return {}
        model = await self._shared.model_for(settings)
        try:
            registry = await self._shared.tools_for(settings)
        except BaseException:
            await self._shared.release(model)
            raise
        return {"model": model, "registry": registry}

    async def _release(self, worker: Worker) -> None:
        """After ``worker`` stopped: give back what it held of the pool."""
        await self._give_back(self._held.pop(id(worker), []))

    async def _give_back(self, held: list[ModelClient | ToolRegistry]) -> None:
        if self._shared is not None:
            for resource in held:
                await self._shared.release(resource)

    def upkeep(self, account: Account, *, backfill: bool, in_background: bool = True) -> None:
        """Start ``account``'s recovery sweep, and with ``backfill`` and ``in_background``
        its backfill (else the caller runs it: :meth:`backfill_all`). Without a backfill
        (which ends with a sweep) the first sweep runs at once: a reply a crash left
        unfinished must not wait a whole interval. A changing set's poll source starts
        after the account's backfill (it reads the repo itself)."""
        w = account.worker
        tasks = [asyncio.create_task(w.sweep_loop(self.sweep_interval, at_start=not backfill),
                                     name=f"sweep-{account.label}")]
        if backfill and in_background:
            tasks.append(asyncio.create_task(self._backfill_then_poll(account), name=f"backfill-{account.label}"))
        elif self.member is not None:
            self.intake.start_poll(account)
        self._upkeep.setdefault(account.did, []).extend(tasks)

    async def _backfill_then_poll(self, account: Account) -> None:
        await self.intake.wait_live(account.did)
        await backfill_logged(account.label, account.worker)
        if self.member is not None:
            self.intake.start_poll(account)

    async def detach(self, account: Account, *, grace: float) -> None:
        """Stop following ``account`` and its upkeep, route its DID nowhere, give its
        running replies ``grace`` s and close its worker."""
        await self.intake.detach(account)
        self.router.remove(account.did)
        await stop_tasks(self._upkeep.pop(account.did, []))
        try:
            await account.worker.aclose(grace)
        finally:
            await self._release(account.worker)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """What runs until stopped: sources, sweeps, backfills, the health server (one that
        fails ends :func:`~gelbridge._runtime.intake.run_until` with its error)."""
        return [*self.intake.tasks, *(t for tasks in self._upkeep.values() for t in tasks),
                *([self._observing] if self._observing is not None else [])]

    # --- start-up ------------------------------------------------------------------------------

    async def startup_lines(self, account: Account) -> list[str]:
        """What ``gelbridge run`` prints for ``account`` once it is served."""
        return account.worker.startup_lines(await self.intake.describe(account))

    async def backfill_all(self, stop: asyncio.Event, say: Say) -> bool:
        """Every account's start-up backfill, at once; one that fails is logged and its
        account served anyway (the recovery sweep retries what it owes), as a background
        backfill is. False: ``stop`` was set first (the backfills are cancelled)."""
        accounts = list(self.router)
        work = asyncio.ensure_future(asyncio.gather(*(a.worker.backfill() for a in accounts),
                                                    return_exceptions=True))
        stopper = asyncio.ensure_future(stop.wait())
        both: set[asyncio.Future[Any]] = {work, stopper}
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return False
        for account, rep in zip(accounts, work.result()):
            who = f" ({account.label})" if len(accounts) > 1 else ""
            if isinstance(rep, BaseException):
                log.error("account %s: start-up backfill failed (%s); the recovery sweep retries what it owes",
                          account.label, type(rep).__name__)
                say(f"  backfill   failed ({type(rep).__name__}); the recovery sweep retries{who}")
                continue
            say(f"  backfill   {rep.messages} message(s) asking for replies, {rep.owed} owed, "
                f"{rep.resumed} unfinished resumed, {rep.unfinished_claims} claim(s) recovered{who}")
        return True

    # --- the run loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, accounts: AccountSet | None = None, *,
                  ready: asyncio.Event | None = None, out: Printer | None = None) -> None:
        """``gelbridge run``: open, serve ``accounts`` (default: the config's, all at
        start) until ``stop`` is set, then close with ``[worker] shutdown_grace`` for
        running replies."""

        def say(line: str) -> None:
            if out is not None:
                print(line, file=out, flush=True)

        def is_ready() -> None:
            if ready is not None:
                ready.set()

        try:
            await self.open()
            await (accounts or StaticAccounts()).serve(self, stop, say, is_ready)
        finally:
            await self.close()

    def _gauges(self) -> list[AccountGauges]:
        """What the health server reads of each account (no getattr probing: typed)."""
        out = []
        for a in self.router:
            w = a.worker
            client = w.client if w.started else None
            sched = w.scheduler if w.started else None
            out.append(AccountGauges(
                label=a.label, did=a.did, logged_in=w.started and w.pds.session is not None,
                queued=sched.queued if sched is not None else 0, running=sched.running if sched is not None else 0,
                points_remaining=client.budget.remaining if client is not None else None,
                relay=client.relay if client is not None else None,
                grants=((w.grants.book.honoured, w.grants.book.ignored)
                        if w.started and w.grants.enabled else None),
            ))
        return out


class StaticAccounts:
    """The config's accounts (``[account]`` or ``[[accounts]]``), all served from the start:
    log every account in, print what is served, follow the live sources at once, backfill
    what is owed while they run (no gap between the two), then the poll sources, say
    ``ready``, and serve until ``stop`` is set."""

    def __init__(self, *, backfill: bool | None = None) -> None:
        """``backfill``: the start-up backfill (default ``[worker] backfill``)."""
        self.backfill = backfill

    async def serve(self, runtime: Runtime, stop: asyncio.Event, say: Say, ready: Callable[[], None]) -> None:
        backfill = runtime.settings.worker.backfill if self.backfill is None else self.backfill
        for entry in runtime.settings.accounts_list():
            await runtime.attach(entry)
        runtime.intake.build()  # first: each account's start-up lines name its source
        for account in runtime.router:
            for line in await runtime.startup_lines(account):
                say(line)
        runtime.following = True
        runtime.intake.start(live_only=True)
        for account in runtime.router:
            runtime.upkeep(account, backfill=backfill, in_background=False)
        if backfill and not await runtime.backfill_all(stop, say):
            return  # stopped during the backfill
        runtime.intake.start(live_only=False)
        say("ready: answering messages (Ctrl-C to stop)")
        ready()
        await run_until(stop, runtime.tasks)


def _new_worker(settings: Settings, *, keyring: Mapping[str, bytes] | None, store: StateStore | None,
                environ: Mapping[str, str], metrics: Metrics | None, label: str, fence: Fence | None,
                relays: RelayBudgets, model: ModelCaller | None = None, registry: ToolRegistry | None = None) -> Worker:
    return Worker(settings, keyring=keyring, store=store, environ=environ, metrics=metrics, label=label,
                  fence=fence, relays=relays, model=model, registry=registry)

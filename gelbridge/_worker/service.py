"""The worker: one account's records in, its turns out (wiring, intake, backfill,
recovery, shutdown).

Library use (a firehose/Jetstream consumer of your own feeds records in)::

    worker = Worker(settings)
    await worker.start()                       # session, keyring, tools, model client
    await worker.backfill()                    # optional: answer what is owed already
    await worker.handle_event(record)          # per IncomingRecord (gelbridge._ingest)
    ...
    await worker.aclose()                      # bounded grace, then interrupted

``handle_event`` returns once the record's effects are durable (the claim is written, or
nothing is to be done): only then may a consumer advance its own cursor. Turns run in
the background (:class:`~gelbridge._worker.scheduler.Scheduler`). Sources, routing and
the ``gelbridge run`` loop are the runtime's (:mod:`gelbridge._runtime`); the upkeep it
runs per account is here: ``backfill``, ``recover_claims``, ``sweep_loop``,
``reconnected``.

Every seam is a constructor argument (nothing is swapped after :meth:`Worker.start`):
the repo (a logged-in :class:`~gelbridge._pds.PdsClient`, or any
:class:`~gelbridge._seams.Repo`: the offline record file), the state store, keyring,
model, tools, metrics, the process's relay budgets, the fleet's fence and the turn's own
seams (:class:`TurnSeams`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gelbridge import _tracing as tracing
from gelbridge._config import Settings
from gelbridge._errors import (
    KEYRING_ENV,
    ClaimConflict,
    ConfigError,
    GelbridgeError,
    PdsAuthError,
    PdsError,
    RecordError,
)
from gelbridge._grants import BridgeKeys, load_bridge_keys
from gelbridge._identity import IdentityError, check_session_did, resolve_account
from gelbridge._ingest import IncomingRecord
from gelbridge._mapping import OpenedRecordCache
from gelbridge._observability import Metrics
from gelbridge._pds import PdsClient, RelayBudget, Session
from gelbridge._records.constants import (
    FINAL_STATUSES,
    KEY_GRANT_COLLECTION,
    MESSAGE_COLLECTION,
    ROLE_ASSISTANT,
    SETTINGS_COLLECTION,
    SETTINGS_RKEY,
    ReplyStatus,
)
from gelbridge._records.keys import is_valid_rkey
from gelbridge._records.models import ReplyError
from gelbridge._sealing import Keyring, load_keyring
from gelbridge._seams import ModelCaller, Repo
from gelbridge._state import Claim, Fence, StateStore, claim_status, open_state
from gelbridge._tools.registry import ToolRegistry
from gelbridge._worker.decide import (
    Ask,
    EventOutcome,
    SlotDecision,
    ask_of,
    decide_existing_reply,
    error_message,
    peek_ask,
)
from gelbridge._worker.grants import AccountGrants
from gelbridge._worker.repo import SIDE_RECORD_TYPES, Entry, RepoView, SideRecords
from gelbridge._worker.scheduler import Scheduler
from gelbridge._worker.turn import (
    WRITE_REFUSED,
    CallAuthority,
    ToolRunner,
    TurnDeps,
    TurnJob,
    TurnOutcome,
    TurnReport,
    mark_lost,
    run_turn,
    write_refused_reply,
)
from gelbridge._worker.writer import (
    CLAIM_LOST,
    CLAIMED_ELSEWHERE,
    REPLY_DELETED,
    Authority,
    ReplyWriter,
    claim_authority,
)

if TYPE_CHECKING:
    from gelbridge._adapters.client import ModelClient

log = logging.getLogger("gelbridge.worker")

class _Unknown(Enum):
    """The reply slot was not looked at yet (``existing=UNKNOWN``)."""

    UNKNOWN = "unknown"


_UNKNOWN = _Unknown.UNKNOWN
#: what is known of a reply slot: its record, none there, or not looked at yet
Slot = Entry | None | _Unknown


def session_key(settings: Settings) -> str:
    """The state-store key of the PDS session: PDS URL + login identifier."""
    a = settings.account
    return f"{(a.pds or '').rstrip('/')}|{a.identifier or ''}"


@dataclass(frozen=True)
class TurnSeams:
    """How this worker's turns call out (the defaults: ``gelbridge run``'s)."""

    #: which calls this gelbridge made and asked about (default: its claims)
    authority: CallAuthority | None = None
    #: runs approved and automatic calls (default: the registry, at most once via the journal)
    tool_runner: ToolRunner | None = None
    stream: bool = True  # stream the model's answer (progress updates)
    check_provider: bool = True  # a model whose provider is not configured ends the turn


#: one relay budget per PDS host for the whole process (by host): the relay counts the host's events
RelayBudgets = dict[str, RelayBudget]


@dataclass
class BackfillReport:
    messages: int = 0
    owed: int = 0
    resumed: int = 0
    unfinished_claims: int = 0
    incomplete: bool = False


class Worker:
    """Answers the chat.gel.assistant messages of one account."""

    def __init__(
        self,
        settings: Settings,
        *,
        keyring: Mapping[str, bytes] | None = None,
        store: StateStore | None = None,
        pds: Repo | None = None,
        model: ModelCaller | None = None,
        registry: ToolRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        fence: Fence | None = None,
        metrics: Metrics | None = None,
        label: str | None = None,
        relays: RelayBudgets | None = None,
        bridge: BridgeKeys | None = None,
        seams: TurnSeams = TurnSeams(),
    ) -> None:
        """What is not given is opened by :meth:`start` (and closed by :meth:`aclose`):
        the state store of ``[state]``, the login to ``[account]``'s PDS, the keyring file,
        the bridge keys (``[keyring] bridge_key``, ``$GELBRIDGE_BRIDGE_KEY``), the tools and
        the model client. ``label``: the account's name in logs and metrics (default: its
        identifier)."""
        self.settings = settings
        #: the fleet's lease on this account (``gelbridge._fleet``): every PDS write and
        #: every state write for the account passes it; None outside a fleet
        self.fence = fence
        self._keyring = keyring
        self._bridge = bridge
        self._grants: AccountGrants | None = None
        self._store = store
        self._pds = pds
        self.model = model
        self.registry = registry
        self.environ = environ if environ is not None else os.environ
        self.metrics = metrics
        self.label = label if label is not None else settings.account.identifier or ""
        self._relays = relays if relays is not None else {}
        self._seams = seams
        self.did = ""
        self.handle = ""
        self.adapter_names: list[str] = []
        self._owned: set[str] = set()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._sweep_wake = asyncio.Event()
        self.started = False
        self.stats: defaultdict[str, int] = defaultdict(int)
        self.reports: list[TurnReport] = []

    # --- what start() provides (given to the constructor, or opened there) --------------------

    @property
    def store(self) -> StateStore:
        if self._store is None:
            raise RuntimeError("the worker has no state store yet: call await worker.start() first")
        return self._store

    @property
    def pds(self) -> Repo:
        if self._pds is None:
            raise RuntimeError("the worker is not logged in yet: call await worker.start() first")
        return self._pds

    @property
    def client(self) -> PdsClient | None:
        """The PDS client, when the repo is a live PDS (not an offline record file)."""
        return self._pds if isinstance(self._pds, PdsClient) else None

    @property
    def keyring(self) -> Mapping[str, bytes]:
        """The keys this account's turns open and seal with: the keyring, then the honoured
        key grants (read live: a revoked grant is gone for the next message)."""
        if self._grants is not None:
            return self._grants.keys
        if self._keyring is None:
            raise RuntimeError("the worker has no keyring yet: call await worker.start() first")
        return self._keyring

    @property
    def grants(self) -> AccountGrants:
        if self._grants is None:
            raise RuntimeError("the worker has no key grants yet: call await worker.start() first")
        return self._grants

    @property
    def given_store(self) -> StateStore | None:
        """The state store, if one was given or opened already (None before start)."""
        return self._store

    # --- start-up ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open state, log in (or resume), load keyring, tools and the model client."""
        s = self.settings
        tracing.configure(s.observability)
        if self._store is None:
            self._store = await open_state(s)
            self._owned.add("store")
        if self.fence is not None:
            self.store.fence([session_key(s)], self.fence)
        if self._bridge is None:
            self._bridge = load_bridge_keys(s.keyring.bridge_key, self.environ)
        if self._keyring is None:
            no_file = s.keyring.path is None and not self.environ.get(KEYRING_ENV)
            # with a bridge key, apps grant the keys: a hand-made keyring is optional
            self._keyring = Keyring() if no_file and self._bridge else load_keyring(s, self.environ)
        if self._pds is None:
            self._pds = await self._connect()
            self._owned.add("pds")
        sess = self.pds.session
        assert sess is not None
        self.did, self.handle = sess.did, sess.handle
        if self.fence is not None:
            self.store.fence([self.did], self.fence)
        if self.client is not None:
            await self._budget_client(self.client)
        await self._start_grants()
        registry = self.registry
        if registry is None:
            from gelbridge._tools import load_tool_registry

            registry = self.registry = await load_tool_registry(s)
            self._owned.add("registry")
        if self.model is None:
            self.model = self._model_client()
            self._owned.add("model")
        else:
            names = getattr(getattr(self.model, "registry", None), "names", None)
            self.adapter_names = list(names()) if callable(names) else []
        self.view = RepoView(self.pds, self.did)
        # conversation/settings records: kept current by their events; "poll" lists
        # messages only, so there they are read again after poll_interval
        self.side = SideRecords(self.pds, self.did,
                                ttl=s.watch.poll_interval if s.watch.source == "poll" else None)
        self.opened = OpenedRecordCache()
        seams = self._seams
        self.deps = TurnDeps(
            settings=s, pds=self.pds, did=self.did, keyring=self.keyring, store=self.store,
            view=self.view, opened=self.opened, model=self.model, registry=registry,
            side=self.side, metrics=self.metrics, label=self.label, authority=seams.authority,
            tool_runner=seams.tool_runner, stream=seams.stream, check_provider=seams.check_provider,
        )
        self.scheduler = Scheduler(self._run_turn, self._cancel_queued, concurrency=s.worker.concurrency)
        self.started = True

    async def _start_grants(self) -> None:
        """Publish the bridge record (a live PDS only) and read every grant: before any
        message of the account is answered (§6 "What the bridge does" 1)."""
        assert self._keyring is not None and self._bridge is not None
        grants = AccountGrants(self.pds, self.did, self._bridge, self._keyring, store=self.store,
                               label=self.label, metrics=self.metrics)
        if grants.enabled:
            if self.client is not None:
                await grants.publish()
            await grants.load()
            await self.store.save_grant_counts(self.did, grants.book.honoured, grants.book.ignored)
        self._grants = grants

    async def _budget_client(self, pds: PdsClient) -> None:
        """The write budgets of a live PDS: the fence on every write, the budget the PDS
        last stated, the process's relay budget for its host."""
        if self.fence is not None:
            pds.write_guard = self.fence.check
        saved_budget = await self.store.load_write_budget(self.did)
        if saved_budget is not None and pds.budget.remaining is None:
            # the budget the PDS last stated (to this worker or another of its fleet) holds
            # until its reset: progress updates keep the reserve from the first write on
            pds.budget.restore(saved_budget["limit"], saved_budget["remaining"], saved_budget["reset_at"])
        r = self.settings.relay
        if pds.relay is None and r.applies_to(pds.pds_url):
            host = urlsplit(pds.pds_url).netloc
            pds.relay = self._relays.setdefault(host, RelayBudget(host, r.events_per_second,
                                                                   r.events_per_hour, r.events_per_day))

    def _model_client(self) -> ModelClient:
        from gelbridge._adapters.client import ModelClient

        adapters = None
        try:
            from gelbridge._adapters.registry import registry_from_settings

            adapters = registry_from_settings(self.settings)
            self.adapter_names = list(adapters.names())
        except GelbridgeError as e:
            log.error("adapters failed to load (%s)", e)
        if adapters is not None:
            return ModelClient(self.settings, registry=adapters)
        return ModelClient(self.settings)

    async def _connect(self) -> PdsClient:
        a = self.settings.account
        if not a.identifier:
            raise ConfigError("set [account] identifier (a handle or DID; or GELBRIDGE_IDENTIFIER)")
        store = self.store
        assert store is not None
        key = session_key(self.settings)
        saved = await store.load_session(key)
        expected_did: str | None = None
        if a.pds:
            pds_url = a.pds
        else:
            try:
                resolved = await resolve_account(a.identifier, self.settings.identity)
                pds_url, expected_did = resolved.pds, resolved.did
            except IdentityError as e:
                if saved is None or not saved.get("pds"):
                    raise
                # a PLC or DNS outage must not keep a restart from serving: the saved session
                # names the PDS it was made on (and the session's DID is checked by the PDS)
                log.warning("%s; using the saved session's PDS for now", e)
                pds_url, expected_did = str(saved["pds"]), saved.get("did")

        async def save(session: Session) -> None:
            await store.save_session(key, {**session.to_dict(), "pds": pds_url})

        pds = PdsClient(pds_url, on_session_change=save)
        if self.fence is not None:  # the login and every refresh too: once per account across the fleet
            pds.write_guard = self.fence.check
        if saved is not None and saved.get("pds", pds_url) != pds_url:  # the account moved to another PDS
            log.info("the saved PDS session is for another PDS; logging in again")
            saved = None
        if saved is not None and expected_did is not None and saved.get("did") != expected_did:
            log.info("the saved PDS session is for another account than the identifier names; logging in again")
            saved = None
        if saved is not None:
            try:
                pds.resume(Session.from_dict(saved))
                await pds.get_record(SETTINGS_COLLECTION, SETTINGS_RKEY)  # probe (refreshes if due)
                log.info("resumed the saved PDS session of %s", saved.get("handle"))
                return pds
            except PdsAuthError:
                log.info("the saved PDS session is no longer valid; logging in again")
            except BaseException:
                await pds.aclose()
                raise
        password = self.environ.get(a.password_env)
        if not password:
            await pds.aclose()
            raise ConfigError(
                f"no app password: set ${a.password_env} (create one in your PDS account settings)"
            )
        try:
            session = await pds.login(a.identifier, password)
            check_session_did(session.did, expected_did, a.identifier, pds_url)
        except BaseException:
            await pds.aclose()
            raise
        log.info("logged in to %s as %s", pds_url, a.identifier)
        return pds

    def startup_lines(self, source: str) -> list[str]:
        """What ``gelbridge run`` prints for this account when it is ready (no secrets);
        ``source``: the line of the source that follows it (the runtime's intake knows it)."""
        s = self.settings
        providers = ", ".join(f"{n} ({p.adapter} → {p.base_url})" for n, p in s.providers.items()) or "none"
        default = f"{s.defaults.model.provider}/{s.defaults.model.id}" if s.defaults.model else "none"
        tools = ", ".join(self.registry.names()) if self.registry is not None and len(self.registry) else "none"
        return [
            f"gelbridge worker for {self.handle} ({self.did})",
            f"  PDS        {self.pds.pds_url}",
            f"  source     {source}",
            f"  providers  {providers}; default model {default}",
            f"  adapters   {', '.join(self.adapter_names) or '(loaded on demand)'}",
            f"  tools      {tools}",
            f"  state      {self.store.location}",
            *self._grant_lines(),
            f"  turns      {s.worker.concurrency} at once; progress every {s.replies.update_interval:g} s",
        ]

    def _grant_lines(self) -> list[str]:
        g = self._grants
        if g is None or not g.enabled:
            return ["  grants     off (no [keyring] bridge_key: keys come from the keyring only)"]
        cur = g.bridge.current
        assert cur is not None
        older = f"; also honours {', '.join(k.kid for k in g.bridge[1:])}" if len(g.bridge) > 1 else ""
        return [f"  bridge key {cur.kid} fingerprint {cur.fingerprint} ({g.published or 'not published'}{older})",
                f"  grants     {g.book.honoured} honoured, {g.book.ignored} ignored"]

    # --- intake -------------------------------------------------------------------------------

    async def handle_event(self, rec: IncomingRecord, *, received_at: float | None = None) -> EventOutcome:
        """Handle one record event of this account; returns when its effects are durable,
        with what was decided (an ``EventOutcome``: a ``str``, for logs and tests)."""
        did, collection, rkey, cid, record, action = rec.did, rec.collection, rec.rkey, rec.cid, rec.record, rec.action
        received = received_at if received_at is not None else time.monotonic()
        if not self.started:
            raise RuntimeError("call await worker.start() first")
        if not is_valid_rkey(rkey):  # no PDS holds such a record; never stored or logged
            if did == self.did:
                log.warning("a record event with an invalid record key; ignored")
            return EventOutcome.IGNORED
        if did == self.did and collection == KEY_GRANT_COLLECTION:
            await self.grants.event(rkey, record, deleted=action == "delete")
            return EventOutcome.KEY_GRANT
        if did == self.did and collection in SIDE_RECORD_TYPES:
            self.side.event(collection, rkey, record, action=action)
            return EventOutcome.SIDE_RECORD
        if did != self.did or collection != MESSAGE_COLLECTION:
            return EventOutcome.IGNORED
        if action == "delete":
            self.view.drop(rkey)
            return EventOutcome.DELETED
        if record is None:  # a tooBig commit: read it
            entry = await self.view.get(rkey, fresh=True)
            if entry is None:
                return EventOutcome.IGNORED
            cid, record = entry
        value = dict(record)
        self.view.put(rkey, cid, value)
        if value.get("role") == ROLE_ASSISTANT:
            return EventOutcome.REPLY
        if value.get("generation") is None:
            return EventOutcome.NO_GENERATION
        return await self._consider(rkey, cid, value, received, existing=_UNKNOWN)

    async def _consider(
        self, rkey: str, cid: str | None, value: dict[str, Any], received: float, *, existing: Slot
    ) -> EventOutcome:
        try:
            msg = self.opened.record(self.view.uri(rkey), cid, value)
        except RecordError as e:
            return await self._bad_record(rkey, value, e, received)
        ask = ask_of(MESSAGE_COLLECTION, rkey, msg)
        if ask is None:
            return EventOutcome.NO_GENERATION
        async with self._locks[ask.message_rkey]:
            try:
                result = await self._claim_and_submit(ask, received, existing=existing)
            finally:
                lock = self._locks.get(ask.message_rkey)
                if lock is not None and not lock.locked() and not getattr(lock, "_waiters", None):
                    self._locks.pop(ask.message_rkey, None)
        self.stats[result] += 1
        return result

    async def _bad_record(self, rkey: str, value: Mapping[str, Any], e: GelbridgeError, received: float) -> EventOutcome:
        """A malformed message: log kind + rkey; if it plainly asks for a reply, answer
        once with ``status: error`` (``bad_record``), so the app can show why."""
        log.warning("message %s is malformed (%s); not answering it", rkey, e.kind)
        await self.store.record_error(e.kind, account=self.did, record_key=rkey, where="intake")
        self.stats["bad-record"] += 1
        ask = peek_ask(MESSAGE_COLLECTION, rkey, value)
        if ask is None or await self.store.get_claim(self.did, ask.reply_rkey) is not None:
            return EventOutcome.BAD_RECORD
        ask = Ask(ask.message_rkey, ask.attempt, ask.reply_rkey, ask.conversation, None)
        await self.store.record_claim(self.did, ask.message_rkey, ask.attempt, ask.reply_rkey, ask.conversation)
        writer = self._writer(ask)
        try:
            await writer.claim()
            await writer.final([], status=ReplyStatus.ERROR, error=ReplyError(kind="bad_record", message=error_message(
                "bad_record", detail=f"message {rkey} does not follow the chat.gel.assistant.message lexicon")))
            await self.store.update_claim_status(self.did, ask.reply_rkey, ReplyStatus.ERROR, "bad_record")
        except ClaimConflict:
            await self.store.update_claim_status(self.did, ask.reply_rkey, ReplyStatus.CANCELLED, "claimed_elsewhere")
        return EventOutcome.BAD_RECORD

    def _writer(self, ask: Ask) -> ReplyWriter:
        return ReplyWriter(
            self.pds, self.view, reply_rkey=ask.reply_rkey, message_rkey=ask.message_rkey,
            conversation=ask.conversation, key_id=ask.key_id,
            keyring=self._grants.keys.pinned(ask.key_id) if self._grants is not None else self.keyring,
            update_interval=self.settings.replies.update_interval,
            max_write_bytes=self.settings.replies.max_write_bytes,
            reserve_points=self.settings.replies.reserve_points,
            authority=self._authority(ask.reply_rkey),
        )

    def _authority(self, reply_rkey: str) -> Authority | None:
        """In a fleet, who may write a reply is the lease's and the shared claim's to say,
        not the record's: a swap that fails on it asks this (``ReplyWriter._swap``).
        Outside a fleet there is no such authority: a changed reply is someone else's."""
        return claim_authority(self.store, self.did, reply_rkey) if self.fence is not None else None

    async def _claim_and_submit(self, ask: Ask, received: float, *, existing: Slot) -> EventOutcome:
        rk = ask.reply_rkey
        if self.scheduler.is_active(rk):
            return EventOutcome.ACTIVE
        prior: Claim | None = await self.store.get_claim(self.did, rk)
        if prior is not None and prior.status in FINAL_STATUSES:
            return EventOutcome.DONE
        if prior is not None and prior.error_kind == WRITE_REFUSED:
            return await self._finish_refused(ask)
        ours = prior is not None
        writer = self._writer(ask)
        if existing is _UNKNOWN and ours:
            existing = await self.view.get(rk, fresh=True)
        if existing is _UNKNOWN or existing is None:
            if not ours:
                await self.store.record_claim(self.did, ask.message_rkey, ask.attempt, rk, ask.conversation)
            try:
                await writer.claim()
            except ClaimConflict:
                existing = await self.view.get(rk, fresh=True)
                if existing is None:
                    return EventOutcome.RACED
            else:
                self._submit(ask, writer, received)
                return EventOutcome.CLAIMED
        return await self._existing_reply(ask, writer, existing, received, ours=ours)

    async def _existing_reply(self, ask: Ask, writer: ReplyWriter, existing: Entry, received: float, *,
                              ours: bool) -> EventOutcome:
        """The reply slot holds a record already: done, someone else's, or ours to resume
        (or a stale one to take over)."""
        rk = ask.reply_rkey
        cid, value = existing
        decision = decide_existing_reply(value, ours=ours, stale_after=self.settings.worker.stale_claim_after)
        if decision is SlotDecision.DONE:
            status = value.get("status")
            if ours or await self.store.get_claim(self.did, rk) is not None:
                await self.store.update_claim_status(
                    self.did, rk, claim_status(status) if status in FINAL_STATUSES else ReplyStatus.COMPLETE)
            return EventOutcome.DONE
        if decision is SlotDecision.FOREIGN:
            if not ours and await self.store.get_claim(self.did, rk) is not None:  # our fresh claim row lost the race
                await self.store.update_claim_status(self.did, rk, ReplyStatus.CANCELLED, "claimed_elsewhere")
            log.info("reply %s belongs to another worker; not answering", rk)
            return EventOutcome.FOREIGN
        if await self.store.get_claim(self.did, rk) is None:
            await self.store.record_claim(self.did, ask.message_rkey, ask.attempt, rk, ask.conversation)
        if cid is None:
            fresh = await self.view.get(rk, fresh=True)
            if fresh is None:
                return EventOutcome.RACED
            cid, value = fresh
        writer.adopt(cid, value)
        log.info("%s unfinished reply %s", "resuming" if decision is SlotDecision.RESUME else "taking over stale", rk)
        self._submit(ask, writer, received, resumed=True, resume_from=(cid, value),
                     takeover=decision is SlotDecision.TAKEOVER)
        return EventOutcome.RESUMED

    async def _finish_refused(self, ask: Ask) -> EventOutcome:
        """A reply whose final write the PDS refused for good: write the minimal error
        reply (again), never the turn: the model is not called a second time."""
        existing = await self.view.get(ask.reply_rkey, fresh=True)
        if existing is None:
            await self.store.update_claim_status(self.did, ask.reply_rkey, ReplyStatus.CANCELLED)
            return EventOutcome.DONE
        if existing[1].get("status") in FINAL_STATUSES:
            await self.store.update_claim_status(self.did, ask.reply_rkey, claim_status(existing[1]["status"]), WRITE_REFUSED)
            return EventOutcome.DONE
        writer = self._writer(ask)
        writer.adopt(*existing)
        status, _ = await write_refused_reply(self.deps, writer, ask.reply_rkey)
        return EventOutcome.DONE if status != TurnOutcome.UNFINISHED else EventOutcome.POSTPONED

    def _submit(self, ask: Ask, writer: ReplyWriter, received: float, *, resumed: bool = False,
                resume_from: Entry | None = None, takeover: bool = False) -> None:
        self.scheduler.submit(TurnJob(ask=ask, writer=writer, received_at=received, resumed=resumed,
                                      resume_from=resume_from, takeover=takeover))

    async def _run_turn(self, job: TurnJob) -> TurnReport:
        def attrs() -> dict[str, Any]:
            return {"gelbridge.account": self.label, "gelbridge.reply.rkey": job.ask.reply_rkey,
                    "gelbridge.reply.attempt": job.ask.attempt, "gelbridge.turn.resumed": job.resumed}

        with tracing.span("gelbridge.turn", attrs) as sp:
            report = await run_turn(self.deps, job)
            if sp is not None:
                sp.set_attribute("gelbridge.turn.status", str(report.status))
                sp.set_attribute("gelbridge.turn.steps", report.steps)
                sp.set_attribute("gelbridge.pds.write_points", report.points)
                if report.error_kind:
                    tracing.failed(sp, report.error_kind)
        if self.metrics is not None:
            self.metrics.turn_finished(self.label, report)
        self.stats[f"turn-{report.status}"] += 1
        self.reports.append(report)
        del self.reports[:-1000]
        return report

    async def _cancel_queued(self, job: TurnJob) -> None:
        """A claimed turn superseded before it ran: write ``cancelled``."""
        await job.writer.final([], status=ReplyStatus.CANCELLED)
        await self.store.update_claim_status(self.did, job.ask.reply_rkey, ReplyStatus.CANCELLED)

    # --- backfill and recovery (per account; gelbridge run and the Bridge alike) ----------

    async def backfill(self) -> BackfillReport:
        """List every message; claim what is owed; resume our unfinished replies."""
        rep = BackfillReport()
        self.side.clear()  # record events may have been missed
        try:
            await self.grants.load()  # so may a grant's delete: the listing is the truth
        except PdsError as e:
            log.error("backfill: listing key grants failed (%s); the grants known stay", type(e).__name__)
        listing: dict[str, Entry] = {}
        try:
            async for r in self.pds.iter_records(MESSAGE_COLLECTION, page_size=100, reverse=True):
                listing[r.rkey] = (r.cid, r.value)
                self.view.put(r.rkey, r.cid, r.value)
        except PdsError as e:  # answer what was listed; the firehose and sweeps do the rest
            rep.incomplete = True
            log.error("backfill: listing messages failed after %d records (%s); continuing without the rest",
                      len(listing), type(e).__name__)
        now = time.monotonic()
        for rkey, (cid, value) in listing.items():
            if not isinstance(value, dict) or value.get("role") == ROLE_ASSISTANT or value.get("generation") is None:
                continue
            rep.messages += 1
            peek = peek_ask(MESSAGE_COLLECTION, rkey, value)
            existing = listing.get(peek.reply_rkey) if peek is not None else None
            if existing is not None and existing[1].get("status") in FINAL_STATUSES:
                claim = await self.store.get_claim(self.did, peek.reply_rkey)  # type: ignore[union-attr]
                if claim is not None and claim.status not in FINAL_STATUSES:
                    await self.store.update_claim_status(self.did, claim.reply_rkey, claim_status(existing[1]["status"]))
                continue
            rep.owed += 1
            try:
                result = await self._consider(rkey, cid, value, now, existing=existing)
            except PdsError as e:
                log.warning("backfill: message %s not handled (%s)", rkey, type(e).__name__)
                continue
            except Exception as e:  # noqa: BLE001 - one record never stops the backfill (or the start)
                await self._record_failed(rkey, e, "backfill")
                continue
            if result == "resumed":
                rep.resumed += 1
        rep.unfinished_claims = await self.recover_claims()
        return rep

    async def _record_failed(self, rkey: str, e: Exception, where: str) -> None:
        """A record (or claim) nothing could handle: logged by kind, remembered, skipped."""
        kind = getattr(e, "kind", None) if isinstance(e, GelbridgeError) else None
        log.error("%s: %s failed (%s); skipped", where, rkey, type(e).__name__)  # no text: it may quote content
        try:
            await self.store.record_error(kind if isinstance(kind, str) else "internal", account=self.did,
                                    record_key=rkey, where=where)
        except Exception:  # noqa: BLE001 - the state store may be what failed
            pass

    async def recover_claims(self) -> int:
        """Finish claims of this worker left unfinished (crash, PDS outage during a claim),
        and look again at the replies of claims given up as someone else's
        (:meth:`_recheck_lost`)."""
        n = 0
        for claim in await self.store.unfinished_claims(self.did):
            if not self.scheduler.is_active(claim.reply_rkey):
                n += 1
                await self._sweep_one(claim, self._recover)
        for claim in await self.store.lost_claims(self.did, CLAIM_LOST):
            if not self.scheduler.is_active(claim.reply_rkey):
                await self._sweep_one(claim, self._recheck_lost)
        return n

    async def _sweep_one(self, claim: Claim, recover: Callable[[Claim], Awaitable[None]]) -> None:
        try:
            await recover(claim)
        except PdsError as e:
            log.warning("recovery of %s postponed (%s)", claim.reply_rkey, type(e).__name__)
        except Exception as e:  # noqa: BLE001 - one claim never stops the sweep
            await self._record_failed(claim.reply_rkey, e, "recovery")

    async def _recover(self, claim: Claim) -> None:
        entry = await self.view.get(claim.message_rkey, fresh=True)
        ask: Ask | None = None
        if entry is not None:
            cid, value = entry
            try:
                ask = ask_of(MESSAGE_COLLECTION, claim.message_rkey,
                             self.opened.record(self.view.uri(claim.message_rkey), cid, value))
            except RecordError:
                ask = None
        if entry is not None and ask is not None and ask.reply_rkey == claim.reply_rkey:
            await self._consider(claim.message_rkey, entry[0], entry[1], time.monotonic(), existing=_UNKNOWN)
            return
        # the message is gone or asks for another attempt now: close this reply
        reply = await self.view.get(claim.reply_rkey, fresh=True)
        if reply is None or reply[1].get("status") in FINAL_STATUSES:
            await self.store.update_claim_status(self.did, claim.reply_rkey, ReplyStatus.CANCELLED)
            return
        stub = Ask(claim.message_rkey, claim.attempt, claim.reply_rkey, claim.conversation,
                   (reply[1].get("content") or {}).get("keyId"))
        writer = self._writer(stub)
        writer.adopt(reply[0], reply[1])
        try:
            await writer.final([], status=ReplyStatus.CANCELLED)
            await self.store.update_claim_status(self.did, claim.reply_rkey, ReplyStatus.CANCELLED)
        except ClaimConflict:
            await mark_lost(self.store, self.did, writer)

    async def _recheck_lost(self, claim: Claim) -> None:
        """A claim given up as someone else's reply (``claim_lost``) whose reply may still be
        unfinished: a safety net, so no reply stays ``streaming`` for good. A reply finished
        or deleted meanwhile closes the claim; an unfinished one is resumed here in a fleet
        (the lease makes it this worker's), else once it is stale (its writer is gone)."""
        rk = claim.reply_rkey
        reply = await self.view.get(rk, fresh=True)
        if reply is None or reply[1].get("status") in FINAL_STATUSES:
            status = claim_status(reply[1]["status"]) if reply is not None else ReplyStatus.CANCELLED
            await self.store.update_claim_status(self.did, rk, status, CLAIMED_ELSEWHERE if reply else REPLY_DELETED)
            return
        decision = decide_existing_reply(reply[1], ours=self.fence is not None,
                                         stale_after=self.settings.worker.stale_claim_after)
        if decision is SlotDecision.FOREIGN:
            return  # another gelbridge writes it: the next sweep looks again
        log.warning("reply %s was given up as someone else's but is still unfinished; finishing it", rk)
        await self.store.update_claim_status(self.did, rk, ReplyStatus.PENDING)
        await self._recover(claim)

    async def sweep_loop(self, interval: float = 30.0, *, at_start: bool = False) -> None:
        """Until cancelled: :meth:`recover_claims` every ``interval`` s, and at once after
        :meth:`reconnected` (and, with ``at_start``, right away: without a backfill, which
        ends with a sweep, a reply a crash left unfinished would wait ``interval``). A
        failed sweep is logged; the next one tries again."""
        if at_start:
            self._sweep_wake.set()
        while True:
            try:
                await asyncio.wait_for(self._sweep_wake.wait(), interval)
            except TimeoutError:
                pass
            self._sweep_wake.clear()
            try:
                await self.recover_claims()
            except Exception as e:  # noqa: BLE001
                log.warning("recovery sweep failed (%s)", type(e).__name__)

    def reconnected(self) -> None:
        """The event stream came back after a disconnect: events may have been missed (drop
        the cached conversation/settings records) and writes may have failed (sweep now)."""
        self.side.clear()
        self._sweep_wake.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        return await self.scheduler.wait_idle(timeout)

    async def aclose(self, grace: float | None = None) -> None:
        """Stop watching; give running turns ``grace`` s (``[worker] shutdown_grace``)."""
        if self.started:
            g = self.settings.worker.shutdown_grace if grace is None else grace
            # in a fleet, turns that outlive the grace are handed over: the lease is
            # revoked first, so they write nothing more and the next holder resumes them
            await self.scheduler.shutdown(g, before_cancel=self.fence.revoke if self.fence is not None else None)
        if "registry" in self._owned and self.registry is not None:
            await self.registry.aclose()
        if "model" in self._owned and self.model is not None:
            await self.model.aclose()
        if "pds" in self._owned and self.client is not None:
            await self.client.aclose()
        if self.fence is not None and self._store is not None:
            self._store.unfence([session_key(self.settings), *([self.did] if self.did else [])], self.fence)
        if "store" in self._owned and self._store is not None:
            await self.store.aclose()
        self._owned.clear()
        self.started = False
        if tracing.active():
            await asyncio.to_thread(tracing.flush)  # bounded; off the loop: other accounts' turns go on


"""The worker on a record file: what ``gelbridge reply`` and ``gelbridge convert`` run.

There is one turn: the worker's (:mod:`gelbridge._worker.turn`, behind
:meth:`Worker.handle_event`), so the offline commands and ``gelbridge run`` cannot
disagree on the same records: the thread walk, malformed records, model/tool choice,
the unknown-tool policy, approvals and their TTL, and the reply record itself are the
same code. Offline, three seams change:

- the PDS is :class:`OfflineRepo`: reads come from the file, writes stay in memory (the
  reply it would write is read back from there); blobs are not in record files;
- the state store is a throw-away one, and the :class:`RecordAuthority` answers what the
  worker's claims would: the file is the operator's own export, so the calls in its
  replies are taken as this gelbridge's, asked when the waiting reply was last written
  and answered when the answering message was created;
- tools are never run: every call the worker would run gets the result
  :data:`NOT_RUN_OFFLINE` (the loop goes on, as it would after a failed tool).

``convert`` stops at the first model call (:class:`CaptureModel`) and prints that
request; ``reply`` calls the model through the configured adapter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gelbridge._config import Settings
from gelbridge._errors import ClaimConflict, GelbridgeError, PdsError, RecordError
from gelbridge._ingest import IncomingRecord
from gelbridge._pds import PutResult
from gelbridge._records import MESSAGE_COLLECTION, AtUri, MessageRecord, ToolCallPart, ToolResultPart
from gelbridge._records.io import RecordEntry, load_records
from gelbridge._sealing import content_of
from gelbridge._state import SqliteStore
from gelbridge._tools import ToolCall, call_digest
from gelbridge._worker.decide import parse_time, peek_ask
from gelbridge._worker.turn import TurnDeps, TurnJob, TurnReport
from gelbridge.lux import Diagnostic, LuxRequest

NOT_RUN_OFFLINE = "not run: tools are not run offline (gelbridge run would run this call)"


# --- the PDS seam ---------------------------------------------------------------------------------


class OfflineRepo:
    """A repo read from a record file, written in memory: what the worker's PDS client
    does, for one DID, with no network."""

    def __init__(self, entries: list[RecordEntry], did: str) -> None:
        self.did = did
        self.pds_url = "offline:"
        self.session = SimpleNamespace(did=did, handle="offline")
        self.relay = None
        self.records: dict[tuple[str, str], tuple[str | None, dict[str, Any]]] = {
            (e.uri.collection, e.uri.rkey): (e.cid, e.value) for e in entries if e.uri.did == did
        }
        self.writes = 0

    def hide(self, collection: str, rkey: str) -> None:
        """Leave ``rkey`` out (an existing reply the file holds: it is written anew)."""
        self.records.pop((collection, rkey), None)

    async def get_record(self, collection: str, rkey: str, **_: Any) -> tuple[str | None, dict[str, Any]] | None:
        got = self.records.get((collection, rkey))
        return None if got is None else (got[0], dict(got[1]))

    async def sync_get_record(self, collection: str, rkey: str, **_: Any) -> bytes:
        raise PdsError(f"{collection}/{rkey} is not in the record file")

    async def iter_records(self, collection: str, **_: Any) -> AsyncIterator[Any]:
        for (coll, rkey), (cid, value) in list(self.records.items()):
            if coll == collection:
                yield SimpleNamespace(rkey=rkey, cid=cid, value=dict(value),
                                      uri=str(AtUri(self.did, coll, rkey)))

    async def put_record(self, collection: str, rkey: str, record: Mapping[str, Any], *,
                         swap_record: Any = None, **_: Any) -> PutResult:
        prior = self.records.get((collection, rkey))
        if swap_record is None and prior is not None or swap_record is not None and (
                prior is None or prior[0] != swap_record):
            raise ClaimConflict(f"{collection}/{rkey} changed")
        value = dict(record)
        cid = "offline" + hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:40]
        self.records[(collection, rkey)] = (cid, value)
        self.writes += 1
        return PutResult(uri=str(AtUri(self.did, collection, rkey)), cid=cid, committed=True)

    async def get_blob(self, did: str, cid: str) -> bytes:
        raise PdsError("blobs are not in record files: images and file text are left out offline")

    async def upload_blob(self, data: bytes, mime_type: str = "application/octet-stream") -> dict[str, Any]:
        cid = "offlineblob" + hashlib.sha256(data).hexdigest()[:40]
        return {"$type": "blob", "ref": {"$link": cid}, "mimeType": mime_type, "size": len(data)}


# --- the authority and tools seams ------------------------------------------------------------------


class RecordAuthority:
    """What the worker's claims would say, read from the records (see the module docstring)."""

    def __init__(self, repo: OfflineRepo, keyring: Mapping[str, bytes]) -> None:
        self.repo, self.keyring = repo, keyring

    def _value(self, rkey: str) -> dict[str, Any] | None:
        got = self.repo.records.get((MESSAGE_COLLECTION, rkey))
        return got[1] if got is not None else None

    async def made_here(self, reply_rkey: str) -> frozenset[str]:
        value = self._value(reply_rkey)
        if value is None:
            return frozenset()
        uri = AtUri(self.repo.did, MESSAGE_COLLECTION, reply_rkey)
        try:
            content = content_of(MessageRecord.from_value(value, uri=str(uri)).content, uri=uri, keyring=self.keyring)
        except GelbridgeError:
            return frozenset()
        return frozenset(call_digest(p.call_id, p.tool, p.input) for p in content.parts if isinstance(p, ToolCallPart))

    async def asked(self, reply_rkey: str) -> tuple[frozenset[str], float | None]:
        value = self._value(reply_rkey)
        if value is None or value.get("status") != "awaitingApproval":
            return frozenset(), None
        return await self.made_here(reply_rkey), parse_time(value.get("updatedAt") or value.get("createdAt"))

    async def answered_at(self, reply_rkey: str) -> float | None:
        value = self._value(reply_rkey.rsplit(".r", 1)[0])
        return parse_time(value.get("createdAt")) if value is not None else None

    async def decided_at(self, reply_rkey: str) -> float | None:
        """As the worker would have judged them on seeing the answer: replaying an old
        export does not make its approvals expire."""
        return await self.answered_at(reply_rkey)


async def not_run_offline(deps: TurnDeps, job: TurnJob, calls: list[ToolCall],
                          journal_key: str | None) -> dict[str, ToolResultPart]:
    return {c.call_id: ToolResultPart(call_id=c.call_id, output=NOT_RUN_OFFLINE, is_error=True) for c in calls}


class RequestCaptured(GelbridgeError):
    """``convert`` has the request it wanted: the turn stops before any model call."""

    kind = "cancelled"


@dataclass
class CaptureModel:
    """The model seam of ``convert``: keeps the first request and stops the turn."""

    request: LuxRequest | None = None
    provider: str | None = None

    async def complete(self, request: LuxRequest, *, provider: str, **_: Any) -> Any:
        self.request, self.provider = request, provider
        raise RequestCaptured("request captured")

    async def aclose(self) -> None:
        return None


# --- one turn on a file -----------------------------------------------------------------------------


@dataclass
class OfflineTurn:
    """What one offline turn produced: the reply record it would write (None: none was
    written, e.g. a malformed message that asks for nothing), its report, and the
    diagnostics of the way."""

    reply_rkey: str | None
    reply: dict[str, Any] | None
    report: TurnReport | None
    decision: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    did: str = ""


@contextmanager
def _quiet() -> Iterator[None]:
    """The worker logs for operators; offline, the command prints its own summary."""
    logger = logging.getLogger("gelbridge")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def run_offline(records: Path, message: str, keyring: Mapping[str, bytes], settings: Settings, *,
                      model: Any, stream: bool = True, check_provider: bool = True,
                      quiet: bool = True) -> OfflineTurn:
    """Answer ``message`` of the record file ``records`` with the worker's own turn
    (``quiet=False``: with the worker's log lines, as ``gelbridge run`` writes them)."""
    from gelbridge._grants import BridgeKeys
    from gelbridge._tools.loader import builtin_tools
    from gelbridge._tools.registry import ToolRegistry
    from gelbridge._worker.service import TurnSeams, Worker

    entries = load_records(records)
    target = next((e for e in entries if e.uri.collection == MESSAGE_COLLECTION and e.uri.rkey == message), None)
    if target is None:
        raise RecordError(f"message {message} is not in {records}: pass the record key of a user message")
    did = target.uri.did
    repo = OfflineRepo(entries, did)
    ask = peek_ask(MESSAGE_COLLECTION, message, target.value)
    if ask is not None:
        repo.hide(MESSAGE_COLLECTION, ask.reply_rkey)  # answered anew, even when the file holds a reply
    offline = settings.model_copy(update={
        "worker": settings.worker.model_copy(update={"backfill": False, "shutdown_grace": 0.0}),
        "observability": settings.observability.model_copy(update={"listen": None, "traces": False}),
        "relay": settings.relay.model_copy(update={"limits": "off"}),
    })
    with tempfile.TemporaryDirectory(prefix="gelbridge-offline-") as tmp, (_quiet() if quiet else nullcontext()):
        store = SqliteStore.open_dir(tmp)
        seams = TurnSeams(authority=RecordAuthority(repo, keyring), tool_runner=not_run_offline, stream=stream,
                          check_provider=check_provider)
        # the keys are resolved already (the keyring and what the file's grants give):
        # no bridge key of the config is loaded again
        worker = Worker(offline, keyring=dict(keyring), store=store, pds=repo, model=model,
                        registry=ToolRegistry(builtin_tools(settings.tools)), seams=seams, bridge=BridgeKeys())
        try:
            await worker.start()
            decision = await worker.handle_event(IncomingRecord(did, MESSAGE_COLLECTION, message, target.cid,
                                                                target.value))
            await worker.wait_idle(settings.worker.turn_deadline + 30)
            report = worker.reports[-1] if worker.reports else None
        finally:
            await worker.aclose(0)
            await store.aclose()
    reply_rkey = ask.reply_rkey if ask is not None else None
    got = repo.records.get((MESSAGE_COLLECTION, reply_rkey)) if reply_rkey is not None else None
    return OfflineTurn(reply_rkey, got[1] if got is not None else None, report, decision,
                       list(report.diagnostics) if report is not None else [], did)


__all__ = ["NOT_RUN_OFFLINE", "CaptureModel", "OfflineRepo", "OfflineTurn", "RecordAuthority", "RequestCaptured",
           "not_run_offline", "run_offline"]

"""Normalise what event consumers already have into one stream of :class:`IncomingRecord`.

Three inputs, one output:

- atproto firehose (``com.atproto.sync.subscribeRepos``): raw frame ``bytes``, the
  ``MessageFrame`` objects ``FirehoseSubscribeReposClient`` passes to its callback, or
  the ``Commit`` model of ``parse_subscribe_repos_message``;
- Jetstream: a v1 ``/subscribe`` event (``dict``, JSON ``str`` or ``bytes``), or a v2
  ``network.bsky.jetstream.subscribeEvents`` commit (``MessageFrame`` / ``Commit`` model);
- plain ``(did, collection, rkey, cid, record)`` tuples.

Only records of known account DIDs in ``chat.gel.assistant.*`` collections pass
(:class:`RecordFilter`). Filtering is ordered by cost so that the ~100% of a relay's
traffic that is not ours is dropped cheaply:

1. raw firehose frame: a byte search for the collection prefix (an op path is stored
   verbatim as a CBOR text string, so a frame without those bytes cannot hold one of our
   records). Only a frame that passes is split into header and body, then the repo DID
   and op paths are checked, and only then is the ``blocks`` CAR decoded
   (:func:`gelbridge._firehose.decode_frame_full`, the worker's own decoder);
2. ``MessageFrame``: body type, ``repo``, op paths, then the CAR;
3. Jetstream JSON text: a substring search for the prefix before ``json.loads``
   (Jetstream writes NSIDs unescaped).

Everything here is pure: no I/O, no clock. Deletes pass with ``record=None`` and
``action="delete"``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gelbridge._errors import FirehoseError, RecordError, is_transient
from gelbridge._firehose import DEFAULT_PREFIX, RepoEvent, commit_events, decode_frame_full
from gelbridge._records import nesting
from gelbridge._records.keys import is_valid_rkey

Action = Literal["create", "update", "delete"]
_ACTIONS: Final = frozenset({"create", "update", "delete"})

#: The DAG-CBOR encoding of the ``{"t": "#commit", "op": 1}`` header every canonical
#: encoder (the reference PDS, relays) puts at the start of a commit frame.
COMMIT_HEADER: Final = bytes.fromhex("a2617467") + b"#commit" + bytes.fromhex("626f7001")


@dataclass(frozen=True, slots=True)
class IncomingRecord:
    """One record event that is ours: an account we serve, a ``chat.gel.assistant.*`` collection.

    ``record`` is the record (CBOR-decoded with raw ``bytes`` from a firehose, atproto
    JSON with ``{"$bytes": ...}`` from Jetstream; the record models read both), None for a
    delete or a ``tooBig`` commit (the worker then reads it from the PDS).
    ``source_cursor`` is the position in the stream it came from (firehose ``seq``,
    Jetstream v1 ``time_us`` or v2 ``seq``); None for records fed directly.
    """

    did: str
    collection: str
    rkey: str
    cid: str | None
    record: Mapping[str, Any] | None
    source_cursor: int | None = None
    action: Action = "create"

    @property
    def deleted(self) -> bool:
        return self.action == "delete"

    @classmethod
    def from_repo_event(cls, ev: RepoEvent) -> IncomingRecord:
        """The worker's firehose event (:class:`gelbridge._firehose.RepoEvent`) as an IncomingRecord."""
        return cls(ev.did, ev.collection, ev.rkey, ev.cid, ev.record, ev.seq, ev.action)


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records pass: these DIDs (None: any) and collections starting with ``prefix``."""

    dids: frozenset[str] | None
    prefix: str = DEFAULT_PREFIX
    prefix_bytes: bytes = field(init=False, repr=False, compare=False)

    @classmethod
    def for_dids(cls, dids: Iterable[str], prefix: str = DEFAULT_PREFIX) -> RecordFilter:
        return cls(frozenset(dids), prefix)

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("the collection prefix must not be empty")
        object.__setattr__(self, "prefix_bytes", self.prefix.encode())

    def wants(self, did: object, collection: object) -> bool:
        return (
            isinstance(did, str)
            and isinstance(collection, str)
            and collection.startswith(self.prefix)
            and (self.dids is None or did in self.dids)
        )


# --- keys and CIDs ------------------------------------------------------------------------------


def check_record_key(rkey: str, what: str) -> None:
    """RecordError if ``rkey`` is not a record key: no PDS holds such a record, and its
    text (NUL, a lone surrogate ...) must not reach the state store or a log line."""
    if not is_valid_rkey(rkey):
        raise RecordError(f"{what} of a record whose key is not a valid record key; skipped")


#: The atproto string syntax of a CID (lexicon ``format: cid``); only syntax: the PDS
#: judges a CID when gelbridge swaps on it.
_CID_SYNTAX: Final = re.compile(r"[A-Za-z0-9+=]{8,256}")


def cid_or_none(cid: object) -> str | None:
    """``cid`` if it has CID syntax, else None (a malformed CID counts as missing, as on
    the firehose: the record is then handled without one)."""
    return cid if isinstance(cid, str) and _CID_SYNTAX.fullmatch(cid) else None


# --- firehose -------------------------------------------------------------------------------


def from_firehose_frame(frame: bytes | bytearray | memoryview, flt: RecordFilter) -> list[IncomingRecord]:
    """Records of one raw firehose frame (the websocket message bytes).

    Raises :class:`FirehoseError` for an error frame (FutureCursor, ConsumerTooSlow ...),
    for bytes that are not a frame, and for undecodable blocks in a commit that is ours.
    Commits of other repos or collections never have their blocks decoded.
    """
    data = bytes(frame) if not isinstance(frame, bytes) else frame
    if data.startswith(COMMIT_HEADER) and flt.prefix_bytes not in data:
        return []  # a commit without a single path of ours: no decoding at all
    _seq, events, _marker = decode_frame_full(data, flt.dids, flt.prefix)
    return [IncomingRecord.from_repo_event(ev) for ev in events]


def from_commit_body(body: Any, flt: RecordFilter) -> list[IncomingRecord]:
    """Records of one firehose ``#commit`` body: the ``MessageFrame.body`` dict of the SDK
    callback, or its ``ComAtprotoSyncSubscribeRepos.Commit`` model (the worker's own
    decoder, :func:`gelbridge._firehose.commit_events`)."""
    return [IncomingRecord.from_repo_event(ev) for ev in commit_events(body, flt.dids, flt.prefix)]


def from_firehose(message: Any, flt: RecordFilter) -> list[IncomingRecord]:
    """Records of anything a firehose consumer holds: frame bytes, an SDK ``MessageFrame``
    (or ``ErrorFrame``), or a parsed ``Commit`` model. Other message types yield nothing."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        return from_firehose_frame(message, flt)
    header = getattr(message, "header", None)
    if header is not None:  # atproto_subscription.frames.MessageFrame / ErrorFrame
        body = getattr(message, "body", None)
        name = getattr(body, "error", None)
        if getattr(header, "t", None) is None and name is not None:
            msg = getattr(body, "message", None)
            raise FirehoseError(f"firehose error frame {name}" + (f": {msg}" if msg else ""), error=name)
        if getattr(header, "t", None) != "#commit" or not isinstance(body, Mapping):
            return []
        return from_commit_body(body, flt)
    if getattr(message, "py_type", None) == "com.atproto.sync.subscribeRepos#commit":
        return from_commit_body(message, flt)
    return []


# --- Jetstream ------------------------------------------------------------------------------


def _jetstream_v1(event: Mapping[str, Any], flt: RecordFilter) -> list[IncomingRecord]:
    if event.get("kind") != "commit":
        return []
    commit = event.get("commit")
    did = event.get("did")
    if not isinstance(commit, Mapping) or not isinstance(did, str) or not flt.wants(did, commit.get("collection")):
        return []
    return _jetstream_record(did, commit, event.get("time_us"), flt)


def _jetstream_record(did: str, c: Mapping[str, Any], cursor: Any, flt: RecordFilter) -> list[IncomingRecord]:
    action, rkey = c.get("operation"), c.get("rkey")
    if action not in _ACTIONS or not isinstance(rkey, str) or not rkey:
        return []
    check_record_key(rkey, "Jetstream commit")
    cid = cid_or_none(c.get("cid"))
    record = c.get("record") if action != "delete" else None
    if record is not None and not isinstance(record, Mapping):
        record = None
    if action == "delete":
        cid = None
    return [IncomingRecord(did, c["collection"], rkey, cid, record,
                           cursor if isinstance(cursor, int) else None, action)]


def from_jetstream_event(event: Any, flt: RecordFilter) -> list[IncomingRecord]:
    """Records of one Jetstream event: a v1 ``/subscribe`` event (dict, JSON text or bytes:
    ``{did, time_us, kind: "commit", commit: {rev, operation, collection, rkey, record, cid}}``,
    cursor ``time_us``) or a v2 ``subscribeEvents`` commit (SDK ``MessageFrame`` with type
    ``#commit`` or its ``Commit`` model; cursor ``seq``).

    Raises :class:`RecordError` for text that is not a JSON object and for a commit whose
    record key is not a record key; a ``cid`` that is not a CID counts as missing;
    identity/account events and other kinds yield nothing.
    """
    if isinstance(event, (bytes, bytearray, memoryview, str)):
        raw = event if isinstance(event, str) else bytes(event)
        needle: Any = flt.prefix if isinstance(raw, str) else flt.prefix_bytes
        if needle not in raw:
            return []
        try:
            event = nesting.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise RecordError(f"Jetstream event is not JSON ({type(e).__name__})") from None
        if not isinstance(event, dict):
            raise RecordError("Jetstream event is not a JSON object")
    if isinstance(event, Mapping):
        if "kind" in event:
            return _jetstream_v1(event, flt)
        if "operation" in event and "collection" in event:  # a v2 #commit body as a dict
            return _jetstream_v2(event, flt)
        return []
    header = getattr(event, "header", None)
    if header is not None:  # v2 MessageFrame from the SDK's JetstreamClient
        body = getattr(event, "body", None)
        if getattr(header, "t", None) != "#commit" or not isinstance(body, Mapping):
            return []
        return _jetstream_v2(body, flt)
    if getattr(event, "py_type", None) == "network.bsky.jetstream.subscribeEvents#commit":
        record = getattr(event, "record", None)
        if record is not None and not isinstance(record, Mapping):
            to_dict = getattr(record, "to_dict", None) or getattr(record, "model_dump", None)
            record = to_dict() if to_dict is not None else None
        return _jetstream_v2(
            {"did": event.did, "collection": event.collection, "rkey": event.rkey,
             "operation": event.operation, "cid": event.cid, "record": record, "seq": event.seq},
            flt,
        )
    return []


def _jetstream_v2(body: Mapping[str, Any], flt: RecordFilter) -> list[IncomingRecord]:
    did = body.get("did")
    if not isinstance(did, str) or not flt.wants(did, body.get("collection")):
        return []
    return _jetstream_record(did, body, body.get("seq"), flt)


# --- plain tuples ---------------------------------------------------------------------------


def from_record(
    did: str,
    collection: str,
    rkey: str,
    cid: str | None,
    record: Mapping[str, Any] | None,
    flt: RecordFilter,
    *,
    action: Action | None = None,
    source_cursor: int | None = None,
) -> list[IncomingRecord]:
    """A record a consumer already decoded. ``record=None`` means a delete unless
    ``action`` says otherwise (``"update"`` with None: read the record from the PDS).
    RecordError if ``rkey`` is not a record key; a ``cid`` that is not a CID counts as
    missing."""
    if not flt.wants(did, collection) or not isinstance(rkey, str) or not rkey:
        return []
    check_record_key(rkey, "record")
    cid = cid_or_none(cid)
    if action is None:
        action = "delete" if record is None else "create"
    if action not in _ACTIONS:
        raise ValueError(f"action must be create, update or delete, not {action!r}")
    return [IncomingRecord(did, collection, rkey, cid, record if action != "delete" else None,
                           source_cursor, action)]


# --- the one failure policy of every source ---------------------------------------------------

log = logging.getLogger("gelbridge.ingest")

#: what became of a record given to a handler (:func:`hand_over`)
Outcome = Literal["handled", "skipped", "later"]


async def hand_over(handler: Callable[[IncomingRecord], Awaitable[object]],
                    rec: IncomingRecord) -> tuple[Outcome, Exception | None]:
    """Give ``rec`` to ``handler`` under the one failure policy of every event source:
    ``handled``; ``skipped`` (it failed for good: logged, the cursor may pass it); or
    ``later`` with the error (it may pass: the source must not pass the record, and tries
    it again its own way)."""
    try:
        await handler(rec)
    except Exception as e:  # noqa: BLE001
        if is_transient(e):
            log.warning("record %s/%s could not be handled yet (%s); it is tried again",
                        rec.collection, rec.rkey, type(e).__name__)
            return "later", e
        log.error("record %s/%s failed (%s); skipped", rec.collection, rec.rkey, type(e).__name__)
        return "skipped", e
    return "handled", None

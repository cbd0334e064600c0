"""PDS firehose (``com.atproto.sync.subscribeRepos``) reduced to the records gelbridge cares about.

A PDS firehose carries every account on that PDS, so frames are filtered cheaply: the
frame is split into header and body (the ``blocks`` CAR stays undecoded bytes), non
``#commit`` frames and commits of other repos are dropped, and the CAR is decoded only
when an op's path starts with the collection prefix. :func:`decode_frame` is pure, so a
library user or a benchmark can feed it frames without a socket.

Reconnecting (with backoff, resuming from the last seq) is the caller's job; a lost
connection surfaces as :class:`~gelbridge._errors.PdsUnavailable`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, overload
from urllib.parse import urlencode, urlsplit, urlunsplit

from atproto_core.car import CAR
from atproto_core.cid import CID
from atproto_core.exceptions import AtProtocolError

from gelbridge._errors import FirehoseError, PdsUnavailable
from gelbridge._records.keys import is_valid_rkey

if TYPE_CHECKING:
    from atproto_subscription.frames import ErrorFrame, Frame

log = logging.getLogger("gelbridge.firehose")

DEFAULT_PREFIX: Final = "chat.gel.assistant."
MAX_FRAME_BYTES: Final = 5 * 1024 * 1024 + 64 * 1024  # spec: frames <= 5 MB

Action = Literal["create", "update", "delete"]


@dataclass(frozen=True)
class RepoEvent:
    """One record operation of a commit. ``record`` is the CBOR-decoded record
    (bytes fields as raw ``bytes``); None for deletes and for ``tooBig`` commits."""

    seq: int
    did: str
    collection: str
    rkey: str
    action: Action
    cid: str | None
    record: dict[str, Any] | None


@dataclass(frozen=True)
class StreamMarker:
    """A non-commit frame worth knowing about.

    ``kind`` is ``"#open"`` (the websocket is open: first item of every subscription),
    ``"#info"`` (e.g. ``name="OutdatedCursor"``: events were lost, backfill), ``"#sync"``
    (the repo ``did`` was reset: re-fetch it), ``"#account"`` or ``"#identity"``.
    """

    seq: int | None
    kind: str
    did: str | None = None
    name: str | None = None
    message: str | None = None


def _cid_of(value: Any) -> CID | None:
    """A CID object from raw CID bytes (libipld), a CID, or its string form."""
    if value is None:
        return None
    if isinstance(value, CID):
        return value
    if isinstance(value, (bytes, bytearray)):
        return CID.from_decoded_bytes(bytes(value))
    if isinstance(value, str):
        return CID.decode(value)
    return None


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` of a dict, ``obj.key`` of an SDK model."""
    if type(obj) is dict:  # frames: the common case, without the ABC check (hot path)
        return obj.get(key)
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


_ACTIONS: Final = frozenset({"create", "update", "delete"})

#: the SDK's frame types, imported on first use: ``atproto_subscription`` imports the
#: SDK's whole XRPC client (about a second), which the offline commands never need
_frame_types: tuple[type[Frame], type[ErrorFrame]] | None = None


def _frames() -> tuple[type[Frame], type[ErrorFrame]]:
    global _frame_types
    if _frame_types is None:
        from atproto_subscription.frames import ErrorFrame, Frame

        _frame_types = (Frame, ErrorFrame)
    return _frame_types


def commit_events(
    body: Any, did_filter: set[str] | frozenset[str] | None, prefix: str = DEFAULT_PREFIX
) -> list[RepoEvent]:
    """The record operations of one ``#commit`` body that pass the filter: the CBOR-decoded
    dict of a frame, or the SDK's ``MessageFrame.body`` / ``Commit`` model.

    The repo, the op paths and the seq are checked before the ``blocks`` CAR is decoded
    (only when some op of ours is not a delete). A malformed CID counts as missing.
    Undecodable blocks (a malformed CAR, a record nested too deep for the CBOR decoder)
    leave the ops without a record: the reader fetches those from the PDS.
    """
    repo = _get(body, "repo")
    if not isinstance(repo, str) or (did_filter is not None and repo not in did_filter):
        return []
    ops = []
    for op in _get(body, "ops") or ():
        path = _get(op, "path")
        if isinstance(path, str) and path.startswith(prefix):
            ops.append(op)
    seq = _get(body, "seq")
    if not ops or not isinstance(seq, int):
        return []
    blocks: Mapping[CID, Any] = {}
    raw_blocks = _get(body, "blocks")
    if raw_blocks and any(_get(op, "action") != "delete" for op in ops):
        if isinstance(raw_blocks, str):  # the SDK model types blocks as str | bytes
            raw_blocks = raw_blocks.encode("latin-1")
        try:
            blocks = CAR.from_bytes(raw_blocks).blocks
        except Exception:  # noqa: BLE001 - libipld: ValueError (also for a block nested too deep)
            # the ops then carry no record, so the worker reads each from the PDS (as for a
            # tooBig commit) and judges it there: one bad block never wedges the stream
            log.warning("commit seq %s of %s has undecodable blocks; reading its records from the PDS", seq, repo)
            blocks = {}
    events: list[RepoEvent] = []
    for op in ops:
        action = _get(op, "action")
        if action not in _ACTIONS:
            continue
        collection, _, rkey = _get(op, "path").partition("/")
        if not rkey:
            continue
        if not is_valid_rkey(rkey):  # no PDS holds it: never stored, never logged
            log.warning("commit seq %s of %s has an op whose record key is not valid; skipped", seq, repo)
            continue
        try:
            cid = _cid_of(_get(op, "cid"))
            cid_text = str(cid) if cid is not None else None  # libipld decodes lazily: may raise here
        except Exception:  # noqa: BLE001 - a malformed CID: treat like a missing one
            cid = cid_text = None
        record = None
        if action != "delete" and cid is not None:
            block = blocks.get(cid)
            record = block if isinstance(block, dict) else None
        events.append(RepoEvent(seq, repo, collection, rkey, action, cid_text, record))
    return events


def decode_frame_full(
    frame: bytes, did_filter: set[str] | frozenset[str] | None, prefix: str = DEFAULT_PREFIX
) -> tuple[int | None, list[RepoEvent], StreamMarker | None]:
    """Decode one firehose frame: ``(seq, events, marker)``.

    Raises :class:`FirehoseError` for an error frame (FutureCursor, ConsumerTooSlow ...)
    or bytes that are not a frame.
    """
    frame_type, error_type = _frame_types or _frames()
    try:
        parsed = frame_type.from_bytes(frame)
    except (AtProtocolError, ValueError, TypeError, RecursionError) as e:  # libipld raises ValueError
        raise FirehoseError(f"undecodable firehose frame: {e}") from None
    if isinstance(parsed, error_type):
        name, msg = parsed.body.error, parsed.body.message
        raise FirehoseError(
            f"firehose error frame {name}" + (f": {msg}" if msg else ""), error=name
        )
    body = parsed.body
    kind = parsed.header.t
    if not isinstance(body, dict):
        raise FirehoseError(f"firehose frame {kind} has no map body")
    raw_seq = body.get("seq") if isinstance(body, dict) else None
    seq = raw_seq if isinstance(raw_seq, int) else None

    if kind != "#commit":
        did = body.get("did") if isinstance(body.get("did"), str) else None
        if kind == "#info":
            return seq, [], StreamMarker(seq, kind, None, body.get("name"), body.get("message"))
        if kind in ("#sync", "#account", "#identity") and (did_filter is None or did in did_filter):
            return seq, [], StreamMarker(seq, kind, did)
        return seq, [], None

    return seq, commit_events(body, did_filter, prefix), None


def decode_frame(
    frame: bytes, did_filter: set[str] | frozenset[str] | None, prefix: str = DEFAULT_PREFIX
) -> tuple[int | None, list[RepoEvent]]:
    """``(seq, events)`` of one firehose frame; see :func:`decode_frame_full`."""
    seq, events, _ = decode_frame_full(frame, did_filter, prefix)
    return seq, events


def subscribe_url(pds_url: str, cursor: int | None) -> str:
    """``ws(s)://host/xrpc/com.atproto.sync.subscribeRepos[?cursor=N]`` for a PDS URL."""
    parts = urlsplit(pds_url.rstrip("/"))
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = urlencode({"cursor": cursor}) if cursor is not None else ""
    return urlunsplit((scheme, parts.netloc, parts.path + "/xrpc/com.atproto.sync.subscribeRepos", query, ""))


@overload
def subscribe_repos(
    pds_url: str,
    *,
    cursor: int | None,
    did_filter: set[str] | None,
    collection_prefix: str = ...,
    markers: Literal[False] = ...,
    open_timeout: float = ...,
) -> AsyncGenerator[RepoEvent, None]: ...


@overload
def subscribe_repos(
    pds_url: str,
    *,
    cursor: int | None,
    did_filter: set[str] | None,
    collection_prefix: str = ...,
    markers: Literal[True],
    open_timeout: float = ...,
) -> AsyncGenerator[RepoEvent | StreamMarker, None]: ...


async def subscribe_repos(
    pds_url: str,
    *,
    cursor: int | None,
    did_filter: set[str] | None,
    collection_prefix: str = DEFAULT_PREFIX,
    markers: bool = False,
    open_timeout: float = 10.0,
) -> AsyncGenerator[Any, None]:
    """Record events from a PDS firehose, replaying events with seq > ``cursor``.

    With ``markers=True`` also yields :class:`StreamMarker`: ``#open`` once the websocket is
    open (a generator does nothing until iterated, so this is how a caller learns that the
    subscription is live), then #info/#sync/#account/#identity frames (of the filtered
    repos). #info frames are logged either way.
    Persist ``event.seq`` to resume. Connection loss raises :class:`PdsUnavailable`;
    an error frame raises :class:`FirehoseError`. Wrap it in ``contextlib.aclosing``
    when you may stop early, so the socket closes at once::

        async with aclosing(subscribe_repos(url, cursor=c, did_filter={did})) as events:
            async for ev in events: ...
    """
    url = subscribe_url(pds_url, cursor)
    # a set is read live (its owner may add DIDs while subscribed); anything else is copied
    dids = did_filter if isinstance(did_filter, set) else (frozenset(did_filter) if did_filter is not None else None)
    import websockets

    _frames()  # now, while the source starts, rather than on the first frame
    try:
        ws = await websockets.connect(
            url, open_timeout=open_timeout, max_size=MAX_FRAME_BYTES, ping_interval=20, ping_timeout=20
        )
    except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as e:
        raise PdsUnavailable(
            f"cannot open the firehose of {pds_url} ({type(e).__name__}): check that the PDS is running"
        ) from None
    try:
        if markers:
            yield StreamMarker(None, "#open")
        while True:
            try:
                frame = await ws.recv()
            except websockets.ConnectionClosedOK:
                raise PdsUnavailable(f"the PDS {pds_url} closed the firehose; reconnect from the last seq") from None
            except websockets.ConnectionClosed as e:
                raise PdsUnavailable(
                    f"lost the firehose of {pds_url} ({e.__class__.__name__}); reconnect from the last seq"
                ) from None
            if isinstance(frame, str):
                continue
            _seq, events, marker = decode_frame_full(frame, dids, collection_prefix)
            if marker is not None:
                if marker.kind == "#info":
                    log.warning("firehose info %s: %s", marker.name, marker.message or "")
                if markers:
                    yield marker
            for ev in events:
                yield ev
    finally:
        await ws.close()

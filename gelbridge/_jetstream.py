"""Jetstream source (``[watch] source = "jetstream"``): JSON record events over a websocket.

Jetstream (bluesky-social/jetstream) turns the relay firehose into JSON and filters it on
the server. This module speaks its documented public v1 endpoint::

    <url>/subscribe?wantedCollections=chat.gel.assistant.*&wantedDids=<did>...&cursor=<time_us>

Events are ``{"did", "time_us", "kind": "commit", "commit": {"rev", "operation",
"collection", "rkey", "record", "cid"}}`` (plus ``identity``/``account`` kinds, ignored).
The SDK's ``JetstreamClient`` speaks the newer v2 XRPC method
``network.bsky.jetstream.subscribeEvents`` instead; a consumer that already runs it can
feed its messages to :class:`gelbridge._bridge.Bridge`.

Cursor: ``time_us`` of the last event whose effects are durable, saved in the state
store (``jetstream:<url>``). Jetstream cursors are times, only roughly ordered, and a
reconnect may land on another instance, so a reconnect rewinds the cursor by
``rewind_seconds`` and replayed events are dropped by the state store's seen set
(``mark_seen(did, rkey, cid)``). Events are handled one at a time, in stream order; a
handler returns once the event's effects are durable (``Worker.handle_event``), so the
saved cursor never runs ahead of work. Reconnects back off exponentially (bounded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from gelbridge._backoff import backoff_delay
from gelbridge._config import WatchConfig
from gelbridge._errors import GelbridgeError, RecordError, is_transient
from gelbridge._firehose import DEFAULT_PREFIX
from gelbridge._ingest import IncomingRecord, RecordFilter, from_jetstream_event, hand_over
from gelbridge._records import nesting
from gelbridge._state import StateStore

log = logging.getLogger("gelbridge.jetstream")

Handler = Callable[[IncomingRecord], Awaitable[object]]

#: Largest Jetstream message accepted (a record is at most 1 MiB of CBOR; JSON is larger).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MICROS = 1_000_000


def subscribe_url(
    base_url: str,
    *,
    collections: Iterable[str] = (DEFAULT_PREFIX + "*",),
    dids: Iterable[str] = (),
    cursor: int | None = None,
) -> str:
    """``ws(s)://host[/path]/subscribe?wantedCollections=...&wantedDids=...&cursor=...``.

    ``base_url`` may be the instance (``wss://jetstream2.us-east.bsky.network``) or the
    full ``.../subscribe`` URL; ``http(s)`` becomes ``ws(s)``. Jetstream allows at most 100
    collections and 10,000 DIDs per connection.
    """
    parts = urlsplit(base_url.strip())
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"Jetstream URL must start with ws://, wss://, http:// or https://, not {base_url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/subscribe"):
        path += "/subscribe"
    dids = list(dids)
    collections = list(collections)
    if len(dids) > 10_000 or len(collections) > 100:
        raise ValueError("Jetstream takes at most 10,000 wantedDids and 100 wantedCollections per connection")
    query: list[tuple[str, str]] = [("wantedCollections", c) for c in collections]
    query += [("wantedDids", d) for d in dids]
    if cursor is not None:
        query.append(("cursor", str(int(cursor))))
    return urlunsplit((scheme, parts.netloc, path, urlencode(query, safe="*:"), ""))


def rewound(cursor: int | None, seconds: float) -> int | None:
    """The cursor to reconnect with: ``seconds`` earlier (Jetstream cursors are ``time_us``)."""
    if cursor is None:
        return None
    return max(0, cursor - int(seconds * MICROS))


def jetstream_cursor_key(url: str) -> str:
    return f"jetstream:{url.rstrip('/')}"


class JetstreamSource:
    """Subscribe, filter, hand each record of ours to ``handler``, save the cursor, reconnect.

    ``store`` is a :class:`gelbridge._state.StateStore` (cursor + seen events); it may be
    shared by several accounts (keys carry the DID).
    """

    live = True

    def __init__(
        self,
        url: str,
        dids: Iterable[str],
        store: StateStore,
        handler: Handler,
        *,
        prefix: str = DEFAULT_PREFIX,
        rewind_seconds: float = 5.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        open_timeout: float = 10.0,
        cursor_save_interval: float = 1.0,
        on_reconnect: Callable[[], None] | None = None,
        key: str | None = None,
    ) -> None:
        """``on_reconnect`` is called after a connection that follows a lost one (events
        may have been missed: the workers drop cached side records and sweep). ``key``:
        where the cursor is kept (default: by URL; a fleet member keeps its own). With no
        DIDs the source waits for :meth:`set_dids`: Jetstream without ``wantedDids``
        would send every account's events."""
        self.url = url
        self.prefix = prefix
        self.filter = RecordFilter.for_dids(dids, prefix)
        self.dids = frozenset(self.filter.dids or ())
        self._dids_changed = asyncio.Event()
        self._ws: Any = None  # the open connection, while run() consumes it
        self._resubscribe = False
        self._closing: asyncio.Future[None] | None = None
        self.on_reconnect = on_reconnect
        self.store = store
        self.handler = handler
        self.rewind_seconds = rewind_seconds
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.open_timeout = open_timeout
        self.cursor_save_interval = cursor_save_interval
        self.key = key or jetstream_cursor_key(url)
        self.cursor: int | None = None  # the saved one, read when run() starts
        self._loaded = False
        self._saved_cursor: int | None = self.cursor
        self._saved_at = 0.0
        self.connected = asyncio.Event()
        self.connects = 0
        self.last_event_at: float | None = None  # time.monotonic() of the last message
        self.handled = 0
        self.duplicates = 0
        self.skipped = 0

    @property
    def reconnects(self) -> int:
        """Connections after the first."""
        return max(0, self.connects - 1)

    def set_dids(self, dids: Iterable[str]) -> None:
        """Follow these accounts from now on: an open connection is closed and the next
        one asks for the new ``wantedDids`` from the cursor, at once (no backoff, not
        counted as a lost connection). A newly served account's past is its bridge's
        backfill, as after any start."""
        new = frozenset(dids)
        if new == self.dids:
            return
        self.filter = RecordFilter.for_dids(new, self.prefix)
        self.dids = new
        self._dids_changed.set()
        if self._ws is not None:
            self._resubscribe = True
            self._closing = asyncio.ensure_future(self._ws.close())

    async def drain(self, timeout: float) -> None:
        """Nothing to wait for: records are handed over one at a time, inside :meth:`run`."""

    def current_url(self) -> str:
        """The URL of the next connection (cursor rewound)."""
        return subscribe_url(
            self.url,
            collections=[self.filter.prefix + "*"],
            dids=sorted(self.filter.dids or ()),
            cursor=rewound(self.cursor, self.rewind_seconds),
        )

    async def load_cursor(self) -> None:
        """Start from the saved cursor (once; ``run`` calls it)."""
        if not self._loaded:
            saved = await self.store.get_cursor(self.key)
            self.cursor = saved if isinstance(saved, int) else None
            self._saved_cursor = self.cursor
            self._loaded = True

    async def _save_cursor(self, force: bool) -> None:
        if self.cursor is None or self.cursor == self._saved_cursor:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < self.cursor_save_interval:
            return
        try:
            await self.store.set_cursor(self.key, self.cursor)
        except GelbridgeError as e:
            log.error("cannot save the Jetstream cursor (%s)", type(e).__name__)
            return
        self._saved_cursor, self._saved_at = self.cursor, now

    async def handle_message(self, message: str | bytes) -> int:
        """Filter one websocket message, handle its record (deduplicated), advance the cursor.

        Returns how many records were handled (0 or 1). A handler failure that may pass
        (:func:`~gelbridge._errors.is_transient`: the PDS or the state store unreachable)
        is raised and the cursor stays before the record, so it is delivered again; any
        other failure (a record the handler can never take) is logged and the record
        skipped, as the firehose does: one bad record never stops the stream.
        """
        try:
            records = from_jetstream_event(message, self.filter)
        except RecordError as e:
            log.warning("skipping a Jetstream message (%s)", e)
            return 0
        n = 0
        for rec in records:
            if rec.cid is not None and await self.store.was_seen(rec.did, rec.rkey, rec.cid):
                self.duplicates += 1
            else:
                outcome, err = await hand_over(self.handler, rec)  # returns when the effects are durable
                if outcome == "later" and err is not None:
                    raise err  # the cursor stays before it: delivered again after reconnecting
                if outcome == "skipped":
                    self.skipped += 1  # never retried: it would hold the cursor for good
                else:
                    if rec.cid is not None:
                        await self.store.mark_seen(rec.did, rec.rkey, rec.cid)
                    n += 1
                    self.handled += 1
            if rec.source_cursor is not None and (self.cursor is None or rec.source_cursor > self.cursor):
                self.cursor = rec.source_cursor
            await self._save_cursor(force=True)
        if not records:
            cur = _peek_time_us(message)
            if cur is not None and (self.cursor is None or cur > self.cursor):
                self.cursor = cur  # nothing of ours before it is still open: safe to move on
                await self._save_cursor(force=False)
        return n

    async def run(self) -> None:
        """Until cancelled: connect, consume, reconnect with bounded exponential backoff.

        While it has no DIDs it waits (never subscribing to every account); a change of
        DIDs reconnects at once (:meth:`set_dids`). A record the handler cannot take yet
        (its PDS is down, say) does not end the watch: the cursor has not passed it, so the source drops the connection, waits
        and reconnects from the cursor, which delivers it again (records handled since
        are dropped as seen). The wait grows while the same record keeps failing.
        """
        import websockets  # here: 'gelbridge check' and the library's imports need no socket stack

        failures = 0  # consecutive connection failures
        stuck = 0  # consecutive handler failures: the record the cursor waits on
        quiet = False  # this connection follows a change of DIDs, not a lost one
        while True:
            while not self.dids:
                self._dids_changed.clear()
                await self._dids_changed.wait()
            try:
                await self.load_cursor()
                asked, url = self.dids, self.current_url()
                async with websockets.connect(
                    url, open_timeout=self.open_timeout, max_size=MAX_MESSAGE_BYTES,
                    ping_interval=20, ping_timeout=20,
                ) as ws:
                    self._ws = ws
                    if self.dids != asked:  # they changed while connecting: ask again
                        self._resubscribe = True
                    else:
                        self.connected.set()
                        self.connects += 1
                        if failures or stuck:
                            log.info("Jetstream reconnected (cursor %s)", self.cursor)
                        if self.connects > 1 and not quiet and self.on_reconnect is not None:
                            try:
                                self.on_reconnect()
                            except Exception as e:  # noqa: BLE001 - never ends the watch
                                log.error("reconnect hook failed (%s)", type(e).__name__)
                        failures = 0
                        async for message in ws:
                            self.last_event_at = time.monotonic()
                            if await self.handle_message(message):
                                stuck = 0
            except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI,
                    websockets.ConnectionClosed) as e:
                log.warning("Jetstream connection lost or refused (%s)", type(e).__name__)
                failures += 1
            except Exception as e:
                if not is_transient(e):  # handle_message skips what is not transient: a bug here
                    raise
                stuck += 1  # the handler could not take a record yet: retry it, never end the watch
                log.warning("Jetstream: a record could not be handled (%s); it is delivered again "
                            "after reconnecting from the cursor", type(e).__name__)
            finally:
                self._ws = None
                self.connected.clear()
                await self._save_cursor(force=True)
            quiet = self._resubscribe
            if quiet:
                self._resubscribe = False
                failures = 0
                continue
            delay = backoff_delay(max(failures, stuck, 1), base=self.backoff_base, cap=self.backoff_cap)
            log.info("Jetstream: reconnecting in %.1f s", delay)
            await asyncio.sleep(delay)


def _peek_time_us(message: str | bytes) -> int | None:
    """``time_us`` of an event that is not ours (identity/account events: small)."""
    try:
        event = nesting.loads(message)
    except (ValueError, UnicodeDecodeError):
        return None
    cur = event.get("time_us") if isinstance(event, dict) else None
    return cur if isinstance(cur, int) else None


def jetstream_url(watch: WatchConfig) -> str:
    """``[watch] url`` for ``source = "jetstream"``, or ``ConfigError`` saying it is needed."""
    from gelbridge._errors import ConfigError

    if not watch.url:
        raise ConfigError('[watch] source = "jetstream" needs url = "wss://<jetstream host>"')
    url: str = watch.url
    return url

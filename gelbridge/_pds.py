"""Async XRPC client for the user's PDS: session, records, create-only claims, blobs.

Plain XRPC over one reused ``httpx.AsyncClient`` instead of the atproto SDK, because the
SDK cannot send ``"swapRecord": null`` (create-only ``putRecord``, the claim primitive of
PROTOCOL.md §4) through its typed methods. Records go in and out as atproto JSON dicts
(bytes as ``{"$bytes": base64}``); ``gelbridge._records`` converts them.

Sessions: log in once, persist the :class:`Session` through ``on_session_change`` and
``resume`` it later (createSession is rate limited). The access token is refreshed
before it expires and whenever the PDS answers ``ExpiredToken``; refresh tokens rotate,
so every refresh is reported to ``on_session_change``. Tokens never appear in logs,
reprs or exception messages.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit

from gelbridge import _tracing as tracing
from gelbridge._backoff import backoff_delay
from gelbridge._errors import (
    ClaimConflict,
    PdsAuthError,
    PdsError,
    PdsRateLimited,
    PdsUnavailable,
    RecordError,
)
from gelbridge._records import nesting
from gelbridge._records.codec import bytes_json
from gelbridge._records.keys import AtUri

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gelbridge.pds")
_T = TypeVar("_T")

DEFAULT_MAX_BLOB_BYTES: Final = 5 * 1024 * 1024  # reference PDS default upload limit
DEFAULT_MAX_REPO_BYTES: Final = 256 * 1024 * 1024
#: the JWT scope of a session made with the main password (not an app password)
MAIN_PASSWORD_SCOPE: Final = "com.atproto.access"


# --- values -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    """An authenticated PDS session. ``repr`` hides the tokens."""

    did: str
    handle: str
    access_jwt: str = field(repr=False)
    refresh_jwt: str = field(repr=False)

    @property
    def main_password(self) -> bool:
        """Made with the account's main password, not an app password: the reference PDS
        gives such a session the scope ``com.atproto.access`` (an app password's is
        ``com.atproto.appPass``, a privileged one's ``com.atproto.appPassPrivileged``)."""
        return jwt_claims(self.access_jwt).get("scope") == MAIN_PASSWORD_SCOPE

    def to_dict(self) -> dict[str, str]:
        """Plain dict for persisting (it holds secrets: store it like a password)."""
        return {
            "did": self.did,
            "handle": self.handle,
            "accessJwt": self.access_jwt,
            "refreshJwt": self.refresh_jwt,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Session:
        """Read a dict from :meth:`to_dict` or a createSession/refreshSession answer."""
        try:
            return cls(
                did=str(d["did"]),
                handle=str(d["handle"]),
                access_jwt=str(d["accessJwt"]),
                refresh_jwt=str(d["refreshJwt"]),
            )
        except KeyError as e:
            raise PdsAuthError(f"stored PDS session lacks {e.args[0]!r}: log in again") from None


@dataclass(frozen=True)
class ListedRecord:
    """One record of a listRecords page."""

    uri: str
    cid: str
    value: dict[str, Any]

    @property
    def rkey(self) -> str:
        """The record key; a listRecords ``uri`` is always ``at://<did>/<collection>/<rkey>``."""
        return AtUri.parse(self.uri).rkey


@dataclass(frozen=True)
class RecordPage:
    """A listRecords page; ``cursor`` is None on the last page."""

    records: list[ListedRecord]
    cursor: str | None


@dataclass(frozen=True)
class PutResult:
    """putRecord answer. ``committed`` is False when the PDS made no commit (identical record)."""

    uri: str
    cid: str
    committed: bool


class _Unset:
    """Type of :data:`UNSET` ("argument not given", unlike None = JSON null)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()

SessionCallback = Callable[[Session], Awaitable[None] | None]


# --- pure helpers -------------------------------------------------------------------------


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without verifying it (empty if it is not one)."""
    try:
        payload = token.split(".")[1]
        payload += "=" * (-len(payload) % 4)
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (IndexError, ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (seconds since the epoch), read without verifying it."""
    exp = jwt_claims(token).get("exp")
    return float(exp) if isinstance(exp, (int, float)) else None


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait after a 429/503, from ``Retry-After`` or ``ratelimit-reset`` (epoch s)."""
    now = time.time() if now is None else now
    ra = headers.get("retry-after")
    if ra:
        try:
            return max(0.0, float(ra))
        except ValueError:
            try:
                dt = email.utils.parsedate_to_datetime(ra)
                return max(0.0, dt.timestamp() - now)
            except (TypeError, ValueError):
                pass
    reset = headers.get("ratelimit-reset")
    if reset:
        try:
            return max(0.0, float(reset) - now)
        except ValueError:
            pass
    return None


def error_from_response(resp: httpx.Response, what: str) -> PdsError:
    """Map an XRPC error answer to the matching :class:`PdsError` (no tokens, no content)."""
    status = resp.status_code
    err: str | None = None
    msg: str | None = None
    try:
        body = nesting.loads(resp.content)
        if isinstance(body, dict):
            err = body.get("error") if isinstance(body.get("error"), str) else None
            msg = body.get("message") if isinstance(body.get("message"), str) else None
    except ValueError:
        pass
    detail = f"{err or 'HTTP ' + str(status)}" + (f": {msg[:300]}" if msg else "")
    if status == 429:
        ra = retry_after_seconds(resp.headers)
        wait = f"; retry in {ra:.0f} s" if ra is not None else "; retry later"
        return PdsRateLimited(f"PDS rate limit hit on {what}{wait}", retry_after=ra, error=err)
    if status >= 500:
        return PdsUnavailable(
            f"PDS failed on {what} ({detail}); retry later", status=status, error=err
        )
    if err == "InvalidSwap":
        return ClaimConflict(
            f"{what}: the record changed or already exists with other content ({detail})",
            status=status,
            error=err,
        )
    if status in (401, 403) or err in ("ExpiredToken", "InvalidToken", "AuthRequired", "AuthFactorTokenRequired"):
        return PdsAuthError(
            f"PDS refused the credentials on {what} ({detail}): check the handle and app password",
            status=status,
            error=err,
        )
    return PdsError(f"PDS refused {what} ({detail})", status=status, error=err)


def _bytes_json(value: Any) -> Any:
    """Turn stray Python ``bytes`` into atproto JSON ``{"$bytes": ...}`` (defensive).

    Not ``codec.to_json_form``: that one guesses 36-byte CID-looking values to be links,
    and a record being written holds its links as ``{"$link"}`` already."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes_json(bytes(value))
    if isinstance(value, dict):
        return {k: _bytes_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bytes_json(v) for v in value]
    return value


# --- the client -----------------------------------------------------------------------------


#: Write costs on the reference PDS (``src/rate-limits.ts``): putRecord is always 2.
WRITE_POINTS = {"com.atproto.repo.putRecord": 2, "com.atproto.repo.createRecord": 3,
                "com.atproto.repo.deleteRecord": 1}
#: What one reply record write costs (create or update: always ``putRecord``).
PUT_RECORD_POINTS = WRITE_POINTS["com.atproto.repo.putRecord"]


@dataclass
class WriteBudget:
    """The account's PDS write budget as this client last saw it: from the PDS's
    ``ratelimit-*`` headers when it sends them (rate limits on), else only the points
    this client spent (``remaining`` unknown). Shared with the user's own app."""

    spent: int = 0  # points this client's writes cost (known costs)
    limit: int | None = None
    remaining: int | None = None
    reset_at: float | None = None  # epoch seconds

    def seen(self, headers: Mapping[str, str]) -> None:
        try:
            if "ratelimit-remaining" in headers:
                self.remaining = int(float(headers["ratelimit-remaining"]))
            if "ratelimit-limit" in headers:
                self.limit = int(float(headers["ratelimit-limit"].split(";")[0]))
            if "ratelimit-reset" in headers:
                self.reset_at = float(headers["ratelimit-reset"])
        except ValueError:
            pass

    def restore(self, limit: int | None, remaining: int | None, reset_at: float | None) -> None:
        """A budget saved earlier (``StateStore.save_write_budget``), if its window is still open."""
        if remaining is not None and reset_at is not None and reset_at > time.time():
            self.limit, self.remaining, self.reset_at = limit, remaining, reset_at

    def low(self, reserve: int) -> bool:
        """Fewer than ``reserve`` points left before the reset (as far as is known)."""
        if self.remaining is None:
            return False
        if self.reset_at is not None and time.time() >= self.reset_at:
            return False  # a new window began
        return self.remaining < reserve

    def pressure(self) -> float:
        """The share of the window's points used (0 while unknown or after the reset)."""
        if self.remaining is None or not self.limit:
            return 0.0
        if self.reset_at is not None and time.time() >= self.reset_at:
            return 0.0
        return max(0.0, 1.0 - self.remaining / self.limit)


class RelayBudget:
    """Record-write events this process sent to one PDS host, against a relay's per-host
    limits (Bluesky's relay takes 50 events/s, 2,600/h and 21,000/day from a new
    self-hosted PDS host; every record write is an event). Shared by every account of
    the process on that host. It sees only this process's writes, not the user's own app
    or other accounts on the host: the writer keeps headroom below the limits for them.

    Windows are fixed buckets (seconds, minutes, hours), so a count is exact to within one
    bucket of the window's edge."""

    WINDOWS = (("second", 1.0, 1.0), ("hour", 3600.0, 60.0), ("day", 86400.0, 3600.0))

    def __init__(self, host: str, per_second: int, per_hour: int, per_day: int,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.limits = {"second": per_second, "hour": per_hour, "day": per_day}
        self._clock = clock
        self._buckets: dict[str, dict[int, int]] = {name: {} for name, _, _ in self.WINDOWS}

    def note(self, n: int = 1) -> None:
        """Count ``n`` record writes that reached the PDS now."""
        now = self._clock()
        for name, span, size in self.WINDOWS:
            b = self._buckets[name]
            i = int(now // size)
            b[i] = b.get(i, 0) + n
            oldest = int((now - span) // size)
            for k in [k for k in b if k <= oldest]:
                del b[k]

    def counts(self) -> dict[str, int]:
        """Events in each window now: ``{"second", "hour", "day"}``."""
        now = self._clock()
        out = {}
        for name, span, size in self.WINDOWS:
            oldest = int((now - span) // size)
            out[name] = sum(v for k, v in self._buckets[name].items() if k > oldest)
        return out

    def pressure(self) -> float:
        """The fullest window, as a fraction of its limit (0 when no limit is set)."""
        c = self.counts()
        return max((c[k] / lim for k, lim in self.limits.items() if lim > 0), default=0.0)


class PdsClient:
    """Async XRPC client for one PDS account (or unauthenticated reads).

    Use as ``async with PdsClient(url) as pds: await pds.login(...)``. One
    ``httpx.AsyncClient`` is reused for every call. Reads are retried with bounded
    backoff on connection errors, 5xx and 429; writes only when the request surely did
    not reach the PDS (connect errors) or was rate limited.
    """

    def __init__(
        self,
        pds_url: str,
        *,
        session: Session | None = None,
        on_session_change: SessionCallback | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
        max_rate_limit_wait: float = 60.0,
        max_budget_wait: float = 7200.0,
        refresh_margin: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.pds_url = pds_url.rstrip("/")
        self._host = urlsplit(self.pds_url).hostname or ""
        self._session = session
        self._on_session_change = on_session_change
        self._max_retries = max_retries
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._max_rate_limit_wait = max_rate_limit_wait
        self._max_budget_wait = max_budget_wait
        self.budget = WriteBudget()
        self.relay: RelayBudget | None = None  # set by the worker when relay limits apply to this host
        self._refresh_margin = refresh_margin
        self._owns_http = http is None
        if http is None:
            import httpx  # on first use: the offline commands import this module, never a client

            http = httpx.AsyncClient(
                timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                headers={"User-Agent": "gelbridge"},
            )
        self._http = http
        self._refresh_lock = asyncio.Lock()
        #: called before every POST (each write, login and session refresh): raises to
        #: stop it; the fleet's lease check (a worker that lost its lease writes nothing)
        self.write_guard: Callable[[], None] | None = None

    async def __aenter__(self) -> PdsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    # --- session ---------------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        return self._session

    @property
    def did(self) -> str:
        """The logged-in account's DID (raises if there is no session)."""
        return self._require_session().did

    async def login(self, identifier: str, password: str) -> Session:
        """createSession with a handle/DID and (app) password; reports the new session."""
        data = await self._call(
            "POST",
            "com.atproto.server.createSession",
            json_body={"identifier": identifier, "password": password},
            auth=None,
            retry="write",
        )
        return await self._set_session(Session.from_dict(data))

    async def logout(self) -> None:
        """deleteSession: the PDS forgets this session (its refresh token stops working)."""
        session = self._require_session()
        await self._call("POST", "com.atproto.server.deleteSession", auth=session.refresh_jwt, retry="write")
        self._session = None

    def resume(self, session: Session) -> None:
        """Use a stored session (no network call; it is refreshed when needed)."""
        self._session = session

    async def refresh(self) -> Session:
        """refreshSession now (refresh tokens rotate: the new session is reported)."""
        old = self._require_session()
        async with self._refresh_lock:
            cur = self._require_session()
            if cur.refresh_jwt != old.refresh_jwt:  # another task refreshed meanwhile
                return cur
            data = await self._call(
                "POST", "com.atproto.server.refreshSession", auth=cur.refresh_jwt, retry="write"
            )
            return await self._set_session(Session.from_dict({**data, "did": data.get("did", cur.did)}))

    async def _set_session(self, session: Session) -> Session:
        self._session = session
        if self._on_session_change is not None:
            res = self._on_session_change(session)
            if asyncio.iscoroutine(res):
                await res
        return session

    def _require_session(self) -> Session:
        if self._session is None:
            raise PdsAuthError("not logged in to the PDS: call login() or resume() first")
        return self._session

    async def _access_token(self) -> str:
        s = self._require_session()
        exp = jwt_expiry(s.access_jwt)
        if exp is not None and exp - time.time() < self._refresh_margin:
            s = await self.refresh()
        return s.access_jwt

    # --- records ------------------------------------------------------------------------

    async def get_record(
        self, collection: str, rkey: str, *, repo: str | None = None
    ) -> tuple[str, dict[str, Any]] | None:
        """``(cid, value)`` of a record, or None if it does not exist."""
        try:
            data = await self._call(
                "GET",
                "com.atproto.repo.getRecord",
                params={"repo": repo or self.did, "collection": collection, "rkey": rkey},
                auth="optional",
            )
        except PdsError as e:
            if e.error == "RecordNotFound" or (e.status == 404 and e.error in (None, "NotFound")):
                return None
            raise
        return str(data["cid"]), data["value"]

    async def list_records(
        self,
        collection: str,
        *,
        limit: int = 50,
        cursor: str | None = None,
        reverse: bool = False,
        repo: str | None = None,
    ) -> RecordPage:
        """One listRecords page (default order: rkey descending; ``reverse`` = ascending)."""
        params: dict[str, Any] = {
            "repo": repo or self.did,
            "collection": collection,
            "limit": max(1, min(limit, 100)),
        }
        if cursor:
            params["cursor"] = cursor
        if reverse:
            params["reverse"] = "true"
        data = await self._call("GET", "com.atproto.repo.listRecords", params=params, auth="optional")
        records = [
            ListedRecord(uri=r["uri"], cid=r["cid"], value=r["value"]) for r in data.get("records", [])
        ]
        next_cursor = data.get("cursor") if records else None
        return RecordPage(records=records, cursor=next_cursor or None)

    async def iter_records(
        self,
        collection: str,
        *,
        page_size: int = 100,
        max_pages: int = 1000,
        reverse: bool = False,
        repo: str | None = None,
    ) -> AsyncIterator[ListedRecord]:
        """Every record of a collection, page by page, at most ``max_pages`` pages.

        If listRecords answers HTTP 500, the rest of the listing comes from the repo
        export (``sync.getRepo``), values then in CBOR form: the reference PDS in dev
        mode (dev-env 0.3.215 / pds 0.4.217) fails its own response check on every
        record that holds a blob ref (docs/worker.md, Known limits).
        """
        cursor: str | None = None
        for _ in range(max_pages):
            try:
                page = await self.list_records(
                    collection, limit=page_size, cursor=cursor, reverse=reverse, repo=repo
                )
            except PdsUnavailable as e:
                if e.status != 500:
                    raise
                log.warning("listRecords %s answered HTTP 500; listing from sync.getRepo instead", collection)
                for r in await self.records_from_repo(collection, after=cursor, reverse=reverse, repo=repo):
                    yield r
                return
            for r in page.records:
                yield r
            if page.cursor is None or page.cursor == cursor:
                return
            cursor = page.cursor
        log.warning("listRecords %s stopped after %d pages", collection, max_pages)

    async def records_from_repo(
        self, collection: str, *, after: str | None = None, reverse: bool = False, repo: str | None = None
    ) -> list[ListedRecord]:
        """A collection's records from the ``sync.getRepo`` CAR, in listRecords order
        (rkey descending, ascending with ``reverse``), only those past the cursor ``after``.
        Values are in CBOR form (bytes and links as raw ``bytes``)."""
        from gelbridge._records.io import records_from_car  # lazy: only this fallback needs it

        did = repo or self.did
        data = await self.get_repo(did)
        try:
            found = records_from_car(data, source=f"sync.getRepo {did}")
        except RecordError as e:
            raise PdsError(str(e)) from None
        rows = [e for e in found if e.uri.collection == collection]  # MST order: rkey ascending
        if after is not None:
            rows = [e for e in rows if (e.uri.rkey > after if reverse else e.uri.rkey < after)]
        if not reverse:
            rows.reverse()
        return [ListedRecord(uri=str(e.uri), cid=str(e.cid), value=e.value) for e in rows]

    async def put_record(
        self,
        collection: str,
        rkey: str,
        record: Mapping[str, Any],
        *,
        swap_record: str | None | _Unset = UNSET,
        validate: bool | None = None,
        must_land: bool = False,
    ) -> PutResult:
        """putRecord. ``swap_record=None`` = create-only, a CID = update-only-if-unchanged.

        Raises :class:`ClaimConflict` when the swap does not match (``InvalidSwap``).
        ``must_land`` (a reply's claim or final write): when the PDS's write budget is
        spent (429), wait until its ``ratelimit-reset`` and write then, however far off
        (up to ``max_budget_wait``), instead of giving up after ``max_rate_limit_wait``.
        """
        body: dict[str, Any] = {
            "repo": self.did,
            "collection": collection,
            "rkey": rkey,
            "record": _bytes_json(dict(record)),
        }
        if not isinstance(swap_record, _Unset):
            body["swapRecord"] = swap_record  # None is sent as JSON null on purpose
        if validate is not None:
            body["validate"] = validate
        data = await self._call(
            "POST", "com.atproto.repo.putRecord", json_body=body, auth="required",
            retry="must_land" if must_land else "write", what=f"putRecord {collection}/{rkey}",
        )
        return PutResult(uri=data["uri"], cid=data["cid"], committed="commit" in data)

    async def create_only(self, collection: str, rkey: str, record: Mapping[str, Any]) -> bool:
        """Write a record only if the key is free: True if created, False if an identical
        record is already there; :class:`ClaimConflict` if a different one is."""
        res = await self.put_record(collection, rkey, record, swap_record=None)
        return res.committed

    async def delete_record(
        self, collection: str, rkey: str, *, swap_record: str | None = None
    ) -> None:
        """deleteRecord (no error if it does not exist); ``swap_record`` = only if unchanged."""
        body: dict[str, Any] = {"repo": self.did, "collection": collection, "rkey": rkey}
        if swap_record is not None:
            body["swapRecord"] = swap_record
        await self._call(
            "POST", "com.atproto.repo.deleteRecord", json_body=body, auth="required", retry="write",
            what=f"deleteRecord {collection}/{rkey}",
        )

    # --- blobs and repo ----------------------------------------------------------------------

    async def upload_blob(self, data: bytes, mime: str = "application/octet-stream") -> dict[str, Any]:
        """uploadBlob; returns the blob ref dict to embed in a record
        (``{"$type": "blob", "ref": {"$link": cid}, "mimeType", "size"}``)."""
        res = await self._call(
            "POST", "com.atproto.repo.uploadBlob", content=bytes(data),
            headers={"Content-Type": mime}, auth="required", retry="write",
        )
        blob = res.get("blob")
        if not isinstance(blob, dict) or "ref" not in blob:
            raise PdsError("PDS answered uploadBlob without a blob ref")
        return blob

    async def get_blob(self, did: str, cid: str, *, max_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> bytes:
        """sync.getBlob, refusing bodies over ``max_bytes``."""
        return await self._get_bytes(
            "com.atproto.sync.getBlob", {"did": did, "cid": cid}, max_bytes, f"getBlob {cid}"
        )

    async def sync_get_record(
        self, collection: str, rkey: str, *, repo: str | None = None, max_bytes: int = 2 * 1024 * 1024
    ) -> bytes | None:
        """sync.getRecord: the record with its proof as a CAR file, or None if it does not
        exist. A fallback for PDSes whose repo.getRecord fails on some records (see
        docs/worker.md, Known limits)."""
        did = repo or self.did
        try:
            return await self._get_bytes(
                "com.atproto.sync.getRecord", {"did": did, "collection": collection, "rkey": rkey},
                max_bytes, f"sync.getRecord {collection}/{rkey}",
            )
        except PdsError as e:
            if e.status in (400, 404):
                return None
            raise

    async def get_repo(self, did: str, *, max_bytes: int = DEFAULT_MAX_REPO_BYTES) -> bytes:
        """sync.getRepo: the whole repo as a CAR file."""
        return await self._get_bytes("com.atproto.sync.getRepo", {"did": did}, max_bytes, f"getRepo {did}")

    # --- transport ----------------------------------------------------------------------------

    async def _get_bytes(self, nsid: str, params: dict[str, Any], max_bytes: int, what: str) -> bytes:
        async def attempt() -> bytes:
            headers = await self._auth_headers("optional")
            async with self._http.stream(
                "GET", f"{self.pds_url}/xrpc/{nsid}", params=params, headers=headers
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise error_from_response(resp, what)
                declared = resp.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > max_bytes:
                    raise PdsError(f"{what} is {declared} bytes, over the {max_bytes}-byte limit")
                buf = bytearray()
                async for chunk in resp.aiter_bytes():
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise PdsError(f"{what} is over the {max_bytes}-byte limit")
                return bytes(buf)

        return await self._with_retries(attempt, what, retry="read")

    async def _auth_headers(self, auth: str | None) -> dict[str, str]:
        if auth is None or (auth == "optional" and self._session is None):
            return {}
        if auth in ("required", "optional"):
            return {"Authorization": f"Bearer {await self._access_token()}"}
        return {"Authorization": f"Bearer {auth}"}  # an explicit token (refreshSession)

    async def _call(
        self,
        method: str,
        nsid: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        auth: str | None = "required",
        retry: str = "read",
        what: str | None = None,
    ) -> dict[str, Any]:
        """One XRPC call with auth, error mapping, ExpiredToken refresh and retries."""
        what = what or nsid
        refreshed = False

        async def attempt() -> dict[str, Any]:
            nonlocal refreshed
            while True:
                if method == "POST" and self.write_guard is not None:
                    self.write_guard()
                h = dict(headers or {})
                h.update(await self._auth_headers(auth))
                kwargs: dict[str, Any] = {"params": params, "headers": h}
                if json_body is not None:
                    kwargs["content"] = json.dumps(json_body, separators=(",", ":")).encode()
                    h["Content-Type"] = "application/json"
                elif content is not None:
                    kwargs["content"] = content
                resp = await self._http.request(method, f"{self.pds_url}/xrpc/{nsid}", **kwargs)
                if method == "POST":
                    self.budget.seen(resp.headers)
                if resp.status_code == 200:
                    points = WRITE_POINTS.get(nsid, 0)
                    self.budget.spent += points
                    if points and self.relay is not None:
                        self.relay.note()
                    if not resp.content:
                        return {}
                    try:  # never RecursionError: a record nested too deep is cut, then rejected alone
                        data = nesting.loads(resp.content)
                    except ValueError:
                        raise PdsError(f"PDS answered {what} with invalid JSON", status=200) from None
                    return data if isinstance(data, dict) else {}
                err = error_from_response(resp, what)
                if (
                    err.error == "ExpiredToken"
                    and auth in ("required", "optional")
                    and self._session is not None
                    and not refreshed
                ):
                    refreshed = True
                    await self.refresh()
                    continue
                raise err

        with tracing.span(f"pds {nsid.rsplit('.', 1)[-1]}", lambda: {"rpc.method": nsid, "server.address": self._host},
                          client=True):
            return await self._with_retries(attempt, what, retry=retry)

    async def _with_retries(self, attempt: Callable[[], Awaitable[_T]], what: str, *, retry: str) -> _T:
        """Run ``attempt`` with bounded exponential backoff.

        ``read``: retry connection errors, timeouts, 5xx and 429. ``write``: retry only
        connect errors (the request never left) and 429 (the PDS did nothing).
        ``must_land``: as ``write``, and a 429 waits for the budget's reset however long
        (up to ``max_budget_wait`` in all), never counting as a failed attempt.
        """
        import httpx

        budget_waited = 0.0
        n = 0  # failed attempts so far
        while True:
            last = n == self._max_retries
            try:
                return await attempt()
            except httpx.TransportError as e:
                safe = retry == "read" or isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                if last or not safe:
                    raise PdsUnavailable(
                        f"cannot reach the PDS at {self.pds_url} for {what} ({type(e).__name__}): "
                        "check that it is running and the URL is right"
                    ) from None
                delay = self._backoff(n)
            except PdsRateLimited as e:
                wait = e.retry_after if e.retry_after is not None else self._backoff(n)
                if retry == "must_land" and budget_waited + wait <= self._max_budget_wait:
                    log.warning("PDS write budget spent on %s; waiting %.0f s for its reset, then writing",
                                what, wait)
                    budget_waited += wait
                    await asyncio.sleep(wait + 0.5)
                    continue  # waiting out the budget is not a failed attempt
                if last or wait > self._max_rate_limit_wait:
                    raise
                delay = wait
            except PdsUnavailable:
                if last or retry != "read":
                    raise
                delay = self._backoff(n)
            log.info("PDS %s failed, retry %d/%d in %.1f s", what, n + 1, self._max_retries, delay)
            n += 1
            await asyncio.sleep(delay)

    def _backoff(self, n: int) -> float:
        return backoff_delay(n + 1, base=self._backoff_base, cap=self._backoff_cap, spread=(0.5, 1.0))

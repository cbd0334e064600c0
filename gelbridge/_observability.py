"""Watching a running gelbridge: health, readiness and Prometheus metrics over HTTP, and
logs as JSON lines.

``[observability] listen = "127.0.0.1:9464"`` (off unless set) serves:

- ``GET /healthz``: 200 while the process runs;
- ``GET /readyz``: 200 once every account is logged in and its event source connected,
  503 before and while a source reconnects (the body says which account waits);
- ``GET /metrics``: the Prometheus text format (``prometheus-client``).

Every metric is labelled by account name (the ``[[accounts]]`` name or the identifier)
and by gelbridge's own words (a status, a tool outcome), never by anything from a record:
no text, no part types, no tool inputs, no provider messages.

``--log-format json`` (or ``[logging] format = "json"``) writes one JSON object per log
line: ``{"ts", "level", "logger", "message"}``, plus the fields a line carries
(:func:`log_fields`: the turn line's timings, points and tokens), from a fixed list of
names (:data:`LOG_FIELDS`) whose values are gelbridge's own numbers and words. The
start-up lines ``gelbridge run`` prints become the same objects (:class:`JsonLines`).
Neither format ever holds content.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import socket
import string
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from http import HTTPStatus
from typing import IO, Any, Protocol

from gelbridge._config import split_listen
from gelbridge._errors import ConfigError
from gelbridge._records.constants import FINAL_STATUSES
from gelbridge._terminal import safe_json

log = logging.getLogger("gelbridge.observability")

_MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000)
_S_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    """The process's metrics, in a registry of their own (several in one test process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # only with [observability] listen

        self.registry = CollectorRegistry()
        self.changes = 0  # counts the turns and tool runs counted: a cached exposition is then stale
        r = self.registry
        self.turns = Counter("gelbridge_turns", "Replies finished, by final status.", ["account", "status"], registry=r)
        self.bridge_ms = Histogram("gelbridge_bridge_overhead_ms", "gelbridge's own work per turn (ms): "
                                   "no model, PDS or tool time.", ["account"], buckets=_MS_BUCKETS, registry=r)
        self.model_s = Histogram("gelbridge_model_latency_seconds", "Model time per turn (s).", ["account"],
                                 buckets=_S_BUCKETS, registry=r)
        self.tool_runs = Counter("gelbridge_tool_runs", "Tool calls answered, by outcome.", ["account", "outcome"],
                                 registry=r)
        self.write_points = Counter("gelbridge_pds_write_points", "PDS write points spent on reply records "
                                    "(claim, progress updates, final write: putRecord, 2 each).", ["account"],
                                    registry=r)
        self.reconnects = Counter("gelbridge_source_reconnects", "Event source reconnects.", ["source"], registry=r)
        self.queue_depth = Gauge("gelbridge_queue_depth", "Claimed replies waiting for a turn slot.", ["account"],
                                 registry=r)
        self.in_flight = Gauge("gelbridge_replies_in_flight", "Turns running now.", ["account"], registry=r)
        self.event_age = Gauge("gelbridge_source_last_event_age_seconds", "Seconds since the event source "
                               "delivered its last event (the firehose/Jetstream lag bound).", ["source"], registry=r)
        self.connected = Gauge("gelbridge_source_connected", "1 while the event source is connected.", ["source"],
                               registry=r)
        self.input_tokens = Counter("gelbridge_model_input_tokens", "Model input tokens of finished turns, by "
                                    "what the provider's prompt cache made of them (uncached, cache_read, "
                                    "cache_write).", ["account", "kind"], registry=r)
        self.output_tokens = Counter("gelbridge_model_output_tokens", "Model output tokens of finished turns "
                                     "(reasoning included, as providers bill it).", ["account"], registry=r)
        self.turn_latency = Histogram("gelbridge_turn_latency_seconds", "End to end per reply (s): from the "
                                      "event's arrival (the commit seen) to the reply's final write.", ["account"],
                                      buckets=_S_BUCKETS, registry=r)
        self.points_remaining = Gauge("gelbridge_pds_write_points_remaining", "The account's PDS write points "
                                      "left in the current window, from the PDS's ratelimit-remaining header "
                                      "(absent while the PDS sends none).", ["account"], registry=r)
        self.relay_events = Gauge("gelbridge_relay_host_events", "Record writes to the PDS host this process "
                                  "made in the relay's window, by window (second, hour, day).", ["host", "window"],
                                  registry=r)

        self.grants = Gauge("gelbridge_key_grants", "The account's key grants (PROTOCOL.md §6), by state "
                            "(honoured, ignored).", ["account", "state"], registry=r)
        self.grants_ignored = Counter("gelbridge_key_grants_ignored", "Key grants found not honoured, by why "
                                      "(lexicon, key_id, scheme, recipient, sealed_key, keyring, conflict).",
                                      ["account", "reason"], registry=r)

    def grant_ignored(self, account: str, reason: str) -> None:
        self.changes += 1
        self.grants_ignored.labels(account, reason).inc()

    def turn_finished(self, account: str, report: Any) -> None:
        """Count a finished turn (a ``worker.turn.TurnReport``)."""
        self.changes += 1
        self.turns.labels(account, str(report.status)).inc()
        t = report.timing
        self.bridge_ms.labels(account).observe(max(0.0, float(t.bridge_ms)))
        self.model_s.labels(account).observe(max(0.0, float(t.model_ms)) / 1000)
        self.write_points.labels(account).inc(int(report.points))  # claim, progress, checkpoints, final
        read, written = t.cached_tokens or 0, t.cache_write_tokens or 0
        if t.input_tokens is not None:
            self.input_tokens.labels(account, "uncached").inc(max(0, t.input_tokens - read - written))
            self.input_tokens.labels(account, "cache_read").inc(read)
            self.input_tokens.labels(account, "cache_write").inc(written)
        if report.output_tokens is not None:
            self.output_tokens.labels(account).inc(max(0, int(report.output_tokens)))
        if report.status in FINAL_STATUSES:  # a final write happened (lost, unfinished: none)
            self.turn_latency.labels(account).observe(max(0.0, float(t.total_ms)) / 1000)

    def tool_outcome(self, account: str, is_error: bool) -> None:
        self.changes += 1
        self.tool_runs.labels(account, "error" if is_error else "ok").inc()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class Readiness:
    """What ``/readyz`` answers: every account logged in and its source connected."""

    def __init__(self, probes: Callable[[], Iterable[tuple[str, bool, bool]]]) -> None:
        self._probes = probes  # (account, logged in, source connected)

    def check(self) -> tuple[bool, str]:
        waiting = [f"{a}: {'not logged in' if not logged else 'source not connected'}"
                   for a, logged, connected in self._probes() if not (logged and connected)]
        return (not waiting, "ready\n" if not waiting else "not ready: " + "; ".join(waiting) + "\n")


@dataclass(frozen=True)
class HttpLimits:
    """What the health/metrics server lets its clients take, so that a flood of them costs
    the turns nothing: ``max_connections`` open at once (past it, the oldest connection still
    sending its head is answered 503 and closed to make room, or, when every one is being
    answered, the new one), ``request_timeout`` seconds a connection lives, from its accept
    to its answer's last byte, and ``max_head`` bytes of request line and headers (414 or 431
    beyond). One request a connection. An unchanged exposition is served again for
    ``metrics_cache`` seconds; a failing accept (out of file descriptors) pauses accepting
    for ``accept_pause`` seconds and is logged at most once every ``warn_every``."""

    max_connections: int = 256
    request_timeout: float = 5.0
    max_head: int = 16 * 1024
    metrics_cache: float = 1.0
    accept_pause: float = 0.5
    warn_every: float = 60.0

    @classmethod
    def of(cls, observability: Any) -> HttpLimits:
        """The limits an ``[observability]`` section sets."""
        return cls(max_connections=observability.max_connections, request_timeout=observability.request_timeout)


#: (method, path) -> (status line's status, content type, body)
Respond = Callable[[str, str], tuple[str, str, bytes]]


class _BadHead(Exception):
    """A request head gelbridge does not read: answered with ``status``, then closed."""

    def __init__(self, status: HTTPStatus) -> None:
        self.status = status


async def read_head(reader: asyncio.StreamReader, max_head: int) -> tuple[str, str]:
    """(method, path) of the request on ``reader``, once its head (request line and headers,
    skipped) is read; :class:`_BadHead` when it is longer than ``max_head`` bytes or is no
    request line. ``reader``'s own limit (``max_head``) bounds what one line may buffer."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _BadHead(HTTPStatus.REQUEST_URI_TOO_LONG) from None
    size = len(line)
    try:
        while (header := await reader.readuntil(b"\n")) not in (b"\r\n", b"\n"):
            size += len(header)
            if size > max_head:
                raise _BadHead(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    except asyncio.LimitOverrunError:
        raise _BadHead(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        raise _BadHead(HTTPStatus.BAD_REQUEST)
    return parts[0], parts[1].split("?", 1)[0]


def _response(status: str, ctype: str, body: bytes, *, head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    return head if head_only else head + body


_BUSY = _response("503 Service Unavailable", "text/plain", b"busy: too many connections\n")
_NO_ACCEPT_ERRORS = (BlockingIOError, InterruptedError, ConnectionAbortedError)  # the next accept may work


class HttpServer:
    """Listening sockets and gelbridge's own accept loop on each: asyncio's (``start_server``)
    holds every connection it accepts, until the process runs out of file descriptors, and
    then logs up to 100 tracebacks a second. Here at most ``max_connections`` are served at
    once, each within ``request_timeout``; a failing accept pauses, said once a while.

    At the cap, the oldest connection still sending its head makes room: clients that hold
    a connection open and send little cannot keep a probe out (its head comes at once)."""

    def __init__(self, sockets: list[socket.socket], respond: Respond, limits: HttpLimits) -> None:
        self.sockets = sockets
        self.limits = limits
        self._respond = respond
        self._loop = asyncio.get_running_loop()
        self._open: set[asyncio.Task[None]] = set()
        self._reading: dict[asyncio.Task[None], None] = {}  # those still reading their head, oldest first
        self._warned_at = -math.inf
        self._accepting = [asyncio.create_task(self._accept(s), name="observability-accept") for s in sockets]

    async def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = await self._loop.sock_accept(sock)
            except _NO_ACCEPT_ERRORS:
                continue
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: the kernel keeps the rest waiting
                self._accept_failed(e)
                await asyncio.sleep(self.limits.accept_pause)
                continue
            if len(self._open) < self.limits.max_connections or self._make_room():
                task = asyncio.create_task(self._serve(conn), name="observability-request")
                self._open.add(task)
                self._reading[task] = None
                task.add_done_callback(functools.partial(self._ended, conn))
            else:
                _refuse(conn)
            await asyncio.sleep(0)  # a connection flood takes turns with everything else

    def _make_room(self) -> bool:
        """End the oldest connection still reading its head; False when none is."""
        if not self._reading:
            return False
        oldest = next(iter(self._reading))
        self._ended(None, oldest)
        oldest.cancel()  # answered 503 (see _serve), closed at its next step
        return True

    def _ended(self, conn: socket.socket | None, task: asyncio.Task[None]) -> None:
        self._open.discard(task)
        self._reading.pop(task, None)
        if conn is not None:
            conn.close()  # nothing once its transport closed it; a task cancelled before it ran

    def _accept_failed(self, e: OSError) -> None:
        now = time.monotonic()
        if now - self._warned_at >= self.limits.warn_every:
            self._warned_at = now
            name = errno.errorcode.get(e.errno or 0, type(e).__name__)
            log.warning("health and metrics: cannot accept a connection (%s: %s; %d open here); new ones wait "
                        "(said at most every %g s)", name, e.strerror, len(self._open), self.limits.warn_every)

    async def _serve(self, conn: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                reader, writer = await asyncio.open_connection(sock=conn, limit=self.limits.max_head)
                writer.write(await self._answer(reader))
                writer.close()
                await writer.wait_closed()  # the answer's last byte sent (or the client gone)
        except (TimeoutError, OSError, EOFError):  # slow, gone, or closed before its head ended
            pass
        except asyncio.CancelledError:  # it made room for a newer one, or the server closes
            if writer is not None and not writer.is_closing():
                writer.write(_BUSY)  # into the socket now, if it takes it: abort() drops the rest
            raise
        finally:
            if writer is not None:
                writer.transport.abort()  # nothing once closed; else no waiting for a slow reader
            else:
                conn.close()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        """The answer to the request on ``reader`` (OSError, EOFError: the client went)."""
        try:
            method, path = await read_head(reader, self.limits.max_head)
        except _BadHead as e:
            return _response(f"{e.status.value} {e.status.phrase}", "text/plain", b"")
        finally:
            if (task := asyncio.current_task()) is not None:
                self._reading.pop(task, None)  # no longer one that makes room
        try:
            return _response(*self._respond(method, path), head_only=method == "HEAD")
        except Exception:  # a bug of ours (a gauge, the readiness probe): said, and the server goes on
            log.exception("health and metrics: cannot answer a request")
            return _response("500 Internal Server Error", "text/plain", b"")

    def close(self) -> None:
        """Stop accepting and end every open connection."""
        for task in (*self._accepting, *self._open):
            task.cancel()
        for s in self.sockets:
            if s.fileno() != -1:
                self._loop.remove_reader(s.fileno())
                s.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._open, return_exceptions=True)


def _refuse(conn: socket.socket) -> None:
    """Answer 503 if the socket takes it now, and close: no task, no buffer, no wait."""
    try:
        conn.send(_BUSY)
    except OSError:
        pass
    conn.close()


def listen_problem(listen: str, e: OSError) -> str:
    """What to do about ``[observability] listen`` when binding it failed with ``e``."""
    where = f"[observability] listen: {listen}"
    if isinstance(e, socket.gaierror):
        return f"{where}: no such host here (use an address of this machine, e.g. 127.0.0.1)"
    if e.errno == errno.EADDRINUSE:
        return f"{where} is in use (another gelbridge? pick another port)"
    if e.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges; pick a port above 1023)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"{where}: not an address of this machine (use 127.0.0.1 or one of its interfaces)"
    return f"{where}: cannot listen there ({e.strerror or type(e).__name__}); pick another address"


async def bind_sockets(listen: str) -> list[socket.socket]:
    """Listening sockets on ``listen`` (``host:port``; port 0 picks one), one an address
    the host has (as ``asyncio.start_server`` binds); :class:`ConfigError` with
    :func:`listen_problem`'s line when that fails."""
    host, port = split_listen(listen)
    socks: list[socket.socket] = []
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)
        for family, addr in dict.fromkeys((info[0], info[4]) for info in infos):
            # a burst waits in the kernel's queue (no descriptor of ours), not for the clients' SYN retries
            socks.append(socket.create_server(addr, family=family, backlog=1024))
    except OSError as e:
        for s in socks:
            s.close()
        raise ConfigError(listen_problem(listen, e)) from None
    for s in socks:
        s.setblocking(False)
    return socks


async def bind_http(listen: str, respond: Respond, limits: HttpLimits | None = None) -> HttpServer:
    """Serve ``respond`` on ``listen`` within ``limits``; bound when this returns."""
    return HttpServer(await bind_sockets(listen), respond, limits or HttpLimits())


async def probe_listen(listen: str) -> str | None:
    """``gelbridge check``: bind ``listen`` and release it at once; the problem, or None."""
    try:
        socks = await bind_sockets(listen)
    except ConfigError as e:
        return str(e)
    for s in socks:
        s.close()
    return None


async def serve_http(listen: str, metrics: Metrics, readiness: Readiness,
                     before_scrape: Callable[[], None] | None = None,
                     limits: HttpLimits | None = None) -> HttpServer:
    """Start the health/metrics server on ``listen`` (``host:port``; port 0 picks one);
    bound when this returns (:class:`ConfigError` when it cannot be)."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    limits = limits or HttpLimits()
    rendered: tuple[int, float, bytes] | None = None  # (metrics.changes, when, exposition)

    def scrape() -> bytes:
        """The exposition, rendered again once a turn moved a metric or ``metrics_cache`` passed."""
        nonlocal rendered
        now = time.monotonic()
        if rendered is None or rendered[0] != metrics.changes or now - rendered[1] >= limits.metrics_cache:
            if before_scrape is not None:
                before_scrape()
            rendered = (metrics.changes, now, metrics.exposition())
        return rendered[2]

    def respond(method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ok, text = readiness.check()
            return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", text.encode()
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, scrape()
        return "404 Not Found", "text/plain", b"not found: /healthz, /readyz, /metrics\n"

    server = await bind_http(listen, respond, limits)
    bound = server.sockets[0].getsockname()
    log.info("health and metrics on http://%s:%s (/healthz, /readyz, /metrics)", bound[0], bound[1])
    return server


#: the fields a log line may carry (:func:`log_fields`), and all the JSON format emits:
#: gelbridge's own labels (account name, record key, status) and numbers, never content
LOG_FIELDS = frozenset({
    "account", "reply", "status", "queue_ms", "read_ms", "bridge_ms", "model_ms", "write_ms", "total_ms",
    "points", "input_tokens", "cached_tokens", "cache_write_tokens", "output_tokens",
})
_Scalar = str | int | float | bool | None


def log_fields(logger: logging.Logger, level: int, template: str, **fields: _Scalar) -> None:
    """Log one line with fields: ``template`` names some of them (``"turn {reply} {status}"``),
    the text format appends the others as ``name=value`` (``queue=61ms`` for ``queue_ms``),
    and the JSON format gives each its own key. Every name must be in :data:`LOG_FIELDS`."""
    unknown = set(fields) - LOG_FIELDS
    if unknown:
        raise ValueError(f"not a log field: {', '.join(sorted(unknown))} (add it to LOG_FIELDS)")
    named = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    brief = template.format(**fields)
    rest = " ".join(_text_field(k, v) for k, v in fields.items() if k not in named and v is not None)
    if logger.isEnabledFor(level):
        logger.log(level, "%s", f"{brief} {rest}" if rest else brief, extra={"brief": brief, "fields": fields},
                   stacklevel=2)


def _text_field(name: str, value: _Scalar) -> str:
    if name.endswith("_ms") and isinstance(value, int | float):
        return f"{name[:-3]}={value:.0f}ms"
    return f"{name}={value}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, and the record's :func:`log_fields` (only names in :data:`LOG_FIELDS`)."""

    def format(self, record: logging.LogRecord) -> str:
        brief = getattr(record, "brief", None)
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": brief if isinstance(brief, str) else record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for k, v in fields.items():
                if k in LOG_FIELDS and (v is None or isinstance(v, str | int | float | bool)):
                    out[k] = round(v, 1) if isinstance(v, float) else v
        if record.exc_info and record.exc_info[0] is not None:
            out["error"] = record.exc_info[0].__name__  # the type only: a message may quote content
        return safe_json(out, indent=None)  # what a terminal could interpret as \u escapes


class JsonLines:
    """A text stream (a :class:`~gelbridge._seams.Printer`) that writes each line printed
    to it as one :class:`JsonFormatter` object on ``stream``: ``gelbridge run``'s start-up
    lines, "ready" and its stop notice with ``--log-format json``. Blank lines are dropped."""

    def __init__(self, stream: IO[str], logger: str = "gelbridge.run", level: int = logging.INFO) -> None:
        self._stream = stream
        self._logger = logger
        self._level = level
        self._pending = ""
        self._fmt = JsonFormatter()

    def write(self, s: str, /) -> int:
        *lines, self._pending = (self._pending + s).split("\n")
        for line in lines:
            if line.strip():
                rec = logging.LogRecord(self._logger, self._level, "", 0, line.strip(), (), None)
                self._stream.write(self._fmt.format(rec) + "\n")
        return len(s)

    def flush(self) -> None:
        self._stream.flush()


@dataclass(frozen=True)
class AccountGauges:
    """What the health server reads of one served account, at one moment."""

    label: str
    did: str
    logged_in: bool
    queued: int = 0  # turns waiting for a slot
    running: int = 0
    points_remaining: int | None = None  # the PDS write budget it last stated
    relay: RelayCounts | None = None  # this process's events to the account's PDS host
    grants: tuple[int, int] | None = None  # key grants honoured, ignored (None: no bridge key)


class RelayCounts(Protocol):
    """A relay budget's view for the gauges (``gelbridge._pds.RelayBudget``)."""

    host: str

    def counts(self) -> Mapping[str, int]: ...


class WatchedSource(Protocol):
    """What the health server reads of an event source (``gelbridge._worker.sources.EventSource``)."""

    @property
    def dids(self) -> AbstractSet[str]: ...

    connected: asyncio.Event
    last_event_at: float | None

    @property
    def reconnects(self) -> int: ...


class Watched:
    """What the health/metrics server looks at in a running process: its accounts
    (:class:`AccountGauges`) and event sources (by name). Every process (one account,
    many, a fleet member, a library :class:`~gelbridge._bridge.Bridge`) hands over the same
    two views (the runtime's), so ``/readyz`` and the gauges mean the same in all.

    ``sources`` returns None while the process follows no source of its own (a library
    consumer feeds the :class:`~gelbridge._bridge.Bridge`): then logged in is ready."""

    def __init__(self, metrics: Metrics, accounts: Callable[[], Iterable[AccountGauges]],
                 sources: Callable[[], Mapping[str, WatchedSource] | None]) -> None:
        self.metrics = metrics
        self._accounts = accounts
        self._sources = sources
        self._seen_reconnects: dict[str, int] = {}

    def probes(self) -> list[tuple[str, bool, bool]]:
        """(account, logged in, its source connected) for every account."""
        followed = self._sources()
        sources = list(followed.values()) if followed is not None else []
        out = []
        for a in self._accounts():
            mine = [s for s in sources if a.did in s.dids]
            connected = followed is None or (bool(mine) and all(s.connected.is_set() for s in mine))
            out.append((a.label, a.logged_in, connected))
        return out

    def before_scrape(self) -> None:
        """Bring the gauges up to date (and the reconnect counter: sources count their own)."""
        m = self.metrics
        now = time.monotonic()
        relays: dict[str, RelayCounts] = {}
        for a in self._accounts():
            m.queue_depth.labels(a.label).set(a.queued)
            m.in_flight.labels(a.label).set(a.running)
            if a.points_remaining is not None:
                m.points_remaining.labels(a.label).set(a.points_remaining)
            if a.relay is not None:
                relays[a.relay.host] = a.relay
            if a.grants is not None:
                m.grants.labels(a.label, "honoured").set(a.grants[0])
                m.grants.labels(a.label, "ignored").set(a.grants[1])
        for host, relay in relays.items():
            for window, n in relay.counts().items():
                m.relay_events.labels(host, window).set(n)
        for name, src in (self._sources() or {}).items():
            m.connected.labels(name).set(1 if src.connected.is_set() else 0)
            seen = self._seen_reconnects.get(name, 0)
            if src.reconnects > seen:
                m.reconnects.labels(name).inc(src.reconnects - seen)
            m.reconnects.labels(name).inc(0)  # present from the first scrape
            self._seen_reconnects[name] = src.reconnects
            if src.last_event_at is not None:
                m.event_age.labels(name).set(now - src.last_event_at)

    http: HttpServer | None = None

    async def bind(self, listen: str, limits: HttpLimits = HttpLimits()) -> None:
        """Listen on ``listen`` now, serving ``/healthz``, ``/readyz``, ``/metrics``
        (:class:`ConfigError` with one line when it cannot): before "ready"."""
        if self.http is None:
            self.http = await serve_http(listen, self.metrics, Readiness(self.probes), self.before_scrape, limits)

    async def serve(self, listen: str) -> None:
        """:meth:`bind` (if not bound yet), then serve until cancelled; closed at the end."""
        await self.bind(listen)
        try:
            await asyncio.Event().wait()
        finally:
            self.close()

    def close(self) -> None:
        if self.http is not None:
            self.http.close()


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

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
import logging
import socket
import string
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import IO, Any

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

    def turn_finished(self, account: str, report: Any) -> None:
        """Count a finished turn (a ``worker.turn.TurnReport``)."""
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


_Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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


async def bind_http(listen: str, handle: _Handler) -> asyncio.Server:
    """Listen on ``listen`` (``host:port``; port 0 picks one) now; :class:`ConfigError`
    with :func:`listen_problem`'s line when that fails."""
    host, port = split_listen(listen)
    try:
        return await asyncio.start_server(handle, host, port)
    except OSError as e:
        raise ConfigError(listen_problem(listen, e)) from None


async def probe_listen(listen: str) -> str | None:
    """``gelbridge check``: bind ``listen`` and release it at once; the problem, or None."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    try:
        server = await bind_http(listen, refuse)
    except ConfigError as e:
        return str(e)
    server.close()
    await server.wait_closed()
    return None


async def serve_http(listen: str, metrics: Metrics, readiness: Readiness,
                     before_scrape: Callable[[], None] | None = None) -> asyncio.Server:
    """Start the health/metrics server on ``listen`` (``host:port``; port 0 picks one);
    bound when this returns (:class:`ConfigError` when it cannot be)."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST


    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass  # headers: not needed
            parts = line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/healthz":
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path == "/readyz":
                ok, text = readiness.check()
                status, ctype, body = ("200 OK" if ok else "503 Service Unavailable"), "text/plain", text.encode()
            elif path == "/metrics":
                if before_scrape is not None:
                    before_scrape()
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, metrics.exposition()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found: /healthz, /readyz, /metrics\n"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode()
            writer.write(head + (body if parts[:1] != ["HEAD"] else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await bind_http(listen, handle)
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


class Watched:
    """What the health/metrics server looks at in a running process: its accounts (by
    label: their workers) and event sources (by name). ``gelbridge run`` with one account
    and the :class:`~gelbridge._bridge.Bridge` with many hand over the same two views, so
    ``/readyz`` and the gauges mean the same in both.

    A source has ``connected`` (an ``asyncio.Event``), ``reconnects``,
    ``last_event_at`` (``time.monotonic()``) and ``dids`` (the accounts it carries).
    ``sources`` returns None while the process follows no source of its own (a library
    consumer feeds the :class:`~gelbridge._bridge.Bridge`): then logged in is ready."""

    def __init__(self, metrics: Metrics, accounts: Callable[[], Iterable[tuple[str, Any]]],
                 sources: Callable[[], Mapping[str, Any] | None]) -> None:
        self.metrics = metrics
        self._accounts = accounts
        self._sources = sources
        self._seen_reconnects: dict[str, int] = {}

    def probes(self) -> list[tuple[str, bool, bool]]:
        """(account, logged in, its source connected) for every account."""
        followed = self._sources()
        sources = list(followed.values()) if followed is not None else []
        out = []
        for label, w in self._accounts():
            started = bool(getattr(w, "started", False))
            pds = getattr(w, "pds", None) if started else None
            logged_in = started and pds is not None and pds.session is not None
            mine = [s for s in sources if w.did in getattr(s, "dids", ())]
            connected = followed is None or (bool(mine) and all(s.connected.is_set() for s in mine))
            out.append((label, logged_in, connected))
        return out

    def before_scrape(self) -> None:
        """Bring the gauges up to date (and the reconnect counter: sources count their own)."""
        m = self.metrics
        now = time.monotonic()
        for label, w in self._accounts():
            sched = getattr(w, "scheduler", None)
            if sched is not None:
                m.queue_depth.labels(label).set(sched.queued)
                m.in_flight.labels(label).set(sched.running)
            if not getattr(w, "started", False):
                continue
            budget = getattr(getattr(w, "pds", None), "budget", None)
            if budget is not None and budget.remaining is not None:
                m.points_remaining.labels(label).set(budget.remaining)
        relays: dict[str, Any] = {}
        for _label, w in self._accounts():
            relay = getattr(getattr(w, "pds", None), "relay", None) if getattr(w, "started", False) else None
            if relay is not None:
                relays[relay.host] = relay
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

    http: asyncio.Server | None = None

    async def bind(self, listen: str) -> None:
        """Listen on ``listen`` now, serving ``/healthz``, ``/readyz``, ``/metrics``
        (:class:`ConfigError` with one line when it cannot): before "ready"."""
        if self.http is None:
            self.http = await serve_http(listen, self.metrics, Readiness(self.probes), self.before_scrape)

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

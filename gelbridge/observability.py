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
line: ``{"ts", "level", "logger", "message"}``. The messages are the same as the text
format's, which never hold content.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("gelbridge.observability")

#: What a reply record write costs on the reference PDS (``putRecord`` is always 2).
PUT_RECORD_POINTS = 2

_MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000)
_S_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    """The process's metrics, in a registry of their own (several in one test process)."""

    def __init__(self) -> None:
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
                                    "(create/update of a record via putRecord: 2 each).", ["account"], registry=r)
        self.reconnects = Counter("gelbridge_source_reconnects", "Event source reconnects.", ["source"], registry=r)
        self.queue_depth = Gauge("gelbridge_queue_depth", "Claimed replies waiting for a turn slot.", ["account"],
                                 registry=r)
        self.in_flight = Gauge("gelbridge_replies_in_flight", "Turns running now.", ["account"], registry=r)
        self.event_age = Gauge("gelbridge_source_last_event_age_seconds", "Seconds since the event source "
                               "delivered its last event (the firehose lag bound).", ["source"], registry=r)

    def turn_finished(self, account: str, report: Any) -> None:
        """Count a finished turn (a ``worker.turn.TurnReport``)."""
        self.turns.labels(account, str(report.status)).inc()
        t = report.timing
        self.bridge_ms.labels(account).observe(max(0.0, float(t.bridge_ms)))
        self.model_s.labels(account).observe(max(0.0, float(t.model_ms)) / 1000)
        # the final write, plus the progress updates and checkpoints (the claim is counted apart)
        self.write_points.labels(account).inc(PUT_RECORD_POINTS * (1 + int(report.progress_writes)))

    def claimed(self, account: str) -> None:
        self.write_points.labels(account).inc(PUT_RECORD_POINTS)

    def tool_outcome(self, account: str, is_error: bool) -> None:
        self.tool_runs.labels(account, "error" if is_error else "ok").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Readiness:
    """What ``/readyz`` answers: every account logged in and its source connected."""

    def __init__(self, probes: Callable[[], Iterable[tuple[str, bool, bool]]]) -> None:
        self._probes = probes  # (account, logged in, source connected)

    def check(self) -> tuple[bool, str]:
        waiting = [f"{a}: {'not logged in' if not logged else 'source not connected'}"
                   for a, logged, connected in self._probes() if not (logged and connected)]
        return (not waiting, "ready\n" if not waiting else "not ready: " + "; ".join(waiting) + "\n")


async def serve_http(listen: str, metrics: Metrics, readiness: Readiness,
                     before_scrape: Callable[[], None] | None = None) -> asyncio.AbstractServer:
    """Start the health/metrics server on ``listen`` (``host:port``; port 0 picks one)."""
    host, _, port = listen.rpartition(":")

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

    server = await asyncio.start_server(handle, host or "127.0.0.1", int(port or 0))
    bound = server.sockets[0].getsockname()
    log.info("health and metrics on http://%s:%s (/healthz, /readyz, /metrics)", bound[0], bound[1])
    return server


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            out["error"] = record.exc_info[0].__name__  # the type only: a message may quote content
        return json.dumps(out, ensure_ascii=False)


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

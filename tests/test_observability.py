"""What an operator reads: log lines with fields (text and JSON), start-up lines as JSON,
the metrics a finished turn moves, every metric documented, and the health server's
address checked before anything starts."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from gelbridge._config import load_config
from gelbridge._errors import ConfigError
from gelbridge._observability import (
    LOG_FIELDS,
    HttpLimits,
    JsonFormatter,
    JsonLines,
    Metrics,
    Readiness,
    Watched,
    bind_http,
    log_fields,
    probe_listen,
    serve_http,
)
from gelbridge._state import TurnTiming
from gelbridge._worker.turn import TurnOutcome, TurnReport

DOCS = Path(__file__).resolve().parents[1] / "docs" / "worker.md"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[tuple[logging.Logger, Kept]]:
    logger = logging.getLogger("gelbridge.test.observability")
    handler = Kept()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def test_a_line_with_fields_reads_as_today_in_text_and_gives_each_field_its_own_key_in_json(
    kept: tuple[logging.Logger, Kept],
) -> None:
    logger, handler = kept
    log_fields(logger, logging.INFO, "turn {reply} {status}", reply="3mk.r0", status="awaitingApproval",
               queue_ms=61.26, read_ms=18.0, model_ms=11.4, points=4, input_tokens=None, output_tokens=7,
               account="alice")
    [rec] = handler.records
    assert rec.getMessage() == ("turn 3mk.r0 awaitingApproval queue=61ms read=18ms model=11ms points=4 "
                                "output_tokens=7 account=alice")
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["message"] == "turn 3mk.r0 awaitingApproval" and obj["level"] == "info"
    assert obj["reply"] == "3mk.r0" and obj["status"] == "awaitingApproval" and obj["account"] == "alice"
    assert obj["queue_ms"] == 61.3 and obj["points"] == 4 and obj["output_tokens"] == 7
    assert obj["input_tokens"] is None  # said as not known, not left out


def test_only_listed_fields_are_logged_and_emitted(kept: tuple[logging.Logger, Kept]) -> None:
    logger, handler = kept
    with pytest.raises(ValueError, match="not a log field: text"):
        log_fields(logger, logging.INFO, "turn {reply}", reply="3mk.r0", text="hello")
    assert handler.records == []
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    rec.fields = {"reply": "3mk.r0", "prompt": "sealed words", "message": "overwritten?", "points": [1]}
    obj = json.loads(JsonFormatter().format(rec))
    assert obj == {"ts": obj["ts"], "level": "info", "logger": "x", "message": "m", "reply": "3mk.r0"}
    assert "message" not in LOG_FIELDS and "ts" not in LOG_FIELDS


def test_a_json_line_holds_nothing_a_terminal_would_obey() -> None:
    # a handle the PDS gave, a path: text a line may name, with C1 and bidi controls in it
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "handle %s", ("al\x1b]0;t\x07\x9b2J\u202e.test",), None)
    line = JsonFormatter().format(rec)
    assert not {"\x1b", "\x07", "\x9b", "\u202e"} & set(line)
    assert "\\u001b]0;t\\u0007\\u009b2J\\u202e" in line and json.loads(line)["message"] == rec.getMessage()


def test_printed_lines_become_one_json_object_each() -> None:
    stream = io.StringIO()
    out = JsonLines(stream)
    print("gelbridge worker for alice.test (did:plc:a)", file=out)
    print("  source     jetstream wss://js.example (wantedDids did:plc:a; cursor 1)", file=out, flush=True)
    out.write("\nSIGTERM: stop")  # a notice that starts with a blank line, written in two pieces
    assert len(stream.getvalue().splitlines()) == 2
    out.write("ping (grace 2 s)...\n")
    objs = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [o["message"] for o in objs] == [
        "gelbridge worker for alice.test (did:plc:a)",
        "source     jetstream wss://js.example (wantedDids did:plc:a; cursor 1)",
        "SIGTERM: stopping (grace 2 s)...",
    ]
    assert {o["logger"] for o in objs} == {"gelbridge.run"} and {o["level"] for o in objs} == {"info"}


def report(status: TurnOutcome, *, total: float, output: int | None) -> TurnReport:
    t = TurnTiming("3mk.r0", "did:plc:a", str(status), queue_ms=total / 4, bridge_ms=total / 4, model_ms=total / 4,
                   write_ms=total / 4, read_ms=0.0, points=4, input_tokens=100, cached_tokens=60)
    return TurnReport(status, None, t, 1, points=4, output_tokens=output)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_finished_turn_counts_its_output_tokens_and_its_time_from_commit_to_final_write() -> None:
    m = Metrics()
    m.turn_finished("alice", report(TurnOutcome.COMPLETE, total=3000.0, output=42))
    m.turn_finished("alice", report(TurnOutcome.AWAITING_APPROVAL, total=400.0, output=8))
    m.turn_finished("alice", report(TurnOutcome.UNFINISHED, total=9000.0, output=None))  # no final write
    got = samples(m)
    acct = (("account", "alice"),)
    assert got[("gelbridge_model_output_tokens_total", acct)] == 50
    assert got[("gelbridge_turn_latency_seconds_count", acct)] == 2
    assert got[("gelbridge_turn_latency_seconds_sum", acct)] == pytest.approx(3.4)
    assert got[("gelbridge_turn_latency_seconds_bucket", (*acct, ("le", "0.5")))] == 1
    assert got[("gelbridge_model_input_tokens_total", (*acct, ("kind", "cache_read")))] == 180


def documented_metrics() -> dict[str, tuple[str, list[str]]]:
    """The metrics table of docs/worker.md: name -> (type, labels)."""
    out = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`gelbridge_\w+`", cells[0]):
            out[cells[0].strip("`")] = (cells[1], re.findall(r"`(\w+)`", cells[2]))
    return out


def test_every_metric_is_documented_with_its_type_and_labels_and_nothing_else_is() -> None:
    exposed = {}
    for metric in vars(Metrics()).values():
        if isinstance(metric, MetricWrapperBase):
            name = metric._name + ("_total" if metric._type == "counter" else "")
            exposed[name] = (metric._type, list(metric._labelnames))
    assert len(exposed) >= 15
    assert documented_metrics() == exposed


async def test_a_taken_address_is_found_by_the_probe_and_refused_by_the_server_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        problem = await probe_listen(f"127.0.0.1:{port}")
        assert problem == (f"[observability] listen: 127.0.0.1:{port} is in use (another gelbridge? "
                           "pick another port)")

        async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        with pytest.raises(ConfigError) as err:
            await bind_http(f"127.0.0.1:{port}", nothing)
        assert str(err.value) == problem
    assert await probe_listen(f"127.0.0.1:{port}") is None  # released: free again
    assert await probe_listen("127.0.0.1:0") is None
    assert "no such host" in (await probe_listen("no-such-host.invalid:9464") or "")


# --- the listener under attack: size, time and connection bounds --------------------------

async def started(limits: HttpLimits = HttpLimits(), *, metrics: Metrics | None = None,
                  before_scrape: Callable[[], None] | None = None) -> tuple[Any, int]:
    server = await serve_http("127.0.0.1:0", metrics or Metrics(), Readiness(lambda: []), before_scrape, limits)
    return server, server.sockets[0].getsockname()[1]


async def stopped(server: Any) -> None:
    server.close()
    await asyncio.wait_for(server.wait_closed(), 10)


async def get(port: int, path: str = "/healthz", timeout: float = 5.0) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def healthy_within(port: int, seconds: float) -> bool:
    """Whether ``/healthz`` answers 200 within ``seconds``, asked again every 0.2 s (as a
    probe does: the first tries may meet a full server that has not yet seen its flood
    close, and be answered 503)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, TimeoutError, IndexError, ValueError):
            if (await get(port, timeout=2))[0] == 200:
                return True
        await asyncio.sleep(0.2)
    return False


async def answered_or_closed(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What the server sent before it closed (b"" for a bare close or a reset); None while
    it still holds the connection after ``seconds``."""
    try:
        return await asyncio.wait_for(reader.read(), seconds)
    except ConnectionError:
        return b""
    except TimeoutError:
        return None


def tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_request_line_of_200_kb_is_answered_414_or_closed_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server, port = await started()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        got = await answered_or_closed(reader, 10)
        writer.close()
        assert got is not None and (got == b"" or got.startswith(b"HTTP/1.1 414 ")), got
        assert (await get(port))[0] == 200  # and it goes on serving
    finally:
        await stopped(server)
    assert tracebacks(caplog.records) == []


async def test_a_header_flood_is_cut_after_a_small_bound(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server, port = await started()
    flood, sent, cut = b"".join(b"X-Flood-%d: %s\r\n" % (i, b"b" * 1000) for i in range(64)), 0, False
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        deadline = time.monotonic() + 30
        while sent < 64 * 2**20 and time.monotonic() < deadline:
            try:
                writer.write(flood)
                await writer.drain()
            except ConnectionError:
                cut = True
                break
            sent += len(flood)
        writer.close()
        assert (await get(port))[0] == 200
    finally:
        await stopped(server)
    # what the kernel's buffers took on both sides (a few MiB), never the 64 MiB offered
    assert cut and sent < 16 * 2**20, sent
    assert tracebacks(caplog.records) == []


async def test_a_slow_client_is_closed_after_the_request_deadline() -> None:
    server, port = await started(HttpLimits(request_timeout=1.0))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        t0, ended = time.monotonic(), None
        for i in range(40):  # a header line every 0.25 s, for 10 s at most
            try:
                writer.write(b"X-Slow-%d: 1\r\n" % i)
                await writer.drain()
            except ConnectionError:
                ended = time.monotonic() - t0
                break
            if await answered_or_closed(reader, 0.25) is not None:
                ended = time.monotonic() - t0
                break
        writer.close()
        assert ended is not None and ended < 4, ended  # 1 s, with room for a loaded machine
        assert (await get(port))[0] == 200
    finally:
        await stopped(server)


async def test_past_the_configured_cap_the_oldest_silent_client_makes_room_so_a_probe_is_answered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gelbridge.toml"
    path.write_text('[observability]\nlisten = "127.0.0.1:0"\nmax_connections = 4\nrequest_timeout = 30\n')
    obs = load_config(path, env={}).observability
    watched = Watched(Metrics(), lambda: [], lambda: None)
    await watched.bind(obs.listen or "", HttpLimits.of(obs))
    assert watched.http is not None
    port = watched.http.sockets[0].getsockname()[1]
    conns = []
    try:
        for _ in range(7):  # silent clients, one after the other
            conns.append(await asyncio.open_connection("127.0.0.1", port))
            await asyncio.sleep(0.05)
        ends = await asyncio.gather(*(answered_or_closed(r, 1) for r, _ in conns))
        assert [e is None for e in ends] == [False] * 3 + [True] * 4, ends  # 4 held: the newest
        assert all(e == b"" or (e or b"").startswith(b"HTTP/1.1 503 ") for e in ends[:3]), ends
        # every slot is held by a silent client, and a probe is answered at once
        assert (await get(port, timeout=2))[0] == 200
        for _, w in conns:
            w.close()
        assert await healthy_within(port, 10)
    finally:
        watched.close()


async def test_a_scrape_flood_renders_the_metrics_once_a_second_and_a_finished_turn_at_once() -> None:
    renders: list[float] = []
    m = Metrics()
    server, port = await started(metrics=m, before_scrape=lambda: renders.append(time.monotonic()))
    try:
        t0 = time.monotonic()
        pages = [(await get(port, "/metrics"))[1] for _ in range(30)]
        assert len(renders) <= 2 + int(time.monotonic() - t0)  # once a second
        assert len(set(pages)) <= len(renders)
        m.turn_finished("alice", report(TurnOutcome.COMPLETE, total=300.0, output=3))
        status, page = await get(port, "/metrics")
        assert status == 200 and b'gelbridge_turns_total{account="alice",status="complete"} 1.0' in page
    finally:
        await stopped(server)


#: a process serving /healthz with the default limits under RLIMIT_NOFILE = argv[1]; on
#: "dial HOST PORT N" it opens N outgoing connections (as a turn would) and says how many
CHILD = """
import asyncio, logging, resource, socket, sys
nofile = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from gelbridge._observability import Metrics, Readiness, serve_http

async def main():
    server = await serve_http("127.0.0.1:0", Metrics(), Readiness(lambda: []))
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    while (cmd := (await loop.run_in_executor(None, sys.stdin.readline)).split()) and cmd[0] == "dial":
        opened = []
        try:
            for _ in range(int(cmd[3])):
                opened.append(socket.create_connection((cmd[1], int(cmd[2])), timeout=5))
            print(f"dialed {len(opened)}", flush=True)
        except OSError as e:
            print(f"dialed {len(opened)}, then {e.errno}", flush=True)
        for s in opened:
            s.close()

asyncio.run(main())
"""


class Child:
    def __init__(self, tmp_path: Path, nofile: int) -> None:
        self.log = tmp_path / "child.log"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        with self.log.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(nofile)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env)

    async def line(self) -> str:
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 30)).strip()

    async def ask(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return await self.line()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def stop(self) -> str:
        with contextlib.suppress(OSError):
            self.proc.communicate("quit\n", timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return self.log.read_text()


async def open_many(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` connections that send nothing (those the listener's backlog cannot take fail),
    opened 100 at a time so a loaded machine's SYN queue is not what the test measures."""
    got: list[object] = []
    for i in range(0, n, 100):
        got += await asyncio.gather(*(asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
                                      for _ in range(min(100, n - i))), return_exceptions=True)
    return [c for c in got if isinstance(c, tuple)]


async def test_past_the_default_cap_connections_are_closed_at_once_and_the_worker_keeps_its_descriptors(
    tmp_path: Path,
) -> None:
    child = Child(tmp_path, nofile=1024)  # the worker's limit in the issue
    outside = socket.create_server(("127.0.0.1", 0), backlog=256)  # where the worker dials out
    flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        port = int(await child.line())
        flood = await open_many(port, 1100)
        # meanwhile the worker opens connections, as a turn does (to the PDS, the model)
        assert await child.ask(f"dial 127.0.0.1 {outside.getsockname()[1]} 100") == "dialed 100"
        ends = await asyncio.gather(*(answered_or_closed(r, 2) for r, _ in flood))
        held = sum(e is None for e in ends)
        assert len(flood) >= 1000 and held <= 256, (len(flood), held)
        for _, w in flood:
            w.close()
        assert await healthy_within(port, 10)
    finally:
        outside.close()
        log = child.stop()
    assert "Traceback" not in log, log[:2000]


async def test_out_of_descriptors_the_listener_logs_one_line_does_not_spin_and_recovers(tmp_path: Path) -> None:
    child = Child(tmp_path, nofile=64)  # fewer than the cap: accept() itself fails (EMFILE)
    try:
        port = int(await child.line())
        flood = await open_many(port, 200)
        cpu = child.cpu_seconds()
        await asyncio.sleep(3)
        cpu = child.cpu_seconds() - cpu
        for _, w in flood:
            w.close()
        assert await healthy_within(port, 15)
    finally:
        log = child.stop()
    assert "Traceback" not in log, log[:2000]
    said = [line for line in log.splitlines() if "accept" in line]
    assert len(said) == 1 and "EMFILE" in said[0], log[:2000]
    assert cpu < 1.0, cpu

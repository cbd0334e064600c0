"""What an operator reads: log lines with fields (text and JSON), start-up lines as JSON,
the metrics a finished turn moves, every metric documented, and the health server's
address checked before anything starts."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from gelbridge._errors import ConfigError
from gelbridge._observability import (
    LOG_FIELDS,
    JsonFormatter,
    JsonLines,
    Metrics,
    bind_http,
    log_fields,
    probe_listen,
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

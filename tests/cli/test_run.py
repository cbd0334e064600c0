"""``gelbridge status`` as an operator reads it: the turns, in-flight and error tables keep
their columns aligned whatever the status (``awaitingApproval`` is 16 characters)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._config import load_config
from gelbridge._state import SqliteStore, TurnTiming
from gelbridge._worker.service import session_key

DID = "did:plc:statusaligned"


def columns(line: str) -> list[tuple[int, int]]:
    """(start, end) of each cell: cells are apart by two spaces or more."""
    return [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", line)]


async def fill(cfg: Path) -> None:
    settings = load_config(cfg)
    with SqliteStore.open_dir(settings.state_dir) as store:
        await store.save_session(session_key(settings), {"did": DID, "handle": "al.test",
                                                         "pds": "http://127.0.0.1:9"})
        now = time.time()
        await store.record_turn(TurnTiming("3mold.r0", DID, "complete", 5, 1, 2, 3, at=now - 30))  # no read, no points
        await store.record_turn(TurnTiming("3mslow.r12", DID, "error", 61234.4, 4, 120000, 9, at=now - 20,
                                           read_ms=18, points=12))
        await store.record_turn(TurnTiming("3mappr.r0", DID, "awaitingApproval", 61, 29, 11, 60, at=now - 10,
                                           read_ms=18, points=4))
        await store.record_claim(DID, "3mwait", 0, "3mwait.r0", "3mconv")
        await store.record_claim(DID, "3mlonger", 3, "3mlonger.r3", "3mconv")
        await store.record_error("interrupted", account=DID, record_key="3mslow.r12", where="turn")
        await store.record_error("a_kind_longer_than_sixteen", account=DID, record_key=None, where="backfill")


def test_status_keeps_every_table_aligned_with_awaiting_approval_rows(tmp_path: Path) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text('[account]\npds = "http://127.0.0.1:9"\nidentifier = "al.test"\n[state]\ndir = "state"\n')
    asyncio.run(fill(cfg))
    res = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    at = lines.index("  recent turns (3), times in ms")
    table = lines[at + 1:at + 5]
    assert table[0].split() == ["reply", "status", "queue", "read", "bridge", "model", "write", "total", "points"]
    assert [row.split()[1] for row in table[1:]] == ["awaitingApproval", "error", "complete"]
    cells = [columns(row) for row in table]
    assert {len(c) for c in cells} == {9}
    for i in range(9):  # reply and status start together; the numbers end together, under their names
        edge = 0 if i < 2 else 1
        assert len({c[i][edge] for c in cells}) == 1, (i, table)
    assert table[3].split()[3] == "-" and table[3].split()[8] == "-"  # not measured then
    flight = [row for row in lines if row.startswith("    3mwait.r0") or row.startswith("    3mlonger.r3")]
    assert len(flight) == 2 and len({columns(row)[1][0] for row in flight}) == 1
    at = next(i for i, row in enumerate(lines) if row.startswith("recent errors (2)"))
    errors = [columns(row) for row in lines[at + 1:at + 3]]
    assert [len(c) for c in errors] == [4, 4] and len({c[2][0] for c in errors}) == 1


def test_status_shows_what_the_state_holds_never_obeys_it(tmp_path: Path) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text('[account]\npds = "http://127.0.0.1:9"\nidentifier = "al.test"\n[state]\ndir = "state"\n')
    hostile = "\x1b]0;owned\x07\x9b2J\u202e"

    async def fill_hostile() -> None:  # what the PDS and the records it read said
        settings = load_config(cfg)
        with SqliteStore.open_dir(settings.state_dir) as store:
            await store.save_session(session_key(settings), {"did": DID, "handle": f"al{hostile}.test",
                                                             "pds": "http://127.0.0.1:9"})
            await store.record_claim(DID, f"3mwait{hostile}", 0, f"3mwait{hostile}.r0", "3mconv")
            await store.record_error("interrupted", account=DID, record_key=f"3mk{hostile}.r0", where="turn")  # where: a label, checked

    asyncio.run(fill_hostile())
    for args in ([], ["--json"]):
        res = CliRunner().invoke(app, ["status", "--config", str(cfg), *args])
        assert res.exit_code == 0, res.output
        assert not [raw for raw in (b"\x1b", b"\x07", "\x9b".encode(), "\u202e".encode()) if raw in res.stdout_bytes]
    assert json.loads(res.output)["accounts"][0]["handle"] == f"al{hostile}.test"  # --json: the same value
    shown = "␛]0;owned␇<U+009B>2J<U+202E>"
    text = CliRunner().invoke(app, ["status", "--config", str(cfg)]).output
    assert f": al{shown}.test (did:plc:statusaligned)" in text
    assert f"    3mwait{shown}.r0  pending" in text and f"  interrupted  3mk{shown}.r0  turn" in text

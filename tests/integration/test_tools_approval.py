"""Tools and human approval, end to end: the real local PDS, a real stdio MCP server
(tests/integration/mcp_counting_server.py, which counts executions in a file so "exactly
once" holds across processes) and the local model server.

Every test also checks the histories the model received: in every request, every tool
call id of an assistant message has exactly one tool result (PROTOCOL.md §5).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer, RecordedRequest, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import PlainContent, TextPart, ToolApprovalPart, ToolCallPart, ToolResultPart, new_tid
from gelbridge._sealing import Keyring
from gelbridge._state import DB_FILENAME, CallRef, SqliteStore, StateStore, call_key

from .conftest import App, make_settings, running_worker, text_of
from .worker_proc import COUNTING_SERVER, WorkerProc, counting_mcp_toml, start_worker, write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

TOOLS = ["mcp_j_lookup", "mcp_j_note", "mcp_j_gate"]
WAIT = 90.0  # generous bound for a reply on a loaded machine


# --- helpers ---------------------------------------------------------------------------------


def mcp_servers(count_file: Path, gate_file: Path) -> dict[str, Any]:
    return {"servers": {"j": {
        "command": [sys.executable, COUNTING_SERVER],
        "env": {"COUNT_FILE": str(count_file), "GATE_FILE": str(gate_file)},
        "approval": "always",
        "startup_timeout": 60,
        "tools": {"lookup": {"approval": "never"}},
    }}}


def executions(count_file: Path) -> list[list[str]]:
    """One ``[tool, text, token]`` per execution the MCP server performed."""
    if not count_file.exists():
        return []
    return [line.split(" ") for line in count_file.read_text().splitlines() if line]


def assert_one_result_per_call(requests: Sequence[RecordedRequest]) -> int:
    """In every chat request: each tool call id appears in exactly one assistant message,
    has exactly one tool result, and that result comes after the call. Returns how many
    requests were checked."""
    checked = 0
    for n, req in enumerate(requests):
        body = req.body
        if not isinstance(body, dict) or "messages" not in body:
            continue
        seen_calls: list[str] = []
        results: list[str] = []
        for m in body["messages"]:
            if m.get("role") == "assistant":
                seen_calls += [tc["id"] for tc in m.get("tool_calls") or []]
            elif m.get("role") == "tool":
                assert m["tool_call_id"] in seen_calls, f"request {n}: result before/without its call {m['tool_call_id']}"
                results.append(m["tool_call_id"])
        assert len(seen_calls) == len(set(seen_calls)), f"request {n}: a call is repeated: {seen_calls}"
        assert Counter(results) == Counter(seen_calls), f"request {n}: calls {seen_calls} results {results}"
        checked += 1
    return checked


def pairs(content: PlainContent | None) -> list[tuple[ToolCallPart, ToolResultPart]]:
    """Each tool call part with the result part right after it (asserting the layout)."""
    assert content is not None
    out = []
    ps = content.parts
    for i, p in enumerate(ps):
        if isinstance(p, ToolCallPart):
            nxt = ps[i + 1] if i + 1 < len(ps) else None
            assert isinstance(nxt, ToolResultPart) and nxt.call_id == p.call_id, f"call {p.call_id} has no result after it"
            out.append((p, nxt))
    assert len([p for p in ps if isinstance(p, ToolResultPart)]) == len(out)
    return out


def token_of(output: str) -> str:
    return output.rsplit("#", 1)[1]


async def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- in-process worker: (1) auto-run, (2) approve, (3) deny + silence, (4) not waiting ---------


@pytest.fixture
def counting(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "executions.log", tmp_path / "gate"


@pytest.fixture
def tool_settings(dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer,
                  counting: tuple[Path, Path]) -> Settings:
    """An in-process worker's settings: the echo model and the counting MCP server."""
    return make_settings(
        dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
        defaults={"model": {"provider": "local", "id": "echo-1"}, "tools": TOOLS},
        tools={"call_timeout": 60},
        mcp=mcp_servers(*counting),
    )


async def test_mcp_tools_auto_run_in_parallel_and_in_a_loop_each_exactly_once(
    tool_settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, counting: tuple[Path, Path],
) -> None:
    count_file = counting[0]
    model_server.enqueue(
        Turn(tool_calls=[ToolCall("mcp_j_lookup", {"text": "a"}, id="l1"),
                         ToolCall("mcp_j_lookup", {"text": "b"}, id="l2")]),
        Turn(tool_calls=[ToolCall("mcp_j_lookup", {"text": "c"}, id="l3")]),
        Turn(text="Found it."),
    )
    async with running_worker(tool_settings, pds_account, keyring[0]) as worker:
        k = await app.send("look up a, b, then c", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=WAIT)
        await worker.wait_idle(10)
    got = pairs(content)
    assert [c.call_id for c, _ in got] == ["l1", "l2", "l3"]
    assert all(c.approval is None and not r.is_error for c, r in got)
    assert [r.output.split(" #")[0] for _, r in got] == ["looked up a", "looked up b", "looked up c"]
    assert text_of(content) == "Found it." and rec.finish_reason == "stop"
    ran = executions(count_file)
    assert sorted((t, x) for t, x, _ in ran) == [("lookup", "a"), ("lookup", "b"), ("lookup", "c")]
    assert {tok for _, _, tok in ran} == {token_of(r.output) for _, r in got}  # each result is its run
    assert len(model_server.requests) == 3
    assert assert_one_result_per_call(model_server.requests) == 3
    last = model_server.requests[-1].body["messages"]
    assert [m["tool_call_id"] for m in last if m.get("role") == "tool"] == ["l1", "l2", "l3"]


async def test_one_answer_approves_denies_and_leaves_a_call_unanswered(
    tool_settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, counting: tuple[Path, Path],
) -> None:
    count_file = counting[0]
    conv = new_tid()
    async with running_worker(tool_settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(text="Let me.", tool_calls=[
            ToolCall("mcp_j_lookup", {"text": "x"}, id="l1"),
            ToolCall("mcp_j_note", {"text": "a"}, id="n1"),
            ToolCall("mcp_j_note", {"text": "b"}, id="n2"),
            ToolCall("mcp_j_note", {"text": "c"}, id="n3"),
        ]))
        k1 = await app.send("do it all", conversation=conv)
        r1, c1 = await app.wait_status(f"{k1}.r0", "awaitingApproval", timeout=WAIT)
        assert c1 is not None
        assert [(type(p).__name__, getattr(p, "call_id", None), getattr(p, "approval", None)) for p in c1.parts] == [
            ("TextPart", None, None), ("ToolCallPart", "l1", None), ("ToolResultPart", "l1", None),
            ("ToolCallPart", "n1", "pending"), ("ToolCallPart", "n2", "pending"), ("ToolCallPart", "n3", "pending"),
        ]
        assert [t for t, _, _ in executions(count_file)] == ["lookup"]  # only the auto-run call ran

        model_server.enqueue(Turn(text="Done."))
        k2 = await app.send(None, conversation=conv, parent=f"{k1}.r0", parts=[
            TextPart(text="a yes, b no, c: no answer"),
            ToolApprovalPart(call_id="n1", approved=True),
            ToolApprovalPart(call_id="n2", approved=False, reason="not b"),
        ])
        r2, c2 = await app.wait_status(f"{k2}.r0", "complete", timeout=WAIT)
        await worker.wait_idle(10)
        for cid in ("n2", "n3"):
            assert await worker.store.get_tool_call(CallRef(app.did, conv, cid)) is None  # denied: never journaled
        assert (await worker.store.get_tool_call(CallRef(app.did, conv, "n1"))).finished

    got = pairs(c2)
    assert [(c.call_id, c.approval) for c, _ in got] == [("n1", "approved"), ("n2", "denied"), ("n3", "denied")]
    (_, res1), (_, res2), (_, res3) = got
    assert not res1.is_error and res1.output.startswith("noted a #")
    assert res2.is_error and res2.output == "The user denied this tool call. Reason: not b"
    assert res3.is_error and res3.output == "The tool call was not run: the user did not approve it."
    assert text_of(c2) == "Done."
    ran = executions(count_file)
    assert [(t, x) for t, x, _ in ran] == [("lookup", "x"), ("note", "a")]  # b and c never ran
    assert ran[1][2] == token_of(res1.output)

    assert assert_one_result_per_call(model_server.requests) == 2
    last = model_server.requests[-1].body["messages"]
    results = {m["tool_call_id"]: m["content"] for m in last if m.get("role") == "tool"}
    assert list(results) == ["l1", "n1", "n2", "n3"]  # the repeated calls replace the waiting copies
    assert "noted a" in json.dumps(results["n1"]) and "not b" in json.dumps(results["n2"])
    assert "did not approve" in json.dumps(results["n3"])


async def test_approvals_for_calls_that_are_not_waiting_are_ignored_logged_and_never_run(
    tool_settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, counting: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gelbridge.worker.turn")
    count_file = counting[0]
    conv = new_tid()

    def ignored_logged(reply: str, n: int) -> bool:
        return any(f"reply {reply}: ignored {n} approval answer(s)" in r.getMessage() for r in caplog.records)

    async with running_worker(tool_settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(tool_calls=[ToolCall("mcp_j_note", {"text": "one"}, id="n1")]))
        k1 = await app.send("note one", conversation=conv)
        await app.wait_status(f"{k1}.r0", "awaitingApproval", timeout=WAIT)

        # approving the waiting call plus one that never existed: the stranger is ignored
        model_server.enqueue(Turn(text="Sent."))
        k2 = await app.send(None, conversation=conv, parent=f"{k1}.r0", parts=[
            ToolApprovalPart(call_id="n1", approved=True), ToolApprovalPart(call_id="ghost", approved=True)])
        _, c2 = await app.wait_status(f"{k2}.r0", "complete", timeout=WAIT)
        [(call, first)] = pairs(c2)
        assert call.call_id == "n1" and not first.is_error
        assert len(executions(count_file)) == 1
        assert ignored_logged(f"{k2}.r0", 1)

        # approving n1 again under the reply where it already ran (not waiting there): ignored
        model_server.enqueue(Turn(text="Nothing to approve."))
        k3 = await app.send(None, conversation=conv, parent=f"{k2}.r0", parts=[
            ToolApprovalPart(call_id="n1", approved=True), ToolApprovalPart(call_id="ghost", approved=True)])
        _, c3 = await app.wait_status(f"{k3}.r0", "complete", timeout=WAIT)
        assert c3 is not None and [type(p).__name__ for p in c3.parts] == ["TextPart"]
        assert text_of(c3) == "Nothing to approve."
        assert len(executions(count_file)) == 1
        assert ignored_logged(f"{k3}.r0", 2)

        # a second answer to the same waiting reply (another branch) approving n1 again:
        # n1 is waiting there, but it already ran: the journaled result is reused
        model_server.enqueue(Turn(text="Sent (branch)."))
        k4 = await app.send(None, conversation=conv, parent=f"{k1}.r0",
                            parts=[ToolApprovalPart(call_id="n1", approved=True)])
        _, c4 = await app.wait_status(f"{k4}.r0", "complete", timeout=WAIT)
        [(call4, again)] = pairs(c4)
        assert call4.approval == "approved" and again.output == first.output and not again.is_error
        assert not ignored_logged(f"{k4}.r0", 1)
        await worker.wait_idle(10)

    assert [(t, x) for t, x, _ in executions(count_file)] == [("note", "one")]
    assert assert_one_result_per_call(model_server.requests) == 4
    third = model_server.requests[2].body["messages"]  # the answer to k3: n1 once, with one result
    assert [m["tool_call_id"] for m in third if m.get("role") == "tool"] == ["n1"]
    assert "ghost" not in json.dumps([r.body for r in model_server.requests])


# --- (5) a worker process killed at the dangerous moments ------------------------------------


def journal(state_dir: Path, call_id: str) -> Any:
    """The tool journal's entry for ``call_id`` in any conversation (read next to a running
    or killed worker, straight from its SQLite file; the tests use each id in one conversation)."""
    import sqlite3

    db = sqlite3.connect(state_dir / DB_FILENAME, timeout=10)
    try:
        rows = db.execute(f"SELECT {StateStore._JOURNAL_COLS} FROM tool_calls WHERE call_key = ?",
                          (call_key(call_id),)).fetchall()
    finally:
        db.close()
    assert len(rows) <= 1, f"call id {call_id} journaled in {len(rows)} conversations"
    return StateStore._entry(rows[0]) if rows else None


async def journal_entry(store: StateStore, call_id: str) -> Any:
    """The same, through an open store."""
    rows = await store._read(f"SELECT {store._JOURNAL_COLS} FROM tool_calls WHERE call_key = ?",
                             (call_key(call_id),))
    assert len(rows) <= 1, f"call id {call_id} journaled in {len(rows)} conversations"
    return store._entry(rows[0]) if rows else None


@dataclass
class KillRig:
    """`gelbridge run` processes with the counting MCP server (lookup auto-runs, the
    others need approval) over one state directory: start one, kill it, start the next."""

    app: App
    model_server: ModelServer
    account: AccountInfo
    cfg: Path
    tmp: Path
    count_file: Path
    gate_file: Path
    procs: list[WorkerProc]
    conv: str = field(default_factory=new_tid)

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    async def start(self, name: str) -> WorkerProc:
        return await start_worker(self.cfg, self.account, self.tmp / f"{name}.log", self.procs)

    def journal(self, call_id: str) -> Any:
        return journal(self.state, call_id)

    async def waiting_for_approval(self, tool: str, text: str, call_id: str) -> tuple[WorkerProc, str]:
        """Start the first worker and let it answer a message with one call to ``tool``
        that waits for approval; the running worker and the message's rkey."""
        w1 = await self.start("w1")
        self.model_server.enqueue(Turn(tool_calls=[ToolCall(tool, {"text": text}, id=call_id)]))
        k1 = await self.app.send(f"{tool} {text}", conversation=self.conv)
        await self.app.wait_status(f"{k1}.r0", "awaitingApproval", timeout=WAIT)
        return w1, k1

    async def approve(self, k1: str, call_id: str) -> str:
        """The user's answer to ``k1``'s reply approving ``call_id``; its rkey."""
        return await self.app.send(None, conversation=self.conv, parent=f"{k1}.r0",
                                   parts=[ToolApprovalPart(call_id=call_id, approved=True)])

    async def restarted(self, rkey: str) -> tuple[WorkerProc, PlainContent | None]:
        """Start the next worker; the content of ``rkey``'s reply once it completes."""
        w2 = await self.start("w2")
        _, content = await self.app.wait_status(f"{rkey}.r0", "complete", timeout=WAIT)
        return w2, content

    def stopped_after_running(self, w2: WorkerProc, tool: str, text: str,
                              result: ToolResultPart | None = None) -> None:
        """``w2`` stops cleanly on SIGTERM, and the tool ran exactly once over both workers
        (the run whose output ``result`` holds, when given)."""
        assert w2.terminate() == 0
        ran = executions(self.count_file)
        assert [(t, x) for t, x, _ in ran] == [(tool, text)]  # at most once
        if result is not None:
            assert ran[0][2] == token_of(result.output)


@pytest.fixture
def rig(dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
        model_server: ModelServer, tmp_path: Path, counting: tuple[Path, Path], procs: list[WorkerProc]) -> KillRig:
    count_file, gate_file = counting
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0], tools=TOOLS,
                       extra=counting_mcp_toml(count_file, gate_file, auto_run=["lookup"]))
    return KillRig(app, model_server, pds_account, cfg, tmp_path, count_file, gate_file, procs)


async def test_killed_after_the_approval_was_claimed_before_the_call_began_runs_it_once_after_restart(
    rig: KillRig, app: App, model_server: ModelServer,
) -> None:
    w1, k1 = await rig.waiting_for_approval("mcp_j_note", "once", "n1")

    # a slow turn of the same conversation runs first, so the approval's reply is claimed
    # (durably, `pending`) and waits behind it: the kill lands after the approval was
    # taken on and before the tool began
    model_server.enqueue(Turn(text="slow " * 600, chunk_size=5, chunk_delay=0.1))  # ~60 s
    x = await app.send("something slow", conversation=rig.conv)
    await app.wait_status(f"{x}.r0", "streaming", timeout=WAIT, interval=0.05)
    k2 = await rig.approve(k1, "n1")
    await app.wait_status(f"{k2}.r0", "pending", timeout=WAIT, interval=0.05)
    w1.kill()
    assert executions(rig.count_file) == [] and rig.journal("n1") is None
    rec, _ = await app.wait_status(f"{k2}.r0", "pending", timeout=5)

    w2, c2 = await rig.restarted(k2)  # echo model from here on
    await app.wait_status(f"{x}.r0", "complete", timeout=WAIT)
    [(call, result)] = pairs(c2)
    assert call.call_id == "n1" and call.approval == "approved"
    assert not result.is_error and result.output.startswith("noted once #")
    rig.stopped_after_running(w2, "note", "once", result)
    entry = rig.journal("n1")
    assert entry is not None and entry.finished and not entry.is_error
    assert await app.replies_of(k2) == [f"{k2}.r0"]
    assert assert_one_result_per_call(model_server.requests) >= 4


async def test_killed_while_the_approved_call_runs_it_is_not_run_again_but_answered_interrupted(
    rig: KillRig, app: App, model_server: ModelServer,
) -> None:
    w1, k1 = await rig.waiting_for_approval("mcp_j_gate", "g", "g1")

    k2 = await rig.approve(k1, "g1")
    await wait_until(lambda: len(executions(rig.count_file)) == 1, WAIT, "the gate tool to start")
    entry = rig.journal("g1")
    assert entry is not None and not entry.finished  # begun, not finished: the tool blocks
    w1.kill()
    with SqliteStore.open_dir(rig.state) as store:
        assert [(e.conversation, e.call_key) for e in await store.unfinished_tool_calls(app.did)] == [
            (rig.conv, call_key("g1"))]
    rec, _ = await app.wait_status(f"{k2}.r0", {"pending", "streaming"}, timeout=5)
    rig.gate_file.touch()  # were the call run again, it would now finish and be counted

    w2, c2 = await rig.restarted(k2)
    [(call, result)] = pairs(c2)
    assert call.call_id == "g1" and call.approval == "approved"
    assert result.is_error and "interrupted" in result.output and "not repeated" in result.output
    rig.stopped_after_running(w2, "gate", "g")
    entry = rig.journal("g1")
    assert entry is not None and entry.finished and entry.is_error
    assert await app.replies_of(k2) == [f"{k2}.r0"]
    last = model_server.requests[-1].body["messages"]
    assert [m["tool_call_id"] for m in last if m.get("role") == "tool"] == ["g1"]
    assert "interrupted" in json.dumps(last[-1])
    assert assert_one_result_per_call(model_server.requests) >= 2


async def test_killed_after_the_approved_call_ran_before_the_reply_was_written_reuses_the_result(
    rig: KillRig, app: App, model_server: ModelServer,
) -> None:
    w1, k1 = await rig.waiting_for_approval("mcp_j_note", "exactly-once", "n1")

    model_server.enqueue(Turn(text="after " * 600, chunk_size=5, chunk_delay=0.1))  # ~70 s after the tool
    k2 = await rig.approve(k1, "n1")
    _, streamed = await app.wait_status(f"{k2}.r0", "streaming", timeout=WAIT, interval=0.05)
    entry = rig.journal("n1")
    assert entry is not None and entry.finished and not entry.is_error  # ran, result journaled
    w1.kill()
    [(_, before)] = pairs(PlainContent(parts=[p for p in streamed.parts if not isinstance(p, TextPart)]))
    assert before.output.startswith("noted exactly-once #")
    await app.wait_status(f"{k2}.r0", "streaming", timeout=5)  # the final write never happened

    w2, c2 = await rig.restarted(k2)
    [(call, result)] = pairs(c2)
    assert call.approval == "approved" and result.output == before.output and not result.is_error
    assert not text_of(c2).startswith("after")  # rewritten from scratch by the echo model
    rig.stopped_after_running(w2, "note", "exactly-once", result)
    assert await app.replies_of(k2) == [f"{k2}.r0"]
    assert assert_one_result_per_call(model_server.requests) >= 3


async def test_killed_after_an_auto_run_call_ran_the_restart_resumes_with_the_journaled_result(
    rig: KillRig, app: App, model_server: ModelServer,
) -> None:
    w1 = await rig.start("w1")
    lookup = ToolCall("mcp_j_lookup", {"text": "q"}, id="l1")
    model_server.enqueue(Turn(tool_calls=[lookup]), Turn(text="found " * 600, chunk_size=5, chunk_delay=0.1))
    k = await app.send("look up q", conversation=rig.conv)
    await wait_until(lambda: (e := rig.journal("l1")) is not None and e.finished, WAIT, "the lookup to finish")
    await app.wait_status(f"{k}.r0", "streaming", timeout=WAIT, interval=0.05)
    w1.kill()
    assert len(executions(rig.count_file)) == 1

    # the restart resumes from the call written before it ran (worker.resume): the model
    # is not asked for it again, only for the next step
    model_server.enqueue(Turn(text="Found q."))
    w2, c = await rig.restarted(k)
    [(call, result)] = pairs(c)
    assert call.call_id == "l1" and not result.is_error and text_of(c) == "Found q."
    rig.stopped_after_running(w2, "lookup", "q", result)
    assert assert_one_result_per_call(model_server.requests) == 3

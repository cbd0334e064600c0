"""What a restarted or repeated turn reuses instead of asking again.

1. An auto-run tool call across a crash of `gelbridge run` (SIGKILL): the restart resumes
the reply from the tool calls it had written instead of asking the model again, so the
tool runs at most once even when the model would answer a fresh request with new call
ids (PROTOCOL.md §5, docs/tools.md "Guarantees").

The model here is a responder on the local model server that behaves like a real one:
asked without any tool result in the history, it calls the tool with a NEW call id each
time; once it sees a result, it answers in text. A restart that asked from scratch would
therefore run the tool a second time, and the counting MCP server would show it.

2. Conversation and settings records: read from the PDS once, then kept current by
their record events (no getRecord per turn), and an updated record is used at once;
the time of the reads a turn still makes is reported apart (read=) from bridge.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import Delay, ModelServer, RecordedRequest, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import (
    CONVERSATION_COLLECTION,
    SETTINGS_COLLECTION,
    SETTINGS_RKEY,
    AtUri,
    PlainContent,
    TextPart,
    ToolCallPart,
    new_tid,
    now_datetime,
)
from gelbridge._sealing import Keyring, seal_content

from .conftest import App, make_settings, running_worker, text_of
from .test_tools_approval import (
    WAIT,
    assert_one_result_per_call,
    executions,
    journal,
    pairs,
    token_of,
    wait_until,
)
from .worker_proc import WorkerProc, counting_mcp_toml, start_worker, write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def write_auto_run_config(tmp: Path, pds_url: str, account: AccountInfo, model_url: str, keyring: Keyring,
                          count_file: Path, gate_file: Path, *, update_interval: float) -> Path:
    """`gelbridge run` with the counting MCP server; lookup and gate run without approval."""
    return write_config(tmp, pds_url, account, model_url, keyring, update_interval,
                        tools=["mcp_j_lookup", "mcp_j_gate"],
                        extra=counting_mcp_toml(count_file, gate_file, auto_run=["lookup", "gate"]))


class ToolThenText:
    """A model that calls ``tool`` (a fresh call id per request) until the history holds a
    tool result, then answers "Done.". ``stall`` makes the answer after a result wait
    (the model's next step never reaches the reply)."""

    def __init__(self, tool: str, prefix: str) -> None:
        self.tool, self.prefix = tool, prefix
        self.fresh = 0
        self.stall = False
        self.saw_result = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, req: RecordedRequest) -> Any:
        messages = req.body.get("messages", []) if isinstance(req.body, dict) else []
        if not any(m.get("role") == "tool" for m in messages):
            with self._lock:
                self.fresh += 1
                cid = f"{self.prefix}{self.fresh}"
            return Turn(tool_calls=[ToolCall(self.tool, {"text": "q"}, id=cid)])
        self.saw_result.set()
        if self.stall:
            return Delay(120, then=Turn(text="too late"))
        return Turn(text="Done.")


def tool_results(req: RecordedRequest) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], json.dumps(m["content"])) for m in req.body["messages"] if m.get("role") == "tool"]


async def stored_parts(app: App, rkey: str) -> list[Any]:
    got = await app.reply(rkey)
    assert got is not None and got[1] is not None
    return list(got[1].parts)


async def test_killed_while_an_auto_run_tool_runs_the_restart_answers_it_interrupted_and_never_runs_it_again(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    count_file, gate_file = tmp_path / "executions.log", tmp_path / "gate"
    model = ToolThenText("mcp_j_gate", "g")
    model_server.responder = model
    # update_interval = 0 (no throttled progress writes): the checkpoint before the tool
    # runs is written anyway
    cfg = write_auto_run_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0],
                                count_file, gate_file, update_interval=0)
    state = tmp_path / "state"
    w1 = await start_worker(cfg, pds_account, tmp_path / "w1.log", procs)
    k = await app.send("open the gate", conversation=new_tid())
    await wait_until(lambda: len(executions(count_file)) == 1, WAIT, "the gate tool to start")
    entry = journal(state, "g1")
    assert entry is not None and not entry.finished  # begun, blocked on the gate file
    parts = await stored_parts(app, f"{k}.r0")  # the checkpoint: the call, durable before it began
    assert [(type(p).__name__, getattr(p, "call_id", None)) for p in parts] == [("ToolCallPart", "g1")]
    w1.kill()
    gate_file.touch()  # were the call run again it would now finish, and be counted

    w2 = await start_worker(cfg, pds_account, tmp_path / "w2.log", procs)
    rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=WAIT)
    assert w2.terminate() == 0
    [(call, result)] = pairs(content)
    assert call.call_id == "g1" and call.approval is None
    assert result.is_error and "interrupted" in result.output and "not repeated" in result.output
    assert text_of(content) == "Done." and rec.finish_reason == "stop"
    assert [(t, x) for t, x, _ in executions(count_file)] == [("gate", "q")]  # once, never twice
    assert model.fresh == 1  # the model was never asked the question again
    reqs = model_server.requests
    assert len(reqs) == 2 and assert_one_result_per_call(reqs) == 2
    [(cid, out)] = tool_results(reqs[1])
    assert cid == "g1" and "interrupted" in out
    entry = journal(state, "g1")
    assert entry is not None and entry.finished and entry.is_error
    assert await app.replies_of(k) == [f"{k}.r0"]
    assert "resuming after 1 tool step(s)" in (tmp_path / "w2.log").read_text()


async def test_killed_after_an_auto_run_tool_ran_before_the_next_step_was_written_reuses_its_result(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    count_file, gate_file = tmp_path / "executions.log", tmp_path / "gate"
    model = ToolThenText("mcp_j_lookup", "l")
    model.stall = True
    model_server.responder = model
    cfg = write_auto_run_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0],
                                count_file, gate_file, update_interval=0.2)
    state = tmp_path / "state"
    w1 = await start_worker(cfg, pds_account, tmp_path / "w1.log", procs)
    k = await app.send("look up q", conversation=new_tid())
    await wait_until(lambda: (e := journal(state, "l1")) is not None and e.finished, WAIT, "the lookup to finish")
    await asyncio.to_thread(model.saw_result.wait, WAIT)  # the next step was asked for, and stalls
    assert model.saw_result.is_set()
    parts = await stored_parts(app, f"{k}.r0")
    assert len(parts) == 1 and isinstance(parts[0], ToolCallPart) and parts[0].call_id == "l1"  # no result yet
    w1.kill()
    assert len(executions(count_file)) == 1

    model.stall = False
    w2 = await start_worker(cfg, pds_account, tmp_path / "w2.log", procs)
    _, content = await app.wait_status(f"{k}.r0", "complete", timeout=WAIT)
    assert w2.terminate() == 0
    [(call, result)] = pairs(content)
    assert call.call_id == "l1" and not result.is_error and text_of(content) == "Done."
    ran = executions(count_file)
    assert [(t, x) for t, x, _ in ran] == [("lookup", "q")]  # the count stays 1
    assert ran[0][2] == token_of(result.output)  # the journaled result of the one run
    assert model.fresh == 1
    reqs = model_server.requests
    assert len(reqs) == 3 and assert_one_result_per_call(reqs) == 3  # w1: call, stalled step; w2: next step
    assert tool_results(reqs[2]) == tool_results(reqs[1])  # the same result, reused
    assert await app.replies_of(k) == [f"{k}.r0"]


# --- 2. conversation and settings records are not read per turn --------------------------------


async def put_conversation(app: App, conv: str, instructions: str) -> None:
    sealed = seal_content(PlainContent(parts=[TextPart(text=instructions)]),
                          uri=AtUri(app.did, CONVERSATION_COLLECTION, conv), key_id=app.key_id, keyring=app.keyring)
    await app.pds.put_record(CONVERSATION_COLLECTION, conv, {
        "$type": CONVERSATION_COLLECTION, "createdAt": now_datetime(), "instructions": sealed.to_value()})


def system_prompt(req: RecordedRequest) -> str:
    return json.dumps([m for m in req.body["messages"] if m.get("role") in ("system", "developer")])


async def test_conversation_and_settings_are_read_once_then_kept_current_by_their_events(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gelbridge.worker.turn")
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    conv = new_tid()
    await put_conversation(app, conv, "Answer like a pirate.")  # before the worker runs: no event for it
    gets: list[tuple[str, str]] = []
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        real_get = worker.pds.get_record

        async def counting_get(collection: str, rkey: str, **kw: Any) -> Any:
            gets.append((collection, rkey))
            return await real_get(collection, rkey, **kw)

        worker.pds.get_record = counting_get  # type: ignore[method-assign]
        # A backfill (a #sync the PDS sends for a new account may start one at any time)
        # or a reconnect rightly drops the cache: a turn after it reads the records again.
        clears = [0]
        real_clear = worker.side.clear

        def counting_clear() -> None:
            clears[0] += 1
            real_clear()

        worker.side.clear = counting_clear  # type: ignore[method-assign]

        def side_reads() -> list[tuple[str, str]]:
            return [g for g in gets if g[0] in (CONVERSATION_COLLECTION, SETTINGS_COLLECTION)]

        def new_reads_since(n: int, cleared_before: int) -> list[tuple[str, str]]:
            """The side reads after the first ``n``, less those a cache drop explains.

            ``cleared_before``: the drop count from before the *previous* step began: a drop
            while that step's own read was in flight keeps the record out of the cache too."""
            got = side_reads()[n:]
            if clears[0] != cleared_before:
                allowed = {(CONVERSATION_COLLECTION, conv), (SETTINGS_COLLECTION, SETTINGS_RKEY)}
                got = [g for g in got if g not in allowed]
            return got

        c_one = clears[0]
        k1 = await app.send("one", conversation=conv)
        await app.wait_status(f"{k1}.r0", "complete", timeout=WAIT)
        assert sorted(set(side_reads())) == [(CONVERSATION_COLLECTION, conv), (SETTINGS_COLLECTION, SETTINGS_RKEY)]
        assert clears[0] != c_one or len(side_reads()) == 2
        assert "pirate" in system_prompt(model_server.requests[-1])

        n, c_two = len(side_reads()), clears[0]
        k2 = await app.send("two", conversation=conv, parent=f"{k1}.r0")
        await app.wait_status(f"{k2}.r0", "complete", timeout=WAIT)
        assert new_reads_since(n, c_one) == []  # the second turn read neither record
        assert "pirate" in system_prompt(model_server.requests[-1])

        # new instructions: the record event updates the cache; the next turn uses them
        c_three = clears[0]
        before = worker.side.cached(CONVERSATION_COLLECTION, conv)[1]
        await put_conversation(app, conv, "Answer like a poet.")
        await wait_until(lambda: worker.side.cached(CONVERSATION_COLLECTION, conv)[1] is not before, WAIT,
                         "the conversation update to reach the worker")
        n = len(side_reads())
        k3 = await app.send("three", conversation=conv, parent=f"{k2}.r0")
        await app.wait_status(f"{k3}.r0", "complete", timeout=WAIT)
        prompt = system_prompt(model_server.requests[-1])
        assert "poet" in prompt and "pirate" not in prompt
        assert new_reads_since(n, c_two) == []  # still no read: the event carried the record

        # a settings record written now (no read either: its create event is enough)
        await app.pds.put_record(SETTINGS_COLLECTION, SETTINGS_RKEY, {
            "$type": SETTINGS_COLLECTION, "model": {"provider": "local", "id": "echo-2"}})
        await wait_until(lambda: worker.side.cached(SETTINGS_COLLECTION, SETTINGS_RKEY)[1] is not None, WAIT,
                         "the settings record to reach the worker")
        conv4 = new_tid()
        n = len(side_reads())
        k4 = await app.send("four", conversation=conv4)
        await app.wait_status(f"{k4}.r0", "complete", timeout=WAIT)
        assert model_server.requests[-1].body["model"] == "echo-2"
        assert new_reads_since(n, c_three) == [(CONVERSATION_COLLECTION, conv4)]  # a new conversation: read once
        await worker.wait_idle(10)

        # timings: PDS reads apart from bridge, in the state store and the per-turn line
        turns = {t.reply_rkey: t for t in await worker.store.recent_turns(10)}
        assert all(turns[f"{m}.r0"].read_ms is not None for m in (k1, k2, k3, k4))
        assert turns[f"{k1}.r0"].read_ms > 0  # it read the conversation and settings records
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"turn {k1}.r0 ")]
    assert len(lines) == 1
    assert re.fullmatch(rf"turn {k1}\.r0 complete queue=\d+ms read=\d+ms bridge=\d+ms model=\d+ms write=\d+ms "
                        r"total=\d+ms points=\d+( \w+=\S+)*", lines[0])

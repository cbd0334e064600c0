"""One turn engine: the same records and the same model answers give the same reply and
the same request whether the worker answers on the real local PDS (``gelbridge run``) or
``gelbridge reply`` / ``convert`` answer from an export of the repo.

Cases: a plain text answer, a tool call that needs approval, an approval sent after
``approval_ttl``, a call to a tool that is not offered, and a malformed message."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gelbridge._cli import app as cli
from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import (
    CONVERSATION_COLLECTION,
    MESSAGE_COLLECTION,
    AtUri,
    MessageRecord,
    ToolApprovalPart,
    new_tid,
    now_datetime,
)
from gelbridge._sealing import Keyring, content_of

from .conftest import App, make_settings, running_worker

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

TTL = 2.0
FETCH = ToolCall("fetch_url", {"url": "http://127.0.0.1:9/page"}, id="f1")
UNKNOWN = ToolCall("no_such_tool", {"x": 1}, id="u1")


async def export(app: App, path: Path) -> Path:
    """The account's repo as a record file (listRecords JSON), as an operator exports it."""
    out = []
    for coll in (MESSAGE_COLLECTION, CONVERSATION_COLLECTION):
        async for r in app.pds.iter_records(coll):
            out.append({"uri": str(AtUri(app.did, coll, r.rkey)), "cid": r.cid, "value": r.value})
    path.write_text(json.dumps({"records": out}))
    return path


def essence(app: App, rkey: str, value: dict[str, Any]) -> dict[str, Any]:
    """What must be equal: the opened parts and the reply's fields, not its timestamps."""
    rec = MessageRecord.from_value(value)
    parts = content_of(rec.content, uri=app.uri(rkey), keyring=app.keyring).parts
    return {
        "parts": [p.to_value() for p in parts], "status": rec.status, "finish": rec.finish_reason,
        "model": rec.model.to_value() if rec.model else None, "parent": rec.parent,
        "error": (rec.error.kind, rec.error.message) if rec.error else None,
    }


async def test_the_worker_and_reply_convert_give_the_same_reply_and_request(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    tools = {"approval_ttl": TTL}
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             defaults={"tools": ["current_time", "fetch_url"]}, tools=tools,
                             providers={"local": {"adapter": "openai", "base_url": model_server.url + "/v1",
                                                  "max_retries": 0, "prompt_cache": True}})
    answers = {
        "text": [Turn(text="Plain words, nothing else.", usage=(10, 4, 0))],
        "approval": [Turn(tool_calls=[FETCH], usage=(12, 5, 0))],
        "late": [Turn(text="I did not fetch it.", usage=(20, 5, 0))],
        "unknown": [Turn(tool_calls=[UNKNOWN], usage=(9, 3, 0))],
    }
    conv = new_tid()
    asked: dict[str, str] = {}  # case → message rkey
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        for t in answers["text"]:
            model_server.enqueue(t)
        asked["text"] = await app.send("say something", conversation=conv)
        await app.wait_status(f"{asked['text']}.r0", "complete", timeout=60)
        model_server.enqueue(answers["approval"][0])
        asked["approval"] = await app.send("fetch the page", conversation=conv, parent=f"{asked['text']}.r0")
        await app.wait_status(f"{asked['approval']}.r0", "awaitingApproval", timeout=60)
        await asyncio.sleep(TTL + 1.0)  # the answer comes after the approval TTL
        model_server.enqueue(answers["late"][0])
        asked["late"] = await app.send(None, conversation=conv, parent=f"{asked['approval']}.r0",
                                       parts=[ToolApprovalPart(call_id="f1", approved=True)])
        await app.wait_status(f"{asked['late']}.r0", "complete", timeout=60)
        model_server.enqueue(answers["unknown"][0])
        asked["unknown"] = await app.send("use a tool you do not have", conversation=new_tid())
        await app.wait_status(f"{asked['unknown']}.r0", "awaitingApproval", timeout=60)
        bad = new_tid()  # plainly asks for a reply, but its content is no content at all
        await app.pds.put_record(MESSAGE_COLLECTION, bad, {
            "$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user",
            "content": {"$type": "chat.gel.assistant.defs#nothing"}, "generation": {"attempt": 0},
            "createdAt": now_datetime()})
        asked["malformed"] = bad
        await app.wait_status(f"{bad}.r0", "error", timeout=60)
        await worker.wait_idle(10)
    worker_requests = [r.body for r in model_server.requests]
    online = {case: essence(app, f"{k}.r0", (await app.get(f"{k}.r0"))[1]) for case, k in asked.items()}
    assert online["late"]["parts"][0]["approval"] == "denied"  # the TTL decided it
    assert online["unknown"]["status"] == "awaitingApproval" and online["malformed"]["error"][0] == "bad_record"

    records = await export(app, tmp_path / "records.json")
    ring = tmp_path / "keyring.json"
    keyring[0].save(ring)
    with ModelServer() as offline_model:
        cfg = tmp_path / "offline.toml"
        cfg.write_text("\n".join([
            '[defaults]\nmodel = { provider = "local", id = "echo-1" }\ntools = ["current_time", "fetch_url"]',
            f'[providers.local]\nadapter = "openai"\nbase_url = "{offline_model.url}/v1"\nmax_retries = 0\n'
            "prompt_cache = true",  # the keyed cache key too must come out the same
            f"[tools]\napproval_ttl = {TTL}",
        ]) + "\n")
        offline: dict[str, dict[str, Any]] = {}
        for case, k in asked.items():
            for t in answers.get(case, []):
                offline_model.enqueue(t)
            res = await asyncio.to_thread(CliRunner().invoke, cli, ["reply", "--keyring", str(ring), "--config", str(cfg), "--message", k,
                                           str(records)])
            assert res.exit_code == (1 if case == "malformed" else 0), (case, res.output)
            offline[case] = essence(app, f"{k}.r0", json.loads(res.stdout))
            if case != "malformed":  # convert --to: the provider body, with no network
                conv_out = await asyncio.to_thread(CliRunner().invoke, cli, ["convert", "--keyring", str(ring), "--config", str(cfg),
                                                    "--message", k, "--to", "openai", str(records)])
                assert conv_out.exit_code == 0, conv_out.output
                assert json.loads(conv_out.stdout) == offline_model.requests[-1].body, case
        offline_requests = [r.body for r in offline_model.requests]
    for case in asked:
        assert offline[case] == online[case], case
    assert offline_requests == worker_requests  # the same four requests, byte for byte as JSON
    assert all(str(r.get("prompt_cache_key", "")).startswith("gb-") for r in worker_requests)

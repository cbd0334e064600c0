"""``gelbridge chat`` against the real local PDS and a running worker, driven through its
stdin as a user would type: answers stream in, ``/regen`` asks for a new attempt and the
conversation continues from it, a tool call that needs approval is asked about and the
answer goes back as the protocol's approval message, ``/new`` starts a new conversation."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import MESSAGE_COLLECTION, ToolApprovalPart
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV, App, make_settings, running_worker
from .worker_proc import write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


async def test_chat_streams_regenerates_asks_for_approval_and_starts_anew(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "worker-state", model_server.url,
                             defaults={"tools": ["current_time"]}, tools={"current_time": {"approval": "always"}})
    model_server.enqueue(Turn(text="A first answer, streamed in pieces.", chunk_size=4, chunk_delay=0.03))
    model_server.enqueue(Turn(text="A second try."))
    model_server.enqueue(Turn(tool_calls=[ToolCall("current_time", {"timezone": "UTC"}, id="call_t1")]))
    model_server.enqueue(Turn(text="It is late."))
    model_server.enqueue(Turn(text="Fresh start."))
    typed = ["hello there", "/regen", "what time is it?", "maybe", "y", "/bogus", "/new", "begin again", "/quit"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    env[PASSWORD_ENV] = pds_account.app_password
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gelbridge", "chat", "--config", str(cfg), "--timeout", "60",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(("\n".join(typed) + "\n").encode()), 200)
        await worker.wait_idle(10)
    text, errs = out.decode(), err.decode()
    assert proc.returncode == 0, (text, errs)
    assert "Traceback" not in errs
    assert "bot> A first answer, streamed in pieces.\n[complete, local/echo-1]" in text
    assert "bot> A second try.\n[complete, local/echo-1, attempt 1]" in text
    assert "tool call current_time wants to run with" in text and '"timezone"' in text
    assert text.count("approve? [y]es / [n]o") == 2  # "maybe" is asked again
    assert "bot> It is late." in text
    assert "unknown command /bogus" in text and "new conversation " in text
    assert "bot> Fresh start." in text

    msgs = {r.rkey: r.value async for r in app.pds.iter_records(MESSAGE_COLLECTION)}
    users = sorted((v["createdAt"], k) for k, v in msgs.items() if v["role"] == "user")
    assert len(users) == 4  # hello, what time, the approval answer, begin again
    (_, hello), (_, when), (_, answer), (_, fresh) = users
    assert msgs[hello]["generation"]["attempt"] == 1 and f"{hello}.r1" in msgs  # regenerated
    assert msgs[when]["parent"] == f"{hello}.r1"  # the chat went on from the new attempt
    assert msgs[f"{when}.r0"]["status"] == "awaitingApproval"
    assert msgs[answer]["parent"] == f"{when}.r0"
    _rec, opened = await app.reply(answer)
    assert opened is not None and opened.parts == [ToolApprovalPart(call_id="call_t1", approved=True)]
    assert msgs[f"{answer}.r0"]["status"] == "complete"
    assert "parent" not in msgs[fresh] and msgs[fresh]["conversation"] != msgs[hello]["conversation"]

"""``gelbridge send`` against the real local PDS and a running worker: the model's
answer is printed, a conversation goes on, and an error reply exits 1 with its error."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gelbridge._dev.model_server import Fail, ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import MESSAGE_COLLECTION
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV, App, make_settings, running_worker
from .worker_proc import write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


async def send(cfg: Path, *args: str, password: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    env[PASSWORD_ENV] = password
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gelbridge", "send", "--config", str(cfg), "--timeout", "60", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_send_prints_the_answer_continues_a_conversation_and_reports_an_error(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "worker-state", model_server.url)
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(text="Canberra is the capital.", chunk_size=4, chunk_delay=0.05))
        code, out, err = await send(cfg, "What is the capital of Australia?", password=pds_account.app_password)
        assert code == 0, err
        assert out.strip() == "Canberra is the capital."
        conv = err.split("in conversation ")[1].split(";")[0]
        model_server.enqueue(Turn(text="About 470,000 people."))
        code, out, err = await send(cfg, "How many live there?", "--conversation", conv, "--json",
                                    password=pds_account.app_password)
        assert code == 0, err
        assert '"status": "complete"' in out and "About 470,000 people." in out
        model_server.enqueue(Fail(500))
        code, out, err = await send(cfg, "again", password=pds_account.app_password)
        assert code == 1 and "error: the reply ended error" in err
        await worker.wait_idle(10)
    # the second message continued the thread: its parent is the first reply
    msgs = {r.rkey: r.value async for r in app.pds.iter_records(MESSAGE_COLLECTION)}
    users = sorted((v["createdAt"], k, v) for k, v in msgs.items() if v["role"] == "user" and v["conversation"] == conv)
    assert len(users) == 2 and "parent" not in users[0][2] and users[1][2]["parent"] == f"{users[0][1]}.r0"
    # the request the model got for the second turn holds the first exchange
    second = model_server.requests[1].body["messages"]
    assert any("Canberra is the capital." in str(m.get("content")) for m in second)

"""The README's local loop, end to end on the real PDS, with nothing but the commands a
newcomer types: ``gelbridge dev account`` (what ``dev pds`` does at start) and
``gelbridge dev model`` print the configuration, ``gelbridge keys new`` makes the
keyring, ``gelbridge run`` serves, and ``gelbridge chat`` asks for a tool call: the
reply waits for approval (the tool has not run), ``y`` sends the approval message, the
tool runs once and the model answers with its result."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.pds import DevPds
from gelbridge._pds import PdsClient
from gelbridge._records import MESSAGE_COLLECTION, AtUri, MessageRecord, TextPart, ToolApprovalPart, ToolCallPart
from gelbridge._sealing import Keyring, content_of
from testkit.loopback_http import serving
from testkit.processes import read_line

from .worker_proc import WorkerProc

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

GELBRIDGE = [sys.executable, "-m", "gelbridge"]
PAGE = "<html><head><title>Loop page</title></head><body><p>Hello from the local loop.</p></body></html>"
WAIT = 90.0  # seconds for one reply on a loaded machine


class _Page(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        type(self).hits.append(self.path)
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def page() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    with serving(type("Page", (_Page,), {"hits": hits})) as url:
        yield f"{url}/page.html", hits


def _pasted(stderr: str, start: str, end: str) -> str:
    """The configuration block a command printed between ``start`` and ``end``."""
    return stderr[stderr.index(start) + len(start):stderr.index(end)]


async def _read_until(stream: asyncio.StreamReader, marker: str, seen: list[str]) -> str:
    """What ``stream`` says up to and including ``marker`` (bounded by WAIT)."""
    async def read() -> str:
        while marker not in "".join(seen):
            chunk = await stream.read(4096)
            if not chunk:
                raise AssertionError(f"chat ended before {marker!r}: {''.join(seen)}")
            seen.append(chunk.decode())
        return "".join(seen)
    return await asyncio.wait_for(read(), WAIT)


async def test_the_local_loop_asks_approves_runs_the_tool_and_answers(
    dev_pds: DevPds, tmp_path: Path, page: tuple[str, list[str]],
) -> None:
    url, hits = page
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    account = subprocess.run([*GELBRIDGE, "dev", "account", "--pds", dev_pds.pds_url], capture_output=True,
                             text=True, env=env, timeout=60, check=True)
    made = json.loads(account.stdout)["account"]
    model = subprocess.Popen([*GELBRIDGE, "dev", "model", "--port", "0"], stdout=subprocess.PIPE,
                             stderr=open(tmp_path / "model.err", "w"), stdin=subprocess.DEVNULL, text=True, env=env,
                             start_new_session=True)
    worker: WorkerProc | None = None
    try:
        assert read_line(model, timeout=60), (tmp_path / "model.err").read_text()
        subprocess.run([*GELBRIDGE, "keys", "new", "--keyring", "keyring.json"], cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=60)
        model_err = (tmp_path / "model.err").read_text()
        (tmp_path / "gelbridge.toml").write_text(
            _pasted(account.stderr, "for gelbridge.toml:", "and in the shell")
            + _pasted(model_err, "For gelbridge.toml:", "In a chat, say")
            + '\n[tools.fetch_url]\nallow_hosts = ["127.0.0.1"]           # the page is on loopback\n')
        export = next(line for line in account.stderr.splitlines() if line.startswith("export "))
        name, _, value = export.removeprefix("export ").partition("=")
        env[name] = value

        worker = WorkerProc(tmp_path / "gelbridge.toml", None, tmp_path / "run.log", env=env)
        await asyncio.to_thread(worker.start, 90)
        chat = await asyncio.create_subprocess_exec(
            *GELBRIDGE, "chat", "--config", "gelbridge.toml", cwd=tmp_path, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert chat.stdin is not None and chat.stdout is not None
        seen: list[str] = []
        await _read_until(chat.stdout, "you> ", seen)
        chat.stdin.write(f"please call fetch_url {url}\n".encode())
        asked = await _read_until(chat.stdout, "approve? [y]es / [n]o", seen)
        assert f'tool call fetch_url wants to run with {{"url":"{url}"}}' in asked
        assert "[awaitingApproval, local/echo]" in asked
        assert hits == []  # waiting: the tool has not run
        chat.stdin.write(b"y\n")
        answered = await _read_until(chat.stdout, "[complete, local/echo]", seen)
        chat.stdin.write(b"/quit\n")
        await chat.stdin.drain()
        _out, err = await asyncio.wait_for(chat.communicate(), WAIT)
        assert chat.returncode == 0 and b"Traceback" not in err, err
        assert f"bot> fetch_url returned: URL: {url} Status: 200 Title: Loop page Hello from the local loop." in answered
        assert hits == ["/page.html"]  # approved: it ran, once
        assert worker.terminate() == 0
        worker = None
    finally:
        if worker is not None:
            worker.stop()
        if model.poll() is None:
            os.killpg(model.pid, signal.SIGTERM)
            model.wait(30)

    # the records the chat app and gelbridge wrote, opened with the keyring
    keyring = Keyring.load(tmp_path / "keyring.json")
    async with PdsClient(dev_pds.pds_url) as pds:
        await pds.login(made["handle"], made["password"])
        records = {r.rkey: r.value async for r in pds.iter_records(MESSAGE_COLLECTION)}

        def opened(rkey: str) -> tuple[MessageRecord, list[Any]]:
            rec = MessageRecord.from_value(records[rkey])
            content = content_of(rec.content, uri=AtUri(made["did"], MESSAGE_COLLECTION, rkey), keyring=keyring)
            return rec, list(content.parts)

    asking, approving = sorted((v["createdAt"], k) for k, v in records.items() if v["role"] == "user")
    waited, waited_parts = opened(f"{asking[1]}.r0")
    assert waited.status == "awaitingApproval"
    [call] = [p for p in waited_parts if isinstance(p, ToolCallPart)]
    assert (call.tool, json.loads(call.input), call.approval) == ("fetch_url", {"url": url}, "pending")
    approval, approval_parts = opened(approving[1])
    assert approval.parent == f"{asking[1]}.r0"
    assert approval_parts == [ToolApprovalPart(call_id=call.call_id, approved=True)]
    final, final_parts = opened(f"{approving[1]}.r0")
    assert final.status == "complete"
    assert "Hello from the local loop." in "".join(p.text for p in final_parts if isinstance(p, TextPart))

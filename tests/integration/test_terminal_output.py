"""``gelbridge send`` and ``gelbridge chat`` on the real local PDS, with replies written to
drive the user's terminal: by the model (streamed in pieces through a running worker)
and by whoever can write the account's records (a reply record written by hand). The
bytes on stdout and stderr never hold an escape, a C1 control or a bidi control: each is
shown visibly. A model's call to a tool name that is not a valid name is never shown as
waiting for approval."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import MESSAGE_COLLECTION, PlainContent, TextPart, ToolCallPart, ToolResultPart, now_datetime
from gelbridge._sealing import Keyring, seal_content
from gelbridge._terminal import safe_line, safe_text

from .conftest import PASSWORD_ENV, App, make_settings, running_worker
from .worker_proc import write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

#: Set the window title, clear the screen, an OSC 8 link hiding its target, an OSC 52
#: clipboard write, a CSI in C1 form, a carriage return over the line, reversed text.
HOSTILE = ("Hello \x1b]0;owned\x07\x1b[2J\x1b]8;;https://evil.example\x07click\x1b]8;;\x07 "
           "\x1b]52;c;b3duZWQ=\x07 \x9b31mred\x9b0m\rover \u202eevil\u202c \u2066x\u2069 done")
HOSTILE_TOOL = "fetch_url\x1b]0;fetch_url wants https://ok.example\x07\x1b[1A\x1b[2K"
HOSTILE_MODEL = "echo\x1b]0;owned\x07\x9b2J\u202e1"
RAW = [b"\x1b", b"\x07", b"\r", "\x9b".encode(), "\u202e".encode(), "\u202c".encode(), "\u2066".encode(),
       "\u2069".encode()]


def assert_nothing_raw(*outputs: bytes) -> None:
    for out in outputs:
        for raw in RAW:
            assert raw not in out, (raw, out)


def gelbridge_env(password: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    env[PASSWORD_ENV] = password
    return env


async def run(cfg: Path, *args: str, password: str, stdin: bytes | None = None,
              meanwhile: Any = None) -> tuple[int, bytes, bytes]:
    """``gelbridge ARGS --config CFG``: its exit code and raw stdout/stderr; ``meanwhile``
    (a coroutine) runs while it does."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gelbridge", *args, "--config", str(cfg), "--timeout", "60",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        env=gelbridge_env(password))
    talk = asyncio.ensure_future(proc.communicate(stdin))
    if meanwhile is not None:
        await asyncio.wait_for(meanwhile, 90)
    out, err = await asyncio.wait_for(talk, 120)
    return proc.returncode or 0, out, err


async def test_send_shows_a_streamed_hostile_answer_and_never_waits_on_an_invalid_tool_name(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "worker-state", model_server.url)
    password = pds_account.app_password
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        # streamed in 3-character pieces: the progress writes cut the escapes anywhere
        model_server.enqueue(Turn(text=HOSTILE, chunk_size=3, chunk_delay=0.02))
        code, out, err = await run(cfg, "send", "hi", password=password)
        assert code == 0, err
        assert_nothing_raw(out, err)
        assert out.decode() == safe_text(HOSTILE) + "\n"
        assert "Hello ␛]0;owned␇␛[2J␛]8;;https://evil.example␇click" in out.decode()
        assert "<U+009B>31mred<U+009B>0m␍over <U+202E>evil<U+202C>" in out.decode()
        # a tool name that is not a name: answered as unknown, the model answers again
        model_server.enqueue(Turn(tool_calls=[ToolCall(HOSTILE_TOOL, {"url": "https://a.example"}, id="call_h")]),
                             Turn(text="That tool does not exist."))
        code, out, err = await run(cfg, "send", "fetch it", password=password)
        assert code == 0, err
        assert_nothing_raw(out, err)
        assert out.decode() == "That tool does not exist.\n" and "approval" not in err.decode()
        await worker.wait_idle(10)
    rkey = err.decode().split("sent ")[1].split(" ")[0]
    rec, content = await app.wait_status(f"{rkey}.r0", "complete")
    assert content is not None
    call, result = content.parts[0], content.parts[1]
    assert isinstance(call, ToolCallPart) and call.tool == "invalid_tool_name" and call.approval is None
    assert isinstance(result, ToolResultPart) and result.is_error and "not a valid tool name" in result.output
    tool_messages = [m for m in model_server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 1 and "not a valid tool name" in str(tool_messages[0]["content"])


async def next_user_message(app: App, seen: set[str], timeout: float = 60) -> tuple[str, dict[str, Any]]:
    """The next user message that appears in the repo (written by the command under test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async for r in app.pds.iter_records(MESSAGE_COLLECTION):
            if r.rkey not in seen and isinstance(r.value, dict) and r.value.get("role") == "user":
                seen.add(r.rkey)
                return r.rkey, r.value
        await asyncio.sleep(0.2)
    raise AssertionError(f"no new user message within {timeout} s")


async def write_reply(app: App, message: tuple[str, dict[str, Any]], parts: list[Any], **fields: Any) -> None:
    """The reply to ``message`` as anyone who can write the account's records may write it."""
    rkey = f"{message[0]}.r0"
    value = {"$type": MESSAGE_COLLECTION, "conversation": message[1]["conversation"], "role": "assistant",
             "parent": message[0], "createdAt": now_datetime(),
             "content": seal_content(PlainContent(parts=parts), uri=app.uri(rkey), key_id=app.key_id,
                                     keyring=app.keyring).to_value(), **fields}
    await app.pds.put_record(MESSAGE_COLLECTION, rkey, value)


async def test_chat_and_send_show_a_hand_written_hostile_reply_and_approval_question(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    password = pds_account.app_password
    model = {"provider": "local\x1b[31m", "id": HOSTILE_MODEL}
    tool_input = '{"url": "https://a.example/\x1b[1A\x1b[2Kfetch_url wants {}\u202e"}'
    error = {"kind": "tool_error\x1b[2J", "message": "denied\x1b]52;c;b3duZWQ=\x07\nforged line \u202eevil"}
    seen: set[str] = set()

    async def bot() -> None:  # no worker: the test writes the replies
        first = await next_user_message(app, seen)
        await write_reply(app, first, [TextPart(text=HOSTILE),
                                       ToolCallPart(call_id="c1", tool=HOSTILE_TOOL, input=tool_input,
                                                    approval="pending")],
                          status="awaitingApproval", model=model)
        answer = await next_user_message(app, seen)
        await write_reply(app, answer, [TextPart(text="Denied \x1b[2J.")], status="error", model=model, error=error)

    code, out, err = await run(cfg, "chat", password=password, stdin=b"hello\nn not this\n/quit\n", meanwhile=bot())
    assert code == 0, err
    assert_nothing_raw(out, err)
    text = out.decode()
    assert f"bot> {safe_text(HOSTILE)}\n[awaitingApproval, {safe_line(model['provider'])}/{safe_line(HOSTILE_MODEL)}]" \
        in text
    assert f"tool call {safe_line(HOSTILE_TOOL)} wants to run with {safe_line(tool_input)}\n" in text
    assert "tool call fetch_url␛]0;fetch_url wants https://ok.example␇␛[1A␛[2K wants to run with" in text
    assert "approve? [y]es / [n]o" in text
    assert "bot> Denied ␛[2J.\n[error, tool_error␛[2J: denied␛]52;c;b3duZWQ=␇␊forged line <U+202E>evil]" in text

    async def failing_bot() -> None:
        await write_reply(app, await next_user_message(app, seen), [TextPart(text=HOSTILE)],
                          status="error", model=model, error=error)

    code, out, err = await run(cfg, "send", "again", password=password, meanwhile=failing_bot())
    assert code == 1
    assert_nothing_raw(out, err)
    assert out.decode() == safe_text(HOSTILE) + "\n"
    assert err.decode().splitlines()[-1] == ("error: the reply ended error (tool_error␛[2J: "
                                             "denied␛]52;c;b3duZWQ=␇␊forged line <U+202E>evil)")

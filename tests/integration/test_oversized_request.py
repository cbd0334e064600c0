"""One message must never take the worker process down (issue 23, point 1).

A 50 KB sealed message with 100 file parts that all name one 1 MiB text blob made a
~100 MB model request: the Lua sandbox PANICked ("unprotected error in call to Lua API
(not enough memory)") and the whole process exited, and again on every restart, in
backfill. Here the same message goes to a real ``gelbridge run`` process on the real PDS:
the blob is sent once and answered; a thread whose files alone exceed ``[thread]
max_request_bytes`` ends ``error`` with a clear message before any model call; the process
answers the next message, and a restarted one does not go back to the hostile messages.
The same message met in backfill (written while no worker ran: the restart loop of the
issue) is answered too, and a stream of 11 MB events (40,000 citations) is read. That no
value pushed into Lua can PANIC the process at all is shown on the sandbox itself, near
every limit (tests/adapters/host/test_push_limits.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import Citation, ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import (
    MESSAGE_COLLECTION,
    MessageRecord,
    PlainContent,
    SourcePart,
    TextPart,
    new_tid,
    now_datetime,
)
from gelbridge._records.models import Part
from gelbridge._sealing import Keyring, seal_blob, seal_content

from .conftest import App, text_of
from .worker_proc import WorkerProc, start_worker, write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(420)]

MiB = 1024 * 1024
WAIT = 120.0


async def upload_text(app: App, data: bytes) -> dict[str, Any]:
    return await app.pds.upload_blob(seal_blob(data, key_id=app.key_id, keyring=app.keyring), "text/plain")


def file_part(blob: dict[str, Any], name: str) -> Part:
    return PlainContent.model_validate({"$type": "chat.gel.assistant.defs#plainContent", "parts": [
        {"$type": "chat.gel.assistant.defs#filePart", "name": name, "file": blob,
         "extracted": {"text": blob, "method": "text"}}]}).parts[0]


async def send_files(app: App, conv: str, text: str, files: list[tuple[dict[str, Any], str]],
                     parent: str | None = None) -> str:
    """A sealed message with a text and these (blob, name) files; the blobs listed in the
    record's ``content.blobs`` as the protocol says (the PDS keeps only blobs a record names)."""
    rkey = new_tid()
    content = seal_content(PlainContent(parts=[TextPart(text=text), *(file_part(b, n) for b, n in files)]),
                           uri=app.uri(rkey), key_id=app.key_id, keyring=app.keyring).to_value()
    content["blobs"] = list({b["ref"]["$link"]: b for b, _ in files}.values())
    value: dict[str, Any] = {"$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
                             "content": content, "generation": {"attempt": 0}, "createdAt": now_datetime()}
    if parent is not None:
        value["parent"] = parent
    await app.pds.put_record(MESSAGE_COLLECTION, rkey, value)
    return rkey


def alive(w: WorkerProc) -> bool:
    return w.proc is not None and w.proc.poll() is None


async def test_one_message_naming_one_blob_100_times_is_answered_and_the_worker_lives_on(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    worker = await start_worker(cfg, pds_account, tmp_path / "worker.log", procs)
    conv = new_tid()
    big = await upload_text(app, (b"x" * 1023 + b"\n") * 1024)  # 1 MiB of text
    k1 = await send_files(app, conv, "read these", [(big, f"f{i}.txt") for i in range(100)])
    rec, content = await app.wait_status(f"{k1}.r0", {"complete", "error"}, timeout=WAIT)
    assert alive(worker), worker.log_path.read_text()[-3000:]
    assert rec.status == "complete", rec.error
    [request] = model_server.requests
    sent = json.dumps(request.body)
    assert MiB < len(sent) < MiB + 256 * 1024  # the text once, not 100 times
    assert "the same content as [file: f0.txt] above" in sent

    # nine different 1 MiB files: more than the default 8 MiB a request may hold
    many = [(await upload_text(app, bytes([65 + i]) * MiB), f"g{i}.txt") for i in range(9)]
    k2 = await send_files(app, conv, "and these", many, parent=f"{k1}.r0")
    rec, _ = await app.wait_status(f"{k2}.r0", {"complete", "error"}, timeout=WAIT)
    assert rec.status == "error" and rec.error is not None and rec.error.kind == "invalid_request"
    assert rec.error.message.startswith("this conversation is too large to send to the model")
    assert "[thread] max_request_bytes" in rec.error.message
    assert len(model_server.requests) == 1  # refused before any model call

    k3 = await app.send("a normal question", conversation=new_tid())
    rec, content = await app.wait_status(f"{k3}.r0", {"complete", "error"}, timeout=WAIT)
    assert rec.status == "complete" and "a normal question" in text_of(content)
    assert alive(worker)

    # a restart goes back to neither: both replies are final
    before = {k: await app.get(f"{k}.r0") for k in (k1, k2)}
    worker.kill()
    worker = await start_worker(cfg, pds_account, tmp_path / "worker2.log", procs)
    k4 = await app.send("after the restart", conversation=new_tid())
    rec, content = await app.wait_status(f"{k4}.r0", {"complete", "error"}, timeout=WAIT)
    assert rec.status == "complete" and "after the restart" in text_of(content)
    assert alive(worker)
    assert {k: await app.get(f"{k}.r0") for k in (k1, k2)} == before
    assert len(model_server.requests) == 3
    assert "Traceback" not in worker.log_path.read_text()


async def wait_final(app: App, worker: WorkerProc, rkey: str) -> tuple[MessageRecord, PlainContent | None]:
    """The reply once complete or error; fails at once, with the log, when the worker exits."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        assert alive(worker), f"the worker exited ({worker.proc and worker.proc.returncode}):\n" + \
            worker.log_path.read_text()[-3000:]
        got = await app.reply(rkey)
        if got is not None and got[0].status in ("complete", "error"):
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"reply {rkey} did not end within {WAIT} s")


async def test_the_message_met_in_backfill_after_a_restart_is_answered_once(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    # the restart loop: the message is owed when the process starts, so its
    # backfill meets it first (before the fix: PANIC, exit 1, 5.5 s into every backfill)
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    big = await upload_text(app, (b"y" * 1023 + b"\n") * 1024)
    k1 = await send_files(app, new_tid(), "read these", [(big, f"f{i}.txt") for i in range(100)])
    model_server.enqueue(Turn(text="I read them."))
    worker = await start_worker(cfg, pds_account, tmp_path / "worker.log", procs)
    rec, content = await wait_final(app, worker, f"{k1}.r0")
    assert rec.status == "complete" and text_of(content) == "I read them."
    [request] = model_server.requests
    assert json.dumps(request.body).count("y" * 1023) == 1024  # the text once
    k2 = await app.send("a normal question", conversation=new_tid())
    rec, content = await wait_final(app, worker, f"{k2}.r0")
    assert rec.status == "complete" and text_of(content) == "You said: a normal question"
    assert worker.terminate() == 0

    # the next start owes nothing: it neither asks the model again nor rewrites a reply
    before = {k: await app.get(f"{k}.r0") for k in (k1, k2)}
    worker = await start_worker(cfg, pds_account, tmp_path / "worker2.log", procs)
    k3 = await app.send("still there?", conversation=new_tid())
    rec, content = await wait_final(app, worker, f"{k3}.r0")
    assert rec.status == "complete" and text_of(content) == "You said: still there?"
    assert len(model_server.requests) == 3
    assert {k: await app.get(f"{k}.r0") for k in (k1, k2)} == before
    assert [await app.replies_of(k) for k in (k1, k2)] == [[f"{k1}.r0"], [f"{k2}.r0"]]
    assert worker.terminate() == 0
    assert "PANIC" not in (tmp_path / "worker.log").read_text() + (tmp_path / "worker2.log").read_text()


PAGES = [Citation(f"https://pages.example/{'section/' * 16}page-{i:05d}?ref=search&lang=en",
                  f"Page {i:05d} of the search results, a title of some length") for i in range(40_000)]


async def test_a_stream_of_11_mb_events_neither_ends_the_worker_nor_its_next_turn(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    # the Responses API repeats every annotation in its closing events: 40,000 citations
    # make events of ~11 MB, whose garbage filled LuaJIT's 64 MB before the next push
    # (before the fix: PANIC, exit 1). No progress writes: with 40,000 events that each
    # leave the reply's parts as they were, maybe_progress rebuilds them at every event
    # (minutes; not what this test is about)
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0], 0,
                       extra=f"""
[providers.oai]
adapter = "openai-responses"
base_url = "{model_server.url}/v1"
max_retries = 0
""")
    worker = await start_worker(cfg, pds_account, tmp_path / "worker.log", procs)
    model_server.enqueue(Turn(text="Here is what the web says.", searches=["everything"], citations=PAGES,
                              chunk_size=8))
    gen = {"attempt": 0, "model": {"provider": "oai", "id": "gpt-5"}}
    conv = new_tid()
    k1 = await app.send("tell me everything", conversation=conv, generation=gen)
    rec, content = await wait_final(app, worker, f"{k1}.r0")
    assert rec.status == "complete" and text_of(content) == "Here is what the web says."
    assert content is not None and len([p for p in content.parts if isinstance(p, SourcePart)]) == 256
    k2 = await app.send("thanks", conversation=conv, parent=f"{k1}.r0", generation=gen)
    rec, content = await wait_final(app, worker, f"{k2}.r0")
    assert rec.status == "complete" and text_of(content) == "You said: thanks"
    assert worker.terminate() == 0

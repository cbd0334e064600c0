"""``gelbridge demo``: the whole path on one machine, with no account anywhere.

A throwaway reference PDS (installed on first use, with progress), an account with an
app password, a fresh keyring, the local model server (echo model) behind the built-in
``openai`` adapter, a sealed conversation record and user message written the way a
chat app would, the real worker (firehose source) answering it, and the opened
conversation printed at the end. Everything is stopped and deleted afterwards (unless
``--keep DIR``: then the config, keyring and state stay there for ``gelbridge status``).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import DevPds, create_account
from gelbridge._dev.snippets import account_toml, model_toml
from gelbridge._errors import GelbridgeError
from gelbridge._pds import PdsClient
from gelbridge._records import (
    CONVERSATION_COLLECTION,
    MESSAGE_COLLECTION,
    AtUri,
    MessageRecord,
    PlainContent,
    TextPart,
    new_tid,
    now_datetime,
)
from gelbridge._runtime import Runtime
from gelbridge._sealing import Keyring, content_of, seal_content
from gelbridge._terminal import safe_text

PASSWORD_ENV = "GELBRIDGE_DEMO_APP_PASSWORD"
INSTRUCTIONS = "You are a friendly assistant in an end-to-end encrypted chat."


class DemoError(GelbridgeError):
    kind = "server_error"


class _Indented:
    """A text stream that indents every line (the worker's start-up output)."""

    def __init__(self, out: IO[str], prefix: str = "      ") -> None:
        self.out, self.prefix = out, prefix

    def write(self, s: str) -> int:
        for line in s.splitlines(keepends=True):
            self.out.write(self.prefix + line if line.strip() else line)
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def demo_config(pds_url: str, handle: str, model_url: str, base: Path) -> str:
    """A config file equivalent to the demo's settings (kept with ``--keep``)."""
    account = account_toml(pds_url, handle, password_env=PASSWORD_ENV, keyring=str(base / "keyring.json"),
                           state=str(base / "state"), keyring_made=True)
    model = model_toml(model_url, tools=(), model_id="echo-1", instructions=INSTRUCTIONS, every_wire=False)
    return f"# written by 'gelbridge demo'\n{account}\n{model}\n[replies]\nupdate_interval = 2\n"


async def _converse(
    settings: Settings, pds_url: str, handle: str, password: str, app_password: str,
    keyring: Keyring, key_id: str, text: str, timeout: float, out: IO[str],
    then: Callable[[dict[str, Any], PdsClient], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """The worker answers one sealed message; ``then(result, app)`` runs while the worker
    still serves (``gelbridge demo --chat``)."""
    runtime = Runtime(settings, keyrings={settings.accounts_list()[0].label: keyring},
                      environ={PASSWORD_ENV: app_password})
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(runtime.run(stop, ready=ready, out=_Indented(out)))
    try:
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task in done:
            task.result()
            raise DemoError("the worker stopped during start-up")
        if not ready.is_set():
            raise DemoError("the worker did not get ready within 60 s")
        [account] = runtime.router
        worker = account.worker
        for src in runtime.intake.sources.values():
            await asyncio.wait_for(src.connected.wait(), 30)

        async with PdsClient(pds_url) as app:  # the chat app, with the owner's password
            await app.login(handle, password)
            did = app.did
            conv = new_tid()
            instr = seal_content(PlainContent(parts=[TextPart(text=INSTRUCTIONS)]),
                                 uri=AtUri(did, CONVERSATION_COLLECTION, conv), key_id=key_id, keyring=keyring)
            await app.put_record(CONVERSATION_COLLECTION, conv, {
                "$type": CONVERSATION_COLLECTION, "createdAt": now_datetime(), "instructions": instr.to_value(),
            })
            rkey = new_tid()
            uri = AtUri(did, MESSAGE_COLLECTION, rkey)
            sealed = seal_content(PlainContent(parts=[TextPart(text=text)]), uri=uri, key_id=key_id, keyring=keyring)
            print(f"[5/5] the app writes a sealed message {rkey} (conversation {conv}); waiting for the reply ...",
                  file=out, flush=True)
            t_commit = time.monotonic()
            await app.put_record(MESSAGE_COLLECTION, rkey, {
                "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
                "content": sealed.to_value(), "generation": {"attempt": 0}, "createdAt": now_datetime(),
            })
            reply_key = f"{rkey}.r0"
            claimed_ms: float | None = None
            deadline = t_commit + timeout
            rec: MessageRecord | None = None
            raw: dict[str, Any] = {}
            while time.monotonic() < deadline:
                got = await app.get_record(MESSAGE_COLLECTION, reply_key)
                if got is not None:
                    if claimed_ms is None:
                        claimed_ms = (time.monotonic() - t_commit) * 1000
                    raw = got[1]
                    rec = MessageRecord.from_value(raw)
                    if rec.status in ("complete", "error", "cancelled", "awaitingApproval"):
                        break
                await asyncio.sleep(0.05)
            else:
                raise DemoError(f"no finished reply within {timeout:.0f} s; see the log above")
            done_ms = (time.monotonic() - t_commit) * 1000
            assert rec is not None
            reply_content = content_of(rec.content, uri=AtUri(did, MESSAGE_COLLECTION, reply_key), keyring=keyring)
            user_content = content_of(sealed, uri=uri, keyring=keyring)
            await worker.wait_idle(10)
            res = {
                "conversation": conv, "user": user_content, "reply": reply_content, "record": rec,
                "sealed_bytes": len(raw.get("content", {}).get("ciphertext", {}).get("$bytes", "")),
                "claimed_ms": claimed_ms, "done_ms": done_ms,
                "turn": worker.reports[-1].timing if worker.reports else None,
                "message": rkey, "reply_rkey": reply_key,
            }
            if then is not None:
                await then(res, app)
            return res
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        except Exception:  # noqa: BLE001 - shutting down: the first error already surfaced
            pass


def _texts(content: PlainContent) -> str:
    return "".join(p.text for p in content.parts if isinstance(p, TextPart))


def run_demo(*, text: str, timeout: float = 120.0, keep_dir: Path | None = None, out: IO[str] = sys.stdout,
             read_line: Callable[[str], Awaitable[str | None]] | None = None) -> None:
    """Run the demo; prints friendly progress to ``out``. Raises GelbridgeError on failure.
    With ``read_line`` (``--chat``), the chat goes on interactively in the same
    conversation (``gelbridge chat``) until the input ends."""

    def say(line: str) -> None:  # the messages' text: shown, never obeyed
        print(safe_text(line), file=out, flush=True)

    say("gelbridge demo: a local PDS, a sealed chat message, the worker and a local echo model\n")
    base = Path(keep_dir).expanduser().resolve() if keep_dir else Path(tempfile.mkdtemp(prefix="gelbridge-demo-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoError(f"--keep {base}: cannot make that folder ({e.strerror}); pick another") from None
    pds = DevPds(progress=sys.stderr)
    server = ModelServer()
    try:
        say("[1/5] starting a local reference PDS (the first run installs it with npm: a few minutes) ...")
        t0 = time.monotonic()
        pds.start(timeout=300)
        say(f"      PDS ready at {pds.pds_url} ({time.monotonic() - t0:.1f} s)")
        handle = f"demo{secrets.token_hex(3)}.test"
        password = secrets.token_urlsafe(12)
        acct = create_account(pds.pds_url, handle, password)
        say(f"[2/5] account {acct.handle} ({acct.did}) with an app password for gelbridge")
        keyring = Keyring()
        key_id = keyring.add_new()
        keyring.save(base / "keyring.json")
        say(f"[3/5] a fresh conversation key {key_id} in {base / 'keyring.json'}")
        server.start()
        (base / "gelbridge.toml").write_text(demo_config(pds.pds_url, acct.handle, server.url, base))
        settings = Settings.model_validate({
            "account": {"pds": pds.pds_url, "identifier": acct.handle, "password_env": PASSWORD_ENV},
            "state": {"dir": str(base / "state")},
            "defaults": {"model": {"provider": "local", "id": "echo-1"}, "instructions": INSTRUCTIONS},
            "providers": {"local": {"adapter": "openai", "base_url": server.url + "/v1"}},
            "replies": {"update_interval": 2.0},
            "worker": {"shutdown_grace": 5.0},
        })
        say(f"[4/5] starting the worker (local echo model at {server.url}, adapter 'openai'):")
        def summary(res: dict[str, Any]) -> None:
            rec = res["record"]
            say("")
            say(f"conversation {res['conversation']} (opened with key {key_id}; on the PDS both messages are ciphertext):")
            say(f"  user       {_texts(res['user'])}")
            model = f"{rec.model.provider}/{rec.model.id}" if rec.model else "?"
            say(f"  assistant  {_texts(res['reply'])}")
            say(f"             [{rec.status}, {model}, finish {rec.finish_reason or '-'}]")
            if rec.status == "error" and rec.error is not None:
                say(f"  error: {rec.error.kind}: {rec.error.message}")
            say("")
            claimed = f"{res['claimed_ms']:.0f} ms" if res["claimed_ms"] is not None else "-"
            say(f"timings: message commit → reply claimed {claimed}, → reply complete {res['done_ms']:.0f} ms")
            t = res["turn"]
            if t is not None:
                read = f"{t.read_ms:.0f} ms" if t.read_ms is not None else "-"
                say(f"         turn: queue {t.queue_ms:.0f} ms, PDS reads {read}, bridge {t.bridge_ms:.1f} ms, "
                    f"model {t.model_ms:.0f} ms, PDS writes {t.write_ms:.0f} ms")

        async def chat_on(res: dict[str, Any], app: PdsClient) -> None:
            from gelbridge._chat_client import ChatClient
            from gelbridge._cli.send import chat

            summary(res)
            say("\nthe chat goes on in the same conversation (the worker and the echo model keep running):")
            client = ChatClient(app, keyring, key_id, conversation=res["conversation"], parent=res["reply_rkey"],
                                last_message=res["message"])
            assert read_line is not None
            await chat(settings, None, timeout, read_line, out, client=client)

        res = asyncio.run(_converse(settings, pds.pds_url, acct.handle, password, acct.app_password,
                                    keyring, key_id, text, timeout, out, then=chat_on if read_line else None))
        rec = res["record"]
        if read_line is None:
            summary(res)
        if keep_dir:
            say(f"\nkept {base}: try 'gelbridge status --config {base / 'gelbridge.toml'}'"
                " (the PDS itself is gone)")
        if rec.status != "complete":
            raise DemoError(f"the reply ended with status {rec.status}")
    finally:
        server.stop()
        pds.stop()
        if not keep_dir:
            shutil.rmtree(base, ignore_errors=True)

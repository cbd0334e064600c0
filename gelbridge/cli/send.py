"""``gelbridge send``: talk to the bot as a chat app would.

It writes one sealed user message into the account's repo (a new conversation, or the
next turn of ``--conversation``), waits for the reply record and prints its text as it
streams in (the record's progress updates), then exits: 0 for a complete reply (or one
waiting for approval), 1 for an error or cancelled reply, with its error on stderr.
It logs in with its own session (never the worker's: refresh tokens are single-use).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gelbridge.cli import app
from gelbridge.errors import ConfigError, GelbridgeError


@app.command("send")
def send_command(
    text: Annotated[str, typer.Argument(help="The message to send.", show_default=False)],
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML configuration file "
                                                   "(or $GELBRIDGE_CONFIG): the account, its keyring.")] = None,
    conversation: Annotated[Optional[str], typer.Option("--conversation", help="Continue this conversation "
                                                        "(its rkey); default: a new one.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final reply record, opened, as JSON.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the reply.")] = 300.0,
) -> None:
    """Send a sealed message as a chat app would, and print the reply as it streams in.

    The message is sealed with the keyring's first key and asks for a reply; a running
    'gelbridge run' (or any gelbridge serving the account) answers it. Prints the
    conversation and message keys on stderr, so '--conversation' can continue it.
    """
    from gelbridge.config import load_config

    settings = load_config(config)
    code = asyncio.run(_send(settings, text, conversation, as_json, timeout))
    raise typer.Exit(code)


async def _send(settings: Any, text: str, conversation: str | None, as_json: bool, timeout: float) -> int:
    import os

    from gelbridge.identity import pds_url_of
    from gelbridge.pds import PdsClient
    from gelbridge.records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart, new_tid, now_datetime
    from gelbridge.records.models import MessageRecord
    from gelbridge.sealing import content_of, seal_content
    from gelbridge.worker.service import load_keyring

    acct = settings.for_account(settings.accounts_list()[0]) if settings.accounts else settings
    a = acct.account
    if not a.identifier:
        raise ConfigError("set [account] identifier (a handle or DID; or GELBRIDGE_IDENTIFIER)")
    password = os.environ.get(a.password_env)
    if not password:
        raise ConfigError(f"no app password: set ${a.password_env}")
    ring = load_keyring(acct)
    if len(ring) == 0:
        raise ConfigError("the keyring holds no key: add one with 'gelbridge keys new --keyring FILE'")
    key_id = sorted(ring)[0]
    async with PdsClient(await pds_url_of(a.pds, a.identifier, acct.identity)) as pds:
        await pds.login(a.identifier, password)
        conv = conversation or new_tid()
        parent = await _last_reply(pds, conv) if conversation else None
        k = new_tid()
        uri = AtUri(pds.did, MESSAGE_COLLECTION, k)
        value: dict[str, Any] = {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user", "generation": {"attempt": 0},
            "createdAt": now_datetime(),
            "content": seal_content(PlainContent(parts=[TextPart(text=text)]), uri=uri, key_id=key_id,
                                    keyring=ring).to_value(),
        }
        if parent is not None:
            value["parent"] = parent
        await pds.put_record(MESSAGE_COLLECTION, k, value)
        print(f"sent {k} in conversation {conv}; waiting for the reply (up to {timeout:g} s)", file=sys.stderr)
        rkey = f"{k}.r0"
        reply_uri = AtUri(pds.did, MESSAGE_COLLECTION, rkey)
        shown = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = await pds.get_record(MESSAGE_COLLECTION, rkey)
            if got is not None:
                rec = MessageRecord.from_value(got[1], uri=str(reply_uri))
                try:
                    content = content_of(rec.content, uri=reply_uri, keyring=ring)
                    now_text = "".join(p.text for p in content.parts if isinstance(p, TextPart))
                except GelbridgeError:
                    content, now_text = None, shown
                if not as_json and now_text.startswith(shown) and len(now_text) > len(shown):
                    sys.stdout.write(now_text[len(shown):])
                    sys.stdout.flush()
                    shown = now_text
                if rec.status in ("complete", "awaitingApproval", "error", "cancelled"):
                    return _finish(rec, content, as_json, shown)
            await asyncio.sleep(0.5)
    print(f"error: no reply within {timeout:g} s: is 'gelbridge run' serving this account?", file=sys.stderr)
    return 1


def _finish(rec: Any, content: Any, as_json: bool, shown: str) -> int:
    if as_json:
        out = rec.to_value()
        if content is not None:
            out["content"] = content.to_value()
        print(json.dumps(out, indent=2, ensure_ascii=False))
    elif shown:
        print()
    if rec.status == "awaitingApproval":
        print("the reply waits for your approval of a tool call (answer it in your chat app)", file=sys.stderr)
    if rec.status in ("error", "cancelled"):
        why = f"{rec.error.kind}: {rec.error.message}" if rec.error is not None else rec.status
        print(f"error: the reply ended {rec.status} ({why})", file=sys.stderr)
        return 1
    return 0


async def _last_reply(pds: Any, conversation: str) -> str | None:
    """The newest reply of ``conversation``: the parent of its next message."""
    from gelbridge.records import MESSAGE_COLLECTION

    best: tuple[str, str] | None = None
    async for r in pds.iter_records(MESSAGE_COLLECTION):
        v = r.value
        if isinstance(v, dict) and v.get("conversation") == conversation and v.get("role") == "assistant":
            when = str(v.get("createdAt") or "")
            if best is None or when > best[0]:
                best = (when, r.rkey)
    return best[1] if best is not None else None

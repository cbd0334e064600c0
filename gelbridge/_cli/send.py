"""``gelbridge send`` and ``gelbridge chat``: talk to the bot as a chat app would
(:mod:`gelbridge._chat_client`).

``send`` writes one sealed user message (a new conversation, or the next turn of
``--conversation``), prints the reply's text as it streams in and exits: 0 for a complete
reply (or one waiting for approval), 1 for an error or cancelled reply, with its error on
stderr. ``chat`` is the interactive version: a prompt, replies streaming in, waiting tool
calls shown with approve/deny questions, ``/regen``, ``/new``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gelbridge._cli._app import app
from gelbridge._errors import GelbridgeError
from gelbridge._terminal import safe_json, safe_line, safe_text

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML configuration file "
                                                   "(or $GELBRIDGE_CONFIG): the account, its keyring.")]
ConversationOpt = Annotated[str | None, typer.Option("--conversation", help="Continue this conversation "
                                                        "(its rkey); default: a new one.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each reply.")]
GrantOpt = Annotated[bool | None, typer.Option(
    "--grant/--no-grant", show_default=False,
    help="Pair with the bridge as an app on another machine would (PROTOCOL.md §6): a new conversation "
         "gets a fresh key in your keyring, granted to the bridge key published in the repo, whose "
         "fingerprint is pinned on first use. Default: [client] grant.")]
BridgeOpt = Annotated[str | None, typer.Option(
    "--bridge", metavar="KID", help="The bridge key to grant to, when the repo publishes several "
                                    "(default: [client] bridge, the pinned one, or the only one).")]
FingerprintOpt = Annotated[str | None, typer.Option(
    "--fingerprint", metavar="FP", help="The bridge key's fingerprint as its operator gave it ('gelbridge keys "
                                        "bridge-show'): only that key is trusted, and pinned (default: [client] "
                                        "fingerprint; without it, the first key seen is pinned).")]
RepinOpt = Annotated[bool, typer.Option(
    "--repin", help="Trust the bridge key now published although it differs from the pinned one "
                    "(only after checking its fingerprint with the bridge's operator).")]


@app.command("send")
def send_command(
    text: Annotated[str, typer.Argument(help="The message to send.", show_default=False)],
    config: ConfigOpt = None,
    conversation: ConversationOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final reply record, opened, as JSON.")] = False,
    timeout: TimeoutOpt = 300.0,
    grant: GrantOpt = None,
    bridge: BridgeOpt = None,
    fingerprint: FingerprintOpt = None,
    repin: RepinOpt = False,
) -> None:
    """Send a sealed message as a chat app would, and print the reply as it streams in.

    The message is sealed with the keyring's first key (with --grant: the conversation's
    own key, granted to the bridge) and asks for a reply; a running 'gelbridge run' (or
    any gelbridge serving the account) answers it. Prints the conversation and message
    keys on stderr, so '--conversation' can continue it.
    """
    import asyncio

    from gelbridge._config import load_config

    settings = load_config(config)
    pairing = Pairing(grant, bridge, repin, fingerprint)
    raise typer.Exit(asyncio.run(_send(settings, text, conversation, as_json, timeout, pairing)))


@dataclass(frozen=True)
class Pairing:
    """The key-grant options of ``send`` and ``chat``."""

    grant: bool | None = None
    bridge: str | None = None
    repin: bool = False
    fingerprint: str | None = None


async def _login(settings: Any, pairing: Pairing, notice: Callable[[str], None]) -> Any:
    from gelbridge._chat_client import ChatClient, PairingChoice

    choice = PairingChoice(pairing.bridge, pairing.repin, pairing.fingerprint)
    return await ChatClient.login(settings, os.environ, grant=pairing.grant, pairing=choice, notice=notice)


async def _send(settings: Any, text: str, conversation: str | None, as_json: bool, timeout: float,
                pairing: Pairing = Pairing()) -> int:
    client = await _login(settings, pairing, lambda line: print(safe_line(line), file=sys.stderr))
    try:
        if conversation:
            await client.join(conversation)
        rkey = await client.send(text)
        sealed = (f" (key {client.key_id}, granted to bridge {client.granting.bridge.kid})"
                  if client.granting is not None else "")
        print(safe_line(f"sent {client.last_message} in conversation {client.conversation}{sealed}; waiting for "
                        f"the reply (up to {timeout:g} s)"), file=sys.stderr)
        shown: list[str] = []

        def on_text(delta: str) -> None:
            shown.append(delta)
            if not as_json:
                sys.stdout.write(safe_text(delta))  # the model's text: never a control sequence
                sys.stdout.flush()

        reply = await client.follow(rkey, on_text, timeout)
    finally:
        await client.aclose()
    if reply is None:
        print(f"error: no reply within {timeout:g} s: is 'gelbridge run' serving this account?", file=sys.stderr)
        return 1
    if as_json:
        out = reply.record.to_value()
        if reply.content is not None:
            out["content"] = reply.content.to_value()
        print(safe_json(out))
    elif shown:
        print()
    if reply.status == "awaitingApproval":
        print("the reply waits for your approval of a tool call (answer it in your chat app, or with "
              "'gelbridge chat --conversation ...')", file=sys.stderr)
    return _ended_badly(reply, sys.stderr)


def _ended_badly(reply: Any, err: Any) -> int:
    if reply.status in ("error", "cancelled"):
        e = reply.record.error
        why = f"{e.kind}: {e.message}" if e else reply.status  # anyone who can write the record chose it
        print(safe_line(f"error: the reply ended {reply.status} ({why})"), file=err)
        return 1
    return 0


CHAT_HELP = ("Type a message and press Enter. /regen asks again for the last answer, /new starts a new "
             "conversation, /rotate gives it a new key (with --grant), /quit (or Ctrl-D) leaves.")


@app.command("chat")
def chat_command(
    config: ConfigOpt = None,
    conversation: ConversationOpt = None,
    timeout: TimeoutOpt = 300.0,
    grant: GrantOpt = None,
    bridge: BridgeOpt = None,
    fingerprint: FingerprintOpt = None,
    repin: RepinOpt = False,
) -> None:
    """Chat with the bot interactively, as a chat app would.

    Replies stream in as the worker updates them. A tool call that needs your approval
    is shown with its input and a y/n question; the answer goes back as the protocol's
    approval message. /regen asks again for the last answer (a new attempt), /new
    starts a new conversation, /rotate gives it a new key granted to the bridge (with
    --grant; the history still opens), /quit or Ctrl-D leaves.
    """
    import asyncio

    from gelbridge._config import load_config

    settings = load_config(config)
    pairing = Pairing(grant, bridge, repin, fingerprint)
    try:
        raise typer.Exit(asyncio.run(chat(settings, conversation, timeout, _stdin_line, sys.stdout,
                                          pairing=pairing)))
    except KeyboardInterrupt:
        print(file=sys.stdout)
        raise typer.Exit(130) from None


async def _stdin_line(prompt: str) -> str | None:
    """One line from stdin (None at its end), read in a daemon thread: Ctrl-C cancels the
    wait at once (a ``to_thread`` read would hold the shutdown until Enter)."""
    import asyncio

    sys.stdout.write(prompt)
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    got: asyncio.Future[str] = loop.create_future()

    def deliver(line: str) -> None:
        if not got.done():
            got.set_result(line)

    def read() -> None:
        line = sys.stdin.readline()
        try:
            loop.call_soon_threadsafe(deliver, line)
        except RuntimeError:  # the loop is gone: the chat ended meanwhile
            pass

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    line = await got
    return line.rstrip("\r\n") if line else None  # "": end of input


async def chat(settings: Any, conversation: str | None, timeout: float,
               read_line: Callable[[str], Awaitable[str | None]], out: Any, *, client: Any = None,
               pairing: Pairing = Pairing()) -> int:
    """The chat loop; ``read_line(prompt)`` returns a line, or None at the end of input.
    ``client``: a logged-in :class:`~gelbridge._chat_client.ChatClient` to use (and not
    close; ``gelbridge demo --chat``), else one logs in for ``settings``."""
    def say(line: str = "") -> None:  # every line names what a record says: shown, never obeyed
        print(safe_line(line), file=out, flush=True)

    owned = client is None
    if client is None:
        client = await _login(settings, pairing, say)
    try:
        if conversation:
            await client.join(conversation)
        say(f"chatting as {client.pds.session.handle if client.pds.session else '?'} in conversation "
            f"{client.conversation}. {CHAT_HELP}")
        waiting = None
        while True:
            try:
                if waiting is not None and waiting.waiting_calls():
                    answers = await _ask_approvals(waiting, read_line, say)
                    if answers is None:
                        return 0
                    rkey = await client.answer_approvals(waiting, answers)
                else:
                    line = await read_line("you> ")
                    if line is None:
                        say()
                        return 0
                    cmd = line.strip()
                    if not cmd:
                        continue
                    if cmd in ("/quit", "/exit", "/q"):
                        return 0
                    if cmd in ("/help", "/?"):
                        say(CHAT_HELP)
                        continue
                    if cmd == "/new":
                        say(f"new conversation {client.new_conversation()}")
                        continue
                    if cmd == "/rotate":
                        say(f"new key {await client.rotate()} for this conversation, granted to bridge "
                            f"{client.granting.bridge.kid}; the earlier messages still open with their keys")
                        continue
                    if cmd == "/regen":
                        rkey = await client.regenerate()
                    elif cmd.startswith("/"):
                        say(f"unknown command {cmd.split()[0]}: {CHAT_HELP}")
                        continue
                    else:
                        rkey = await client.send(line)
                waiting = await _show_reply(client, rkey, timeout, out, say)
            except GelbridgeError as e:  # the PDS is down, say: the chat goes on
                say(f"error: {e}")
                waiting = None
    finally:
        if owned:
            await client.aclose()


async def _show_reply(client: Any, rkey: str, timeout: float, out: Any, say: Callable[[str], None]) -> Any:
    out.write("bot> ")
    out.flush()

    def on_text(delta: str) -> None:
        out.write(safe_text(delta))
        out.flush()

    reply = await client.follow(rkey, on_text, timeout)
    say("")
    if reply is None:
        say(f"(no reply within {timeout:g} s: is 'gelbridge run' serving this account?)")
        return None
    model = reply.record.model
    tag = f"{model.provider}/{model.id}" if model is not None else ""
    if reply.status in ("error", "cancelled"):
        e = reply.record.error
        say(f"[{reply.status}{f', {e.kind}: {e.message}' if e else ''}]")
    else:
        attempt = rkey.rsplit(".r", 1)[1]
        say(f"[{reply.status}{', ' + tag if tag else ''}{', attempt ' + attempt if attempt != '0' else ''}]")
    return reply


async def _ask_approvals(reply: Any, read_line: Callable[[str], Awaitable[str | None]],
                         say: Callable[[str], None]) -> dict[str, tuple[bool, str | None]] | None:
    """One y/n question per waiting call; None at the end of input (nothing is sent)."""
    answers: dict[str, tuple[bool, str | None]] = {}
    for call in reply.waiting_calls():
        say(f"tool call {call.tool} wants to run with {call.input}")
        while True:
            line = await read_line("approve? [y]es / [n]o (n <reason>): ")
            if line is None:
                say("")
                return None
            word, _, reason = line.strip().partition(" ")
            if word.lower() in ("y", "yes"):
                answers[call.call_id] = (True, None)
                break
            if word.lower() in ("n", "no"):
                answers[call.call_id] = (False, reason.strip() or None)
                break
    return answers

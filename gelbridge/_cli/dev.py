"""``gelbridge dev ...``: developer tools: ``dev pds`` runs a local reference PDS with an
account on it (``dev account`` makes more), ``dev model`` the local model server,
``dev postgres`` a local PostgreSQL."""

from __future__ import annotations

import json
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer

from gelbridge._cli._app import app
from gelbridge._dev._tool_mode import Mode
from gelbridge._dev.snippets import MODEL_KEY_ENV, PASSWORD_ENV
from gelbridge._errors import GelbridgeError

if TYPE_CHECKING:
    from gelbridge._dev.pds import AccountInfo

dev_app = typer.Typer(
    help="Developer tools: a local reference PDS, model server and PostgreSQL for trying gelbridge offline.",
    no_args_is_help=True,
)
app.add_typer(dev_app, name="dev")


@dev_app.command("pds")
def pds_command(
    port: int = typer.Option(None, "--port", help="PDS port on 127.0.0.1 (default: a free port)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the PDS to start."),
    handle: str = typer.Option("alice.test", "--handle", help="The account to make on it (ends in .test)."),
    no_account: bool = typer.Option(False, "--no-account", help="Make no account."),
    password_env: str = typer.Option(PASSWORD_ENV, "--password-env",
                                     help="The variable the printed [account] reads the app password from."),
) -> None:
    """Run a throwaway reference PDS + PLC on loopback until Ctrl-C / SIGTERM, with an
    account and an app password for gelbridge on it.

    Installs it on first use (npm, a few minutes; cached outside the repo). Prints one
    JSON line {"pds": URL, "plc": URL, "account": {handle, did, password, app_password}}
    on stdout when ready, and on stderr the [account] configuration to paste into
    gelbridge.toml with the app password's export line. Handles end in ".test", no
    invite needed ('gelbridge dev account' makes more); all data is deleted on exit.
    """
    from gelbridge._dev.pds import DevPds

    pds = DevPds()
    made: list[AccountInfo] = []

    def start() -> None:
        pds.start(port=port, timeout=timeout)
        if not no_account:
            made.append(_new_account(pds.pds_url, handle))

    def ready() -> dict[str, Any]:
        return {"pds": pds.pds_url, "plc": pds.plc_url, **({"account": _account_json(made[0])} if made else {})}

    def hint() -> str:
        running = f"dev PDS running at {pds.pds_url} (PLC {pds.plc_url}); Ctrl-C to stop (its data goes with it)"
        if not made:
            return f"{running}\nmake an account: gelbridge dev account --pds {pds.pds_url} --handle alice.test"
        return f"{running}\n\n{_account_hint(pds.pds_url, made[0], password_env)}"

    _serve_until_signal("the dev PDS", pds, start, ready, hint)


@dev_app.command("account")
def account_command(
    pds: str = typer.Option(..., "--pds", help="The dev PDS's URL (the \"pds\" of 'gelbridge dev pds')."),
    handle: str = typer.Option(None, "--handle", help="Its handle, ending in .test (default: a new one)."),
    password_env: str = typer.Option(PASSWORD_ENV, "--password-env",
                                     help="The variable the printed [account] reads the app password from."),
) -> None:
    """Make an account with an app password for gelbridge on a running dev PDS.

    Prints one JSON line {"pds": URL, "account": {handle, did, password, app_password}}
    on stdout, and on stderr the [account] configuration to paste into gelbridge.toml
    with the app password's export line.
    """
    acct = _new_account(pds, handle or f"user{secrets.token_hex(3)}.test")
    print(json.dumps({"pds": pds, "account": _account_json(acct)}), flush=True)
    print(_account_hint(pds, acct, password_env), file=sys.stderr)


def _new_account(pds_url: str, handle: str) -> AccountInfo:
    """An account (a random owner password) and its app password "gelbridge"; a bare
    name gets ".test"."""
    from gelbridge._dev.pds import create_account

    handle = handle if "." in handle else f"{handle}.test"
    return create_account(pds_url.rstrip("/"), handle, secrets.token_urlsafe(16))


def _account_json(acct: AccountInfo) -> dict[str, str]:
    return {"handle": acct.handle, "did": acct.did, "password": acct.password, "app_password": acct.app_password}


def _account_hint(pds_url: str, acct: AccountInfo, password_env: str) -> str:
    from gelbridge._dev.snippets import account_toml

    return (f"account {acct.handle} ({acct.did}) with an app password for gelbridge; for gelbridge.toml:\n\n"
            f"{account_toml(pds_url, acct.handle, password_env=password_env)}\n"
            f"and in the shell that runs 'gelbridge run' and 'gelbridge chat':\n\n"
            f"export {password_env}={acct.app_password}\n")


@dev_app.command("model")
def model_command(
    port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: a free port)."),
    mode: Mode = typer.Option(Mode.TOOLS, "--mode",
                             help="tools: a message saying 'call NAME ...' gets that tool call, then an answer "
                                  "with its result; echo: every answer repeats the last message."),
    api_key: str = typer.Option(None, "--api-key", help="Require this key in each provider's auth header "
                                f"(the printed tables read it from ${MODEL_KEY_ENV})."),
    chunk_size: int = typer.Option(16, "--chunk-size", min=1, help="Characters per streamed piece."),
    chunk_delay: float = typer.Option(0.0, "--chunk-delay", min=0.0,
                                      help="Seconds between streamed pieces (to watch a reply stream in)."),
    models: str = typer.Option(None, "--models", help="Comma-separated model ids to offer (default: any id); "
                               "listings and lookups name only these, a chat with another gets the provider's 404."),
) -> None:
    """Run the local model server on loopback until Ctrl-C / SIGTERM: one model behind
    the real wire formats of OpenAI (Chat Completions and Responses), Anthropic, Gemini
    and Ollama.

    Prints one JSON line {"url": URL, "mode": MODE, "providers": {name: {adapter,
    base_url}}} on stdout when ready, and on stderr the [defaults] and [providers.*]
    configuration to paste into gelbridge.toml. In the tools mode a message such as
    "call current_time", "call fetch_url https://example.com" or "call NAME key=value"
    (or a JSON object) makes the model ask for that call, so that 'gelbridge chat' can
    approve it; with the result it answers "NAME returned: ...". Other messages are echoed.
    """
    from gelbridge._dev.model_server import ModelServer, responder
    from gelbridge._dev.snippets import model_toml, provider_tables

    offered = [m.strip() for m in models.split(",") if m.strip()] if models else None
    server = ModelServer(port=port, api_key=api_key, chunk_size=chunk_size, record_requests=False,
                         responder=responder(mode, chunk_delay), models=offered)
    key_env = MODEL_KEY_ENV if api_key else None

    def start() -> None:
        try:
            server.start()
        except OSError as e:
            raise GelbridgeError(f"cannot listen on 127.0.0.1:{port} ({e.strerror or e}): another 'gelbridge "
                                 "dev model' may be running; pass --port 0 for a free port") from None

    def hint() -> str:
        key = f"\nand in the shell that runs 'gelbridge run':\n\nexport {MODEL_KEY_ENV}={api_key}\n" if api_key else ""
        tools = ("\nIn a chat, say \"call current_time\" or \"call fetch_url https://example.com\": the model asks "
                 "for that tool call\n(fetch_url waits for your approval), then answers with its result.\n"
                 if mode is Mode.TOOLS else "")
        return (f"dev model server ({mode.value} mode) running at {server.url}; Ctrl-C to stop. For gelbridge.toml:\n\n"
                f"{model_toml(server.url, api_key_env=key_env)}{key}{tools}")

    _serve_until_signal(
        "the dev model server", server, start,
        lambda: {"url": server.url, "mode": mode.value, "providers": provider_tables(server.url, key_env)}, hint)


@dev_app.command("postgres")
def postgres_command(
    port: int = typer.Option(None, "--port", help="Port on 127.0.0.1 (default: a free port)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for PostgreSQL to start."),
) -> None:
    """Run a throw-away PostgreSQL cluster on loopback until Ctrl-C / SIGTERM.

    Uses the machine's PostgreSQL (apt-installs it when missing; the initdb'd template is
    cached outside the repo). Prints one JSON line {"url": URL} on stdout when ready: put
    it in [state] url (or GELBRIDGE_STATE_URL) to share state between workers. Trust
    auth on 127.0.0.1 only; all data is deleted on exit.
    """
    from gelbridge._dev.postgres import DevPostgres

    pg = DevPostgres()
    _serve_until_signal(
        "the dev PostgreSQL", pg, lambda: pg.start(port=port, timeout=timeout), lambda: {"url": pg.url},
        lambda: f"dev PostgreSQL running at {pg.url}; Ctrl-C to stop")


def _serve_until_signal(what: str, server: Any, start: Callable[[], object], ready: Callable[[], dict[str, Any]],
                        hint: Callable[[], str]) -> None:
    """Start ``server``, print its one JSON ready line, run until SIGINT/SIGTERM or until
    it exits by itself (exit 1), then stop it (its data goes with it)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        start()
        print(json.dumps(ready()), flush=True)
        print(hint(), file=sys.stderr)
        while not stop.wait(0.5):
            if not server.running:
                print(f"error: {what} exited unexpectedly", file=sys.stderr)
                raise typer.Exit(1)
    finally:
        server.stop()
        for s, h in old.items():
            signal.signal(s, h)

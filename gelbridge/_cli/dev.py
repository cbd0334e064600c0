"""``gelbridge dev ...``: developer tools: ``dev pds`` runs a local reference PDS, ``dev postgres`` a local PostgreSQL."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import typer

from gelbridge._cli import app

dev_app = typer.Typer(
    help="Developer tools: a local reference PDS and PostgreSQL for trying gelbridge offline.",
    no_args_is_help=True,
)
app.add_typer(dev_app, name="dev")


@dev_app.command("pds")
def pds_command(
    port: int = typer.Option(None, "--port", help="PDS port on 127.0.0.1 (default: a free port)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the PDS to start."),
) -> None:
    """Run a throwaway reference PDS + PLC on loopback until Ctrl-C / SIGTERM.

    Installs it on first use (npm, a few minutes; cached outside the repo). Prints one
    JSON line {"pds": URL, "plc": URL} on stdout when ready. Accounts: handles end in
    ".test", no invite needed; all data is deleted on exit.
    """
    from gelbridge._dev.pds import DevPds

    pds = DevPds()
    _serve_until_signal(
        "the dev PDS", pds, lambda: pds.start(port=port, timeout=timeout),
        lambda: {"pds": pds.pds_url, "plc": pds.plc_url},
        lambda: f"dev PDS running at {pds.pds_url} (PLC {pds.plc_url}); Ctrl-C to stop")


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


def _serve_until_signal(what: str, server: Any, start: Callable[[], object], ready: Callable[[], dict[str, str]],
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

"""``gelbridge dev ...``: developer tools: ``dev pds`` runs a local reference PDS, ``dev postgres`` a local PostgreSQL."""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import FrameType

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

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    pds = DevPds()
    try:
        pds.start(port=port, timeout=timeout)
        print(json.dumps({"pds": pds.pds_url, "plc": pds.plc_url}), flush=True)
        print(f"dev PDS running at {pds.pds_url} (PLC {pds.plc_url}); Ctrl-C to stop", file=sys.stderr)
        while not stop.wait(0.5):
            if not pds.running:
                print("error: the dev PDS exited unexpectedly", file=sys.stderr)
                raise typer.Exit(1)
    finally:
        pds.stop()
        for s, h in old.items():
            signal.signal(s, h)


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

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    pg = DevPostgres()
    try:
        pg.start(port=port, timeout=timeout)
        print(json.dumps({"url": pg.url}), flush=True)
        print(f"dev PostgreSQL running at {pg.url}; Ctrl-C to stop", file=sys.stderr)
        while not stop.wait(0.5):
            if not pg.running:
                print("error: the dev PostgreSQL exited unexpectedly", file=sys.stderr)
                raise typer.Exit(1)
    finally:
        pg.stop()
        for s, h in old.items():
            signal.signal(s, h)

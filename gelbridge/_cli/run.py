"""``gelbridge run`` (the worker), ``gelbridge status`` and ``gelbridge demo``."""

from __future__ import annotations

import logging
import signal
import sys
import time
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gelbridge._cli._app import app, print_error
from gelbridge._seams import Printer

if TYPE_CHECKING:
    from gelbridge._config import Settings
    from gelbridge._fleet import Fleet
    from gelbridge._runtime import Runtime

ConfigOption = typer.Option(None, "--config", "-c",
                            help="TOML configuration file (else $GELBRIDGE_CONFIG, else ./gelbridge.toml).")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (a handler that kept the
    stream of its set-up would write to a closed one after a test runner swapped it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(level: str, fmt: str = "text") -> None:
    """Single-line logs on stderr (never content or keys): text, or one JSON object a line
    (Python's warnings too)."""
    from gelbridge._observability import JsonFormatter
    from gelbridge._terminal import SafeFormatter

    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.captureWarnings(fmt == "json")
    for noisy in ("httpx", "httpcore", "websockets", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def printers(fmt: str) -> tuple[Printer, Printer]:
    """Where a command's own lines go, (stdout, stderr): the streams (what a terminal could
    interpret shown, never obeyed), or with ``json`` each line as one JSON object on the
    same stream (docs/worker.md, Logs)."""
    if fmt != "json":
        from gelbridge._terminal import SafeStream

        return SafeStream(sys.stdout), SafeStream(sys.stderr)
    from gelbridge._observability import JsonLines

    return JsonLines(sys.stdout), JsonLines(sys.stderr, level=logging.WARNING)


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogFormat(str, Enum):
    text = "text"
    json = "json"


LogLevelOption = typer.Option(None, "--log-level", envvar="GELBRIDGE_LOG_LEVEL", case_sensitive=False,
                              help="debug, info, warning or error (default: [logging] level, else info).")
LogFormatOption = typer.Option(None, "--log-format",
                               help="text, or json: one JSON object a line (default: [logging] format).")


def _logging_for(settings: object, level: LogLevel | str | None, fmt: LogFormat | None) -> str:
    """Set up logging as the options and ``[logging]`` say; the format chosen."""
    lc = settings.logging  # type: ignore[attr-defined]
    chosen = level.value if isinstance(level, LogLevel) else level
    fmt_chosen: str = fmt.value if fmt is not None else lc.format
    setup_logging((chosen or lc.level or "info").lower(), fmt_chosen)
    return fmt_chosen


async def _run_until_signal(runner: Runtime | Fleet, out: Printer, notices: Printer) -> None:
    """Run the runtime (one account or many, or a fleet member) until SIGINT/SIGTERM; a
    second signal stops waiting for the grace period."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        if got:  # second signal: stop waiting for the grace period
            raise SystemExit(130)
        got.append(sig)
        print(f"\n{signal.Signals(sig).name}: stopping (grace {runner.settings.worker.shutdown_grace:g} s)...",
              file=notices, flush=True)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await runner.run(stop, out=out)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _checked(config: Path | None, level: LogLevel | str | None, fmt: LogFormat | None, *,
             command: str) -> tuple[Settings, list[str], str]:
    """Read the configuration and run ``gelbridge check``'s checks on it: the file's
    problems and the world's, in one run. Prints each warning and problem (one line each)
    and exits 1 if there are problems. Returns the settings and the summary lines."""
    import asyncio
    import os

    from gelbridge._check import check_config
    from gelbridge._config import read_config

    read = read_config(config)
    fmt_chosen = _logging_for(read.settings, level, fmt)
    _, notices = printers(fmt_chosen)
    rep = asyncio.run(check_config(read, environ=os.environ))
    for w in rep.warnings:
        print(f"warning: {w}", file=notices, flush=True)
    for p in rep.problems:
        print_error(p)
    if len(rep.problems) > 1:
        print(f"{command}: {len(rep.problems)} problems in {read.source}"
              f"{'; nothing was started' if command == 'run' else ''}", file=notices, flush=True)
    if rep.problems:
        raise typer.Exit(1)
    return read.settings, rep.lines, fmt_chosen


@app.command("check")
def check_command(
    config: Path | None = ConfigOption,
    log_level: LogLevel | None = LogLevelOption,
    log_format: LogFormat | None = LogFormatOption,
) -> None:
    """Check the configuration, then exit: the file (every unknown key, every bad value)
    and, in the same run, the world: every provider's adapter and API key, adapter
    directories, default models and tools, keyrings, MCP servers (started and listed),
    and the PDS login (one createSession per account, whatever session the state holds).

    Prints a short summary and exits 0 when all is well (a warning, e.g. a main password
    where an app password belongs, does not fail it); otherwise one line per problem and
    exit code 1. 'gelbridge run' runs the same checks before it opens its state.
    """
    _, lines, fmt = _checked(config, log_level or "warning", log_format, command="check")
    out, _ = printers(fmt)
    for line in lines:
        print(f"  {line}", file=out)
    print("check: ok", file=out, flush=True)


@app.command("run")
def run_command(
    config: Path | None = ConfigOption,
    log_level: LogLevel | None = LogLevelOption,
    log_format: LogFormat | None = LogFormatOption,
) -> None:
    """Watch your PDS and answer every message that asks for a reply (until Ctrl-C / SIGTERM).

    First runs 'gelbridge check''s checks (the login included) and exits 1 on any
    problem, before it opens its state. Then logs in (the session is kept in the state
    directory), backfills what is owed, then follows the firehose (or polls).
    SIGTERM/Ctrl-C: running replies get [worker] shutdown_grace seconds, then end with
    status error/interrupted.

    With [state] url (PostgreSQL) every 'gelbridge run' given that URL joins one fleet:
    each account is served by one live worker at a time (a lease of [fleet]
    lease_seconds); a worker that stops hands its accounts and unfinished replies over.
    """
    import asyncio

    from gelbridge._runtime import Runtime

    settings, _, fmt = _checked(config, log_level, log_format, command="run")
    out, notices = printers(fmt)
    if settings.state.url:
        names = ", ".join(a.label for a in settings.accounts_list())
        print(f"gelbridge: a fleet worker for {names} via {settings.watch.source}", file=out, flush=True)
    elif settings.accounts or settings.watch.source == "jetstream":
        names = ", ".join(a.label for a in settings.accounts_list())
        print(f"gelbridge: serving {names} via {settings.watch.source}", file=out, flush=True)
    if settings.state.url:  # a fleet: the workers with this state URL share the accounts (docs/scale.md)
        from gelbridge._fleet import Fleet

        asyncio.run(_run_until_signal(Fleet(settings), out, notices))
        return
    # one account or many, firehose, poll or Jetstream: the same runtime (docs/architecture.md)
    asyncio.run(_run_until_signal(Runtime(settings), out, notices))


def _fmt_time(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@app.command("status")
def status_command(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Show the worker's cursor, replies in flight, recent errors and turn timings."""
    import asyncio

    from gelbridge._config import load_config
    from gelbridge._errors import StateError
    from gelbridge._runtime.status import status_report
    from gelbridge._state import DB_FILENAME, open_state

    settings = load_config(config)
    db = settings.state_dir / DB_FILENAME
    if not settings.state.url and not db.exists():
        print(f"no state yet at {db}: 'gelbridge run' has not run with this configuration")
        raise typer.Exit(1)
    async def report() -> dict[str, Any]:
        async with await open_state(settings) as store:
            return await status_report(settings, store)

    try:
        rep = asyncio.run(report())
    except StateError as problem:
        print_error(str(problem))
        raise typer.Exit(1) from None
    from contextlib import redirect_stdout
    from typing import IO, cast

    from gelbridge._terminal import SafeStream, safe_json

    if as_json:
        print(safe_json(rep))
        return
    with redirect_stdout(cast(IO[str], SafeStream(sys.stdout))):  # record keys, handles, error text
        _print_status(rep)


def _print_status(rep: dict[str, Any]) -> None:
    print(f"state     {rep['state']}")
    print(f"source    {rep['source']}")
    fleet = rep.get("fleet")
    if fleet is not None:
        live = ", ".join(f"{m['member']} ({m['left']:.0f} s left)" for m in fleet["members"]) or "none"
        print(f"fleet     {len(fleet['members'])} live worker(s): {live}")
    for acct in rep["accounts"]:
        _print_account(acct)
    print(f"recent errors ({len(rep['errors'])})")
    errors = [[_fmt_time(e["at"]), e["kind"], e["record"] or "-", e["where"] or ""] for e in rep["errors"]]
    for line in _columns(errors, "<<<<"):
        print(f"  {line}")


def _print_account(acct: dict[str, Any]) -> None:
    name = f"{acct['name']}: " if acct["name"] and acct["name"] != acct["handle"] else ""
    print(f"account   {name}{acct['handle'] or '?'} ({acct['did'] or 'not logged in yet'}) on {acct['pds'] or '?'}")
    if "lease" in acct:
        lease = acct["lease"]
        held = (f"{lease['owner']} (lease epoch {lease['epoch']}, {lease['left']:.0f} s left)"
                if lease and lease["owner"] else "nobody right now (free, or its worker died: taken within the lease)")
        print(f"  served by {held}")
    print(f"  cursor    {acct['cursor'] if acct['cursor'] is not None else '-'}")
    pts, budget = acct["points"], acct["budget"]
    line = f"  points    {pts['last_hour']} in the last hour, {pts['last_day']} in the last day (this bot's writes)"
    if budget and budget.get("remaining") is not None:
        limit = f" of {budget['limit']}" if budget.get("limit") else ""
        reset = f", resets {_fmt_time(budget['reset_at'])}" if budget.get("reset_at") else ""
        line += f"; the PDS said {budget['remaining']}{limit} left at {_fmt_time(budget['seen_at'])}{reset}"
    print(line)
    grants = acct.get("grants")
    if grants is not None:
        print(f"  grants    {grants['honoured']} honoured, {grants['ignored']} ignored "
              f"(key grants, as of {_fmt_time(grants['at'])})")
    print(f"  in flight {len(acct['in_flight'])}")
    flight = [[c["reply"], c["status"], f"claimed {_fmt_time(c['since'])}"] for c in acct["in_flight"]]
    for line in _columns(flight, "<<<"):
        print(f"    {line}")
    head = ["reply", "status", "queue", "read", "bridge", "model", "write", "total", "points"]
    rows = [[t["reply"], t["status"], *(_ms(t.get(k)) for k in ("queue_ms", "read_ms", "bridge_ms", "model_ms",
                                                                "write_ms", "total_ms")),
             str(t["points"]) if t.get("points") is not None else "-"]  # older rows: not measured ("-")
            for t in acct["turns"]]
    title, *lines = _columns([head, *rows], "<<>>>>>>>")
    print(f"  recent turns ({len(acct['turns'])}), times in ms")
    if rows:
        print(f"    {title}")
    for line in lines:
        print(f"    {line}")


def _ms(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def _columns(rows: list[list[str]], align: str) -> list[str]:
    """``rows`` as lines of columns as wide as their widest cell (``align``: ``<`` or
    ``>`` per column), two spaces apart."""
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(align))]
    return ["  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(r, align, widths, strict=True)).rstrip()
            for r in rows]


@app.command("demo")
def demo_command(
    text: str = typer.Option("Hello from an encrypted chat!", "--text", help="The user message to send."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the reply."),
    keep_dir: Path | None = typer.Option(None, "--keep", help="Keep the demo's state and config in this directory."),
    log_level: str = typer.Option("warning", "--log-level", help="Worker log level."),
    chat: bool = typer.Option(False, "--chat", help="Then go on chatting in the same conversation "
                              "('gelbridge chat' against the demo's worker) until /quit or Ctrl-D."),
) -> None:
    """Run the whole path on this machine: a local PDS, an account, a sealed message, the
    worker, a local echo model, and print the opened conversation. No account needed."""
    from gelbridge._dev.demo import run_demo

    setup_logging(log_level)
    t0 = time.monotonic()
    if chat:
        from gelbridge._cli.send import _stdin_line

        run_demo(text=text, timeout=timeout, keep_dir=keep_dir, out=sys.stdout, read_line=_stdin_line)
    else:
        run_demo(text=text, timeout=timeout, keep_dir=keep_dir, out=sys.stdout)
    print(f"demo finished in {time.monotonic() - t0:.1f} s")

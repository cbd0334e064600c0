"""The ``gelbridge`` command line.

Each command group lives in its own module and registers itself on ``app``.
Errors derived from ``GelbridgeError`` end the command with one clear line on
stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from gelbridge._errors import GelbridgeError

app = typer.Typer(
    name="gelbridge",
    help=(
        "Answer end-to-end encrypted chat records in your atproto repo with an AI model.\n\n"
        "Offline: 'keys', 'open', 'convert', 'reply', 'adapters'. "
        "Online: 'check' checks a configuration, 'run' watches your PDS and answers, 'status' shows how it goes; "
        "'demo' runs everything locally; 'dev pds', 'dev model' run a local PDS and model to try it by hand."
    ),
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # help texts name config sections like [worker]: no rich tags
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"gelbridge {version('gelbridge')}")
        except PackageNotFoundError:  # running from a tree that is not installed
            print("gelbridge (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
) -> None:
    """Answer end-to-end encrypted chat records in your atproto repo with an AI model."""


def print_error(message: str) -> None:
    """One error line on stderr: ``error: message``, or one JSON object (level ``error``)
    once a command has set up JSON logs (``--log-format json``). An error may quote a
    record or a server's answer: what a terminal could interpret is shown, never obeyed."""
    import logging

    from gelbridge._observability import JsonFormatter
    from gelbridge._terminal import safe_text

    handlers = logging.getLogger().handlers
    if any(isinstance(h.formatter, JsonFormatter) for h in handlers):
        rec = logging.LogRecord("gelbridge", logging.ERROR, "", 0, message, (), None)
        print(JsonFormatter().format(rec), file=sys.stderr, flush=True)
    else:
        print(f"error: {safe_text(message)}", file=sys.stderr, flush=True)


# Command modules register themselves on `app` when imported.
from gelbridge._cli import _modules  # noqa: E402,F401


def _printable_streams() -> None:
    """A terminal or pipe that cannot encode a character (``PYTHONIOENCODING=ascii``, a C
    locale) gets it as a backslash escape instead of a UnicodeEncodeError mid-reply."""
    import io

    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def main() -> None:
    """Console-script entry point."""
    _printable_streams()
    try:
        app()
    except GelbridgeError as e:
        print_error(str(e))
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before a command's own signal handling
        print_error("interrupted")
        raise SystemExit(130) from None

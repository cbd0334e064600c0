"""The ``gelbridge`` command line.

Each command group lives in its own module and registers itself on ``app``.
Errors derived from ``GelbridgeError`` end the command with one clear line on
stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from gelbridge.errors import GelbridgeError

app = typer.Typer(
    name="gelbridge",
    help=(
        "Answer end-to-end encrypted chat records in your atproto repo with an AI model.\n\n"
        "Offline: 'keys', 'open', 'convert', 'reply', 'adapters'. "
        "Online: 'run' watches your PDS and answers; 'demo' runs everything locally."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # help texts name config sections like [worker]: no rich tags
)

# Command modules register themselves on `app` when imported.
from gelbridge.cli import _modules  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except GelbridgeError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None

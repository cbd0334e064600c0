"""The typer ``app`` every command module registers on, and the one way a command
prints an error. Below the command modules (and ``gelbridge._cli``, which imports them
all), so that none of them imports the package that imports it."""

from __future__ import annotations

import sys

import typer

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

"""The ``gelbridge`` command line.

Each command group lives in its own module and registers itself on ``app``
(``_app.py``, below them all); importing this package imports every one of them.
Errors derived from ``GelbridgeError`` end the command with one clear line on
stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

from gelbridge._cli._app import app, print_error
from gelbridge._errors import GelbridgeError

__all__ = ["app", "main", "print_error"]

# Command modules register themselves on `app` when imported (after `app` is bound
# here: _cli/run.py still imports it from this package).
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

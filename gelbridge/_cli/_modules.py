"""Imports every command module so that it registers on the app (one line each)."""
from gelbridge._cli import (
    adapters,  # noqa: E402,F401
    dev,  # noqa: E402,F401
    keys,  # noqa: E402,F401
    records,  # noqa: E402,F401
    reply,  # noqa: E402,F401
    run,  # noqa: E402,F401
    send,  # noqa: E402,F401
)

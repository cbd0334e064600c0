"""Imports every command module so that it registers on the app (one line each)."""
from gelbridge.cli import keys  # noqa: E402,F401
from gelbridge.cli import records  # noqa: E402,F401
from gelbridge.cli import reply  # noqa: E402,F401
from gelbridge.cli import adapters  # noqa: E402,F401
from gelbridge.cli import run  # noqa: E402,F401
from gelbridge.cli import dev  # noqa: E402,F401
from gelbridge.cli import send  # noqa: E402,F401

"""The public API is exactly what ``gelbridge.__all__`` names; each name resolves to
the object its module defines, lazily (``import gelbridge`` loads none of them)."""

from __future__ import annotations

import subprocess
import sys

import gelbridge

PUBLIC = [
    "AccountMixup", "Bridge", "BridgeClosed", "BridgeOverloaded", "ChatClient", "ConfigError", "FirehoseError",
    "GelbridgeError", "IncomingRecord", "JetstreamSource", "Keyring", "RecordFilter", "Settings", "load_config",
    "rewound", "subscribe_url", "__version__",
]


def test_the_exported_names_are_pinned() -> None:
    assert gelbridge.__all__ == PUBLIC  # a change here is a change of the public API: update docs/library.md


def test_every_exported_name_resolves_to_its_definition() -> None:
    from gelbridge.bridge import Bridge
    from gelbridge.chat_client import ChatClient

    for name in PUBLIC:
        assert getattr(gelbridge, name) is not None
    assert gelbridge.Bridge is Bridge and gelbridge.ChatClient is ChatClient


def test_importing_gelbridge_loads_no_heavy_module() -> None:
    code = ("import sys, gelbridge; heavy = [m for m in ('gelbridge.bridge', 'gelbridge.worker', 'lupa', 'httpx') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"

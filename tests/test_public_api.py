"""The public API is exactly what ``gelbridge.__all__`` names (plus the Lux IR types in
``gelbridge.lux``); each name resolves to the object its module defines, lazily
(``import gelbridge`` loads none of them); every other module is private, and what the
docs and examples teach imports only public names."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import gelbridge

PUBLIC = [
    "AccountMixup", "AdapterError", "Bridge", "BridgeClosed", "BridgeOverloaded", "ChatClient", "ConfigError",
    "EventOutcome", "FirehoseError", "GelbridgeError", "IncomingRecord", "JetstreamSource", "Keyring", "ModelClient",
    "ModelResult", "ModelTiming", "ProviderError", "RecordFilter", "ReplyStatus", "Settings", "Worker", "load_config",
    "rewound", "subscribe_url", "__version__",
]
PUBLIC_MODULES = {"gelbridge", "gelbridge.__main__", "gelbridge.lux"}
REPO = Path(__file__).resolve().parents[1]


def test_the_exported_names_are_pinned() -> None:
    assert gelbridge.__all__ == PUBLIC  # a change here is a change of the public API: update docs/library.md


def test_every_exported_name_resolves_to_its_definition() -> None:
    from gelbridge._bridge import Bridge
    from gelbridge._chat_client import ChatClient

    for name in PUBLIC:
        assert getattr(gelbridge, name) is not None
    assert gelbridge.Bridge is Bridge and gelbridge.ChatClient is ChatClient


def test_every_other_module_is_private() -> None:
    modules = ["gelbridge"] + [m.name for m in pkgutil.walk_packages(gelbridge.__path__, "gelbridge.")]
    public = [m for m in modules if not any(part.startswith("_") for part in m.split(".")[1:])]
    assert len(modules) > 80 and sorted(public) == sorted(PUBLIC_MODULES - {"gelbridge.__main__"})


def test_the_docs_and_examples_import_only_public_names() -> None:
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*.py"))]
    imports = 0
    for path in texts:
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\s*from (gelbridge[\w.]*) import (.+)", line)
            if m is None:
                continue
            imports += 1
            assert m.group(1) in PUBLIC_MODULES, f"{path.name}: {line.strip()}"
            if m.group(1) == "gelbridge":
                names = [n.strip() for n in m.group(2).split("#")[0].strip("() ").split(",") if n.strip()]
                assert set(names) <= set(PUBLIC), f"{path.name}: {line.strip()}"
    assert imports >= 5


def test_importing_gelbridge_loads_no_heavy_module() -> None:
    code = ("import sys, gelbridge; heavy = [m for m in ('gelbridge._bridge', 'gelbridge._worker', 'lupa', 'httpx') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"

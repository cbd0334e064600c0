"""Each command imports what it runs and nothing more.

Every command runs as a whole process, as a user's shell runs it; when it ends, a small
wrapper writes the names in ``sys.modules`` (everything the process loaded, at start and
while it ran). Each command has the heavy modules it must not load, with the reason,
and a few it must load (so a wrapper that recorded nothing could not pass). What the
imports cost is measured in ``scripts/bench_cli_startup.py`` (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "conversation"
RECORDS = EXAMPLE / "records.json"
KEYRING = EXAMPLE / "keyring.json"
MESSAGE = "3mbd36vbls22b"  # the last user message of the example

WRAPPER = """
import json, os, sys
from gelbridge._cli import main
try:
    main()
finally:
    with open(os.environ["STARTUP_TEST_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
"""

#: none of the commands below needs these (each is loaded only by what its reason names)
NEVER = {
    "atproto_client": "the atproto SDK's XRPC client (~1 s): gelbridge speaks XRPC itself (_pds.py)",
    "atproto_subscription": "firehose frames (it imports atproto_client): only a running firehose source",
    "websockets": "firehose / Jetstream sockets: only a running source",
    "prometheus_client": "metrics: only with [observability] listen",
    "opentelemetry": "traces: only with [observability] traces",
    "psycopg": "shared state: only with [state] url",
    "mcp": "MCP tool servers: only when [mcp.servers] are configured",
}
#: what the offline commands that call no model need none of
NO_MODEL = {
    "httpx": "no request is made",
    "lupa": "no adapter runs",
    "gelbridge._adapters": "no adapter runs",
    "gelbridge._transport": "no request is made",
}
#: what '--help' needs none of: typer reads the commands' signatures, not their bodies
NOT_FOR_HELP = {
    "gelbridge._worker": "the worker runs in 'run', 'convert' and 'reply' only",
    "gelbridge._config": "no configuration is read",
    "gelbridge._records": "no record is read",
    "gelbridge._sealing": "nothing is opened or sealed",
    "gelbridge.lux": "no request is built",
    "pydantic": "no record or configuration is validated",
    "nacl": "nothing is opened or sealed",
}


def run_command(args: list[str], tmp_path: Path, env: Mapping[str, str] | None = None) -> set[str]:
    """Run ``gelbridge <args>`` in a fresh interpreter; the modules it loaded."""
    out = tmp_path / "modules.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    environ.update(env or {}, STARTUP_TEST_MODULES=str(out))
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(out.read_text()))


def loaded(modules: set[str], forbidden: Mapping[str, str]) -> dict[str, str]:
    """The entries of ``forbidden`` that the process loaded (the package or any module in it)."""
    return {name: why for name, why in forbidden.items()
            if any(m == name or m.startswith(name + ".") for m in modules)}


def test_help_loads_only_typer_and_the_command_modules(tmp_path: Path) -> None:
    modules = run_command(["--help"], tmp_path)
    assert {"typer", "gelbridge._cli.records", "gelbridge._cli.run"} <= modules
    assert loaded(modules, NEVER | NO_MODEL | NOT_FOR_HELP) == {}


def test_open_loads_the_records_and_sealing_only(tmp_path: Path) -> None:
    modules = run_command(["open", "--keyring", str(KEYRING), str(RECORDS)], tmp_path)
    assert {"gelbridge._sealing", "gelbridge._records.io"} <= modules
    assert loaded(modules, NEVER | NO_MODEL | {
        "gelbridge._worker": "open decrypts records: no turn",
        "gelbridge._config": "open reads no configuration",
    }) == {}


def test_convert_runs_the_worker_turn_without_the_network_stack(tmp_path: Path) -> None:
    modules = run_command(["convert", "--keyring", str(KEYRING), "--message", MESSAGE, str(RECORDS)], tmp_path)
    assert {"gelbridge._worker.offline", "gelbridge._worker.turn", "gelbridge._worker.service"} <= modules
    assert "gelbridge._worker.sources" not in modules and "gelbridge._runtime" not in modules  # no event source
    assert loaded(modules, NEVER | NO_MODEL) == {}


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    srv = ModelServer(api_key="sk-startup").start()
    yield srv
    srv.stop()


def test_reply_calls_the_model_without_the_firehose_stack(tmp_path: Path, model_server: ModelServer) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f'[providers.openai]\nadapter = "openai"\nbase_url = "{model_server.url}/v1"\n'
                   'api_key_env = "STARTUP_TEST_KEY"\n')
    modules = run_command(["reply", "--keyring", str(KEYRING), "--config", str(cfg), "--message", MESSAGE,
                           str(RECORDS)], tmp_path, {"STARTUP_TEST_KEY": "sk-startup"})
    assert len(model_server.requests) == 1
    assert {"gelbridge._worker.offline", "gelbridge._adapters.client", "lupa", "httpx"} <= modules
    assert loaded(modules, NEVER) == {}


@pytest.mark.pds
@pytest.mark.timeout(300)
def test_check_logs_in_without_the_worker(tmp_path: Path, dev_pds: DevPds, pds_account: AccountInfo) -> None:
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f"""
[account]
identifier = "{pds_account.handle}"
pds = "{dev_pds.pds_url}"
password_env = "STARTUP_TEST_PASSWORD"

[keyring]
path = "{KEYRING}"

[state]
dir = "{tmp_path / 'state'}"

[providers.openai]
adapter = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "STARTUP_TEST_KEY"
probe = false                          # nothing answers there: this test is about imports
""")
    modules = run_command(["check", "--config", str(cfg)], tmp_path,
                          {"STARTUP_TEST_PASSWORD": pds_account.app_password, "STARTUP_TEST_KEY": "sk-unused"})
    assert {"gelbridge._check", "gelbridge._pds", "gelbridge._adapters.registry", "httpx"} <= modules
    assert loaded(modules, NEVER | {
        "gelbridge._worker": "check needs each account's keyring and login, not the worker",
    }) == {}

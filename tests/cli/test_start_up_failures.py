"""Every way ``check``, ``run``, ``dev *`` and ``demo`` can fail to start, as real
subprocesses: exit code 1, one ``error:`` line that says what to do, and nothing else on
stderr but log lines (no traceback, no stack of a child server)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.conftest import PASSWORD_ENV
from integration.worker_proc import write_config

from gelbridge._dev.pds import AccountInfo, free_port
from gelbridge._sealing import Keyring
from testkit.processes import without_modules

pytestmark = pytest.mark.timeout(200)

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")
SUMMARY = re.compile(r"^(check|run): \d+ problems in ")  # after two or more error lines


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def config(tmp: Path, extra: str = "") -> Path:
    """A configuration that is right but for ``extra`` and its PDS (a closed port): the
    login check names that too."""
    nobody = AccountInfo(did="", handle="alice.test", password="", app_password="not-a-real-password")
    ring = Keyring()
    ring.add_new("k")
    return write_config(tmp, f"http://127.0.0.1:{free_port()}", nobody, "http://127.0.0.1:9", ring, extra=extra)


def gelbridge(argv: list[str], cwd: Path, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    env.update({PASSWORD_ENV: "not-a-real-password", **env_vars})
    if argv[0] != sys.executable:
        argv = [sys.executable, "-m", "gelbridge", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL)


def failed_with(r: subprocess.CompletedProcess[str], line: str) -> None:
    """Exit 1, ``line`` among the error lines, and stderr holds only error and log lines."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert any(x.startswith("error: ") and line in x for x in lines), r.stderr
    strays = [x for x in lines if x and not x.startswith("error: ") and not LOG_LINE.match(x)
              and not SUMMARY.match(x)]
    assert strays == [], r.stderr
    assert "ready" not in r.stdout


def test_run_with_its_pds_down_says_so_in_one_line(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    failed_with(gelbridge(["run", "--config", str(cfg)], tmp_path), "the PDS at http://127.0.0.1:")


def test_run_with_a_state_dir_that_cannot_be_made_says_so_in_one_line(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    (tmp_path / "state").write_text("")  # [state] dir = "state": a file
    failed_with(gelbridge(["run", "--config", str(cfg)], tmp_path), "[state] dir: ")
    assert (tmp_path / "state").read_text() == ""


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_state_database_that_is_down_stops_check_and_run_in_one_line(command: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    r = gelbridge([command, "--config", str(cfg)], tmp_path,
                  GELBRIDGE_STATE_URL=f"postgresql://gb@127.0.0.1:{free_port()}/gb")
    failed_with(r, "[state] url: state database")


@pytest.mark.parametrize("command", ["check", "run"])
def test_traces_without_the_otel_extra_stop_check_and_run_in_one_line(command: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, "\n[observability]\ntraces = true\n")
    r = gelbridge(without_modules(["opentelemetry"], command, "--config", str(cfg)), tmp_path)
    failed_with(r, "[observability] traces = true needs the otel extra: pip install 'gelbridge[otel]'")


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_listen_port_out_of_range_is_named(command: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, '\n[observability]\nlisten = "127.0.0.1:99999"\n')
    failed_with(gelbridge([command, "--config", str(cfg)], tmp_path),
                "[observability] listen: port 99999 is out of range: 1-65535 (or 0 for any free port)")


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_taken_listen_port_is_found_before_anything_starts(command: str, tmp_path: Path, taken_port: int) -> None:
    cfg = config(tmp_path, f'\n[observability]\nlisten = "127.0.0.1:{taken_port}"\n')
    failed_with(gelbridge([command, "--config", str(cfg)], tmp_path),
                f"[observability] listen: 127.0.0.1:{taken_port} is in use (another gelbridge? pick another port)")
    assert not (tmp_path / "state").exists()


def test_with_json_logs_the_errors_are_json_objects_too(tmp_path: Path, taken_port: int) -> None:
    cfg = config(tmp_path, f'\n[observability]\nlisten = "127.0.0.1:{taken_port}"\n')
    r = gelbridge(["run", "--config", str(cfg), "--log-format", "json"], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    objs = [json.loads(line) for line in r.stderr.splitlines()]
    errors = [o["message"] for o in objs if o["level"] == "error"]
    assert errors[0] == f"[observability] listen: 127.0.0.1:{taken_port} is in use (another gelbridge? pick another port)"
    assert any("the PDS at http://127.0.0.1:" in e for e in errors)  # its PDS (and provider) are closed ports too
    assert objs[-1]["level"] == "warning" and objs[-1]["message"].startswith(f"run: {len(errors)} problems in ")


def test_dev_postgres_without_psycopg_says_which_extra_to_install(tmp_path: Path) -> None:
    r = gelbridge(without_modules(["psycopg"], "dev", "postgres"), tmp_path)
    failed_with(r, "gelbridge dev postgres needs psycopg: pip install 'gelbridge[postgres]'")


@pytest.mark.parametrize("server", ["pds", "postgres"])
def test_dev_servers_on_a_taken_port_say_so_in_one_line(server: str, tmp_path: Path, taken_port: int) -> None:
    failed_with(gelbridge(["dev", server, "--port", str(taken_port)], tmp_path),
                f"--port {taken_port} cannot be used on 127.0.0.1 (Address already in use)")


def test_demo_keeping_its_files_where_no_folder_can_be_made_says_so(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    failed_with(gelbridge(["demo", "--keep", str(tmp_path / "a-file")], tmp_path),
                f"--keep {tmp_path / 'a-file'}: cannot make that folder")

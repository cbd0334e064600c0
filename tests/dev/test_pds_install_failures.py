"""``scripts/pds/install.sh`` on a fresh machine: a slow npm, signals, a timeout, a failing
npm, what a killed run left behind, and a second install waiting for the first.

npm is a stand-in on PATH (the real install downloads ~700 packages and compiles for
minutes): it writes the modules the script's load check needs (``node`` is the real one),
records its pid and that of a "node-gyp" grandchild, and waits as long as told. Every
test has its own ``GELBRIDGE_CACHE``, never the shared one.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gelbridge._dev.pds import SCRIPTS_DIR, DevPdsError, install

pytestmark = pytest.mark.timeout(90)

SCRIPT = SCRIPTS_DIR / "install.sh"
BUNDLE = json.loads((SCRIPTS_DIR / "package.json").read_text())["version"]

FAKE_NPM = r"""#!/usr/bin/env bash
# stand-in for `npm install`: FAKE_NPM_DELAY s before node_modules exists (resolving),
# then the modules, then a node-gyp grandchild for FAKE_GYP_SECONDS; FAKE_NPM_FAIL: fail
set -u
echo $$ >>"$FAKE_PIDS/npm"
echo "npm http fetch GET 200 https://registry.npmjs.org/@atproto%2fdev-env 5ms (cache miss)"
sleep "${FAKE_NPM_DELAY:-0}"
if [ -n "${FAKE_NPM_FAIL:-}" ]; then
  echo "npm error code $FAKE_NPM_FAIL" >&2
  echo "npm error 404 Not Found - GET https://registry.npmjs.org/@atproto%2fdev-env" >&2
  exit 1
fi
mkdir -p node_modules/@atproto/dev-env node_modules/@atproto/pds node_modules/better-sqlite3/build
echo '{"name": "@atproto/pds", "version": "0.0.0-fake"}' >node_modules/@atproto/pds/package.json
echo 'module.exports = {};' >node_modules/@atproto/dev-env/index.js
echo 'module.exports = class { prepare() { return { get: () => ({ 1: 1 }) }; } };' \
  >node_modules/better-sqlite3/index.js
bash -c 'echo $$ >>"$0/gyp"; exec sleep "$1"' "$FAKE_PIDS" "${FAKE_GYP_SECONDS:-0}" &
wait
"""


@dataclass
class Fake:
    """A fresh cache plus the fake npm; ``env`` runs the script against them."""

    root: Path
    env: dict[str, str]

    @property
    def dir(self) -> Path:
        return self.root / "cache" / f"pds-{BUNDLE}"

    def pids(self, name: str) -> list[int]:
        f = self.root / "pids" / name
        return [int(p) for p in f.read_text().split()] if f.exists() else []

    def leftovers(self) -> list[Path]:
        return sorted(self.dir.parent.glob(f"{self.dir.name}.tmp.*"))

    def start(self, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(SCRIPT)], env={**self.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )

    def run(self, timeout: float = 30, **env: str) -> tuple[int, str, str]:
        proc = self.start(**env)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            _stop(proc)
        return proc.returncode, out, err


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pids: list[int], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear within {timeout} s"
        time.sleep(0.05)


def _lock_is_free(fake: Fake) -> bool:
    with open(f"{fake.dir}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "pids").mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM)
    for tool in ("make", "g++"):  # only looked up: the fake npm compiles nothing
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GELBRIDGE_", "FAKE_"))}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}", GELBRIDGE_CACHE=str(tmp_path / "cache"),
        GELBRIDGE_PDS_INSTALL_TICK="1", FAKE_PIDS=str(tmp_path / "pids"),
    )
    f = Fake(tmp_path, env)
    yield f
    for pid in f.pids("npm") + f.pids("gyp"):  # whatever a failed assertion left running
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_npm_resolving_longer_than_a_tick_is_waited_for_with_progress_then_a_rerun_is_instant(fake: Fake) -> None:
    rc, out, err = fake.run(FAKE_NPM_DELAY="3", FAKE_GYP_SECONDS="2")
    assert rc == 0, err
    assert out == f"{fake.dir}\n"  # stdout: only the dir
    lines = err.splitlines()
    assert any("still installing" in line and "resolving" in line for line in lines), err
    assert any("still installing" in line and "compiling better-sqlite3" in line for line in lines), err
    assert "@atproto/pds 0.0.0-fake on Node" in err and "done in" in lines[-1]
    assert (fake.dir / ".gelbridge-installed").is_file() and (fake.dir / "install.log").is_file()
    assert fake.leftovers() == [] and not Path(f"{fake.dir}.install.log").exists()

    t0 = time.monotonic()
    rc, out, err = fake.run()
    assert (rc, out, err) == (0, f"{fake.dir}\n", "") and time.monotonic() - t0 < 5
    assert len(fake.pids("npm")) == 1  # not run again


@pytest.mark.parametrize(("sig", "group"), [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT", "Ctrl-C"])
def test_a_signal_mid_install_stops_npm_and_node_gyp_and_removes_the_temp_dir(
    fake: Fake, sig: int, group: bool
) -> None:
    proc = fake.start(FAKE_GYP_SECONDS="60")
    try:
        _wait_for(fake.root / "pids" / "gyp")
        assert len(fake.leftovers()) == 1
        if group:  # a terminal's Ctrl-C: the script's whole foreground group
            os.killpg(proc.pid, sig)
        else:  # the script alone, as `kill` or a parent's timeout does
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        _stop(proc)
    assert proc.returncode in (-sig, 128 + sig)
    assert _gone(fake.pids("npm") + fake.pids("gyp")), "npm or its node-gyp child still runs"
    name = signal.Signals(sig).name
    last = err.splitlines()[-1]
    assert last.startswith(f"pds install: interrupted ({name}) during npm install") and "re-run: bash " in last
    assert fake.leftovers() == [] and not fake.dir.exists() and _lock_is_free(fake)


def test_the_install_timeout_stops_npm_and_says_which_knob_to_raise(fake: Fake) -> None:
    t0 = time.monotonic()
    rc, out, err = fake.run(FAKE_GYP_SECONDS="60", GELBRIDGE_PDS_INSTALL_TIMEOUT="3")
    assert rc == 1 and out == "" and time.monotonic() - t0 < 20
    last = err.splitlines()[-1]
    assert last.startswith("pds install: npm install failed (not done after 3 s")
    assert "GELBRIDGE_PDS_INSTALL_TIMEOUT" in last and f"log: {fake.dir}.install.log" in last
    assert _gone(fake.pids("npm") + fake.pids("gyp"))
    assert fake.leftovers() == [] and _lock_is_free(fake)


def test_a_failing_npm_says_what_failed_keeps_its_log_and_says_what_to_run(fake: Fake) -> None:
    rc, out, err = fake.run(FAKE_NPM_FAIL="E404")
    assert rc == 1 and out == ""
    log = Path(f"{fake.dir}.install.log")
    last = err.splitlines()[-1]
    assert last == (f"pds install: npm install failed (exit 1: npm error code E404); log: {log}; "
                    f"re-run: bash {SCRIPT}")
    assert "404 Not Found" in log.read_text()
    assert fake.leftovers() == [] and not fake.dir.exists()


def test_what_a_killed_install_left_is_stopped_and_removed_by_the_next_one(fake: Fake) -> None:
    killed = fake.start(FAKE_GYP_SECONDS="60")
    try:
        _wait_for(fake.root / "pids" / "gyp")
        killed.kill()  # SIGKILL: no trap runs; npm and node-gyp live on in their session
        killed.communicate(timeout=10)
    finally:
        _stop(killed)
    stale = Path(f"{fake.dir}.tmp.4194304")  # and an older run's dir, its processes long gone
    (stale / "node_modules").mkdir(parents=True)
    orphans = fake.pids("npm") + fake.pids("gyp")
    assert all(_alive(p) for p in orphans) and len(fake.leftovers()) == 2

    rc, out, err = fake.run()
    assert rc == 0, err
    assert out == f"{fake.dir}\n"
    assert "stopping what an earlier, killed install left running" in err
    assert f"removing {stale}" in err
    assert _gone(orphans) and fake.leftovers() == []


def test_a_second_install_waits_for_the_first_and_leaves_its_temp_dir_alone(fake: Fake) -> None:
    first = fake.start(FAKE_GYP_SECONDS="4")
    try:
        _wait_for(fake.root / "pids" / "gyp")
        rc, out, err = fake.run()
        first_out, first_err = first.communicate(timeout=20)
    finally:
        _stop(first)
    assert first.returncode == 0, first_err
    assert "removing" not in first_err + err and "stopping" not in first_err + err
    assert (rc, out) == (0, f"{fake.dir}\n") and first_out == out
    assert "waiting for another install" in err and len(fake.pids("npm")) == 1


def _in_env(fake: Fake, monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    """This process's environment = the fake's (``install()`` passes its own on)."""
    for k in [k for k in os.environ if k not in fake.env]:
        monkeypatch.delenv(k)
    for k, v in {**fake.env, **extra}.items():
        monkeypatch.setenv(k, v)


def test_install_from_python_reports_the_scripts_line(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    _in_env(fake, monkeypatch, FAKE_NPM_FAIL="E404")
    with open(fake.root / "progress.txt", "w") as progress, pytest.raises(DevPdsError) as failed:
        install(progress=progress)
    assert str(failed.value).startswith("installing the dev PDS failed (exit 1): pds install: npm install failed")
    assert f"log: {fake.dir}.install.log" in str(failed.value)


def test_install_from_python_stops_the_whole_install_on_its_timeout(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    _in_env(fake, monkeypatch, FAKE_GYP_SECONDS="60")
    with open(fake.root / "progress.txt", "w") as progress, pytest.raises(DevPdsError, match="took over 3 s"):
        install(progress=progress, timeout=3)
    assert fake.pids("gyp") and _gone(fake.pids("npm") + fake.pids("gyp"))
    assert fake.leftovers() == [] and _lock_is_free(fake)
    assert "interrupted (SIGTERM)" in (fake.root / "progress.txt").read_text()

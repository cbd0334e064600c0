"""``scripts/setup.sh``: the demo's set (gelbridge, the PDS) and the tests' set (plus the
[test] extra and PostgreSQL), each installed once, and a failed pip said in one line.

It runs on a copy of the repo's scripts in a temp dir with a stand-in ``python3`` (which
records its pip calls) and stand-ins for the PDS and PostgreSQL installers (which record
that they ran), so it takes seconds and leaves the real .venv alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_PYTHON = r"""#!/usr/bin/env bash
# stand-in for python3: -m venv DIR, -m pip ... (recorded; FAKE_PIP_FAIL: the install fails), -c CODE
echo "python $*" >>"$FAKE_LOG"
case "$1 ${2:-}" in
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  "-m pip")
    if [ "$3" = "--version" ]; then echo "pip 23.2.1 from somewhere"; exit 0; fi
    if [[ " $* " == *" -e "* ]]; then echo "Collecting lupa"; sleep "${FAKE_PIP_SECONDS:-0}"; fi
    if [ -n "${FAKE_PIP_FAIL:-}" ] && [[ " $* " == *" -e "* ]]; then
      echo "Looking in links: /opt/wheels"
      echo "ERROR: Could not find a version that satisfies the requirement $FAKE_PIP_FAIL" >&2
      exit 1
    fi ;;
  "-c import sys"*) echo "${FAKE_PY_VERSION:-3.11.7}"; [ -z "${FAKE_PY_VERSION:-}" ] ;;
  "-c "*) [ -z "${FAKE_IMPORT_FAIL:-}" ] || { echo "ModuleNotFoundError: No module named 'lupa'" >&2; exit 1; } ;;
esac
"""

FAKE_INSTALLER = """#!/usr/bin/env bash
echo "{name} install" >>"$FAKE_LOG"
echo {out}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "clone"
    (root / "scripts" / "pds").mkdir(parents=True)
    (root / "scripts" / "postgres").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "scripts" / "pds" / "install.sh").write_text(FAKE_INSTALLER.format(name="pds", out="/cache/pds"))
    (root / "scripts" / "postgres" / "install.sh").write_text(FAKE_INSTALLER.format(name="postgres", out="bin=/x"))
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)
    return root


def _setup(repo: Path, *args: str, **env: str) -> tuple[int, str, str, list[str]]:
    log = repo.parent / "calls.log"
    log.write_text("")
    proc = subprocess.run(
        ["bash", "scripts/setup.sh", *args], cwd=repo, capture_output=True, text=True, timeout=30,
        env={**{k: v for k, v in os.environ.items() if not k.startswith(("GELBRIDGE_", "FAKE_"))},
             "PYTHON": str(repo.parent / "python3"), "FAKE_LOG": str(log), **env},
    )
    calls = [c for c in log.read_text().splitlines() if " -c " not in f"{c} " and "--version" not in c]
    return proc.returncode, proc.stdout, proc.stderr, calls


def test_the_demo_gets_gelbridge_and_the_pds_and_a_later_test_setup_still_gets_the_test_extra(repo: Path) -> None:
    rc, out, err, calls = _setup(repo, "--demo", FAKE_PIP_SECONDS="2", GELBRIDGE_SETUP_TICK="1")
    assert rc == 0, err
    assert out == "/cache/pds\n"  # the PDS dir, as before
    assert "setup: still installing (1 s, 1 packages collected)" in err  # a slow pip is not silent
    assert calls == [
        "python -m venv .venv",
        "python -m pip install --disable-pip-version-check -U pip",
        "python -m pip install --disable-pip-version-check --progress-bar off -e .",
        "pds install",
    ]
    assert "setup: installing gelbridge (editable) and its dependencies into .venv" in err

    rc, _, err, calls = _setup(repo, "--demo")  # installed: only the PDS check
    assert (rc, calls) == (0, ["pds install"]), err

    rc, _, err, calls = _setup(repo)
    assert rc == 0, err
    assert calls == [
        "python -m pip install --disable-pip-version-check -U pip",
        "python -m pip install --disable-pip-version-check --progress-bar off -e .[test]",
        "pds install",
        "postgres install",
    ]
    for args in ((), ("--demo",)):  # the test set includes the demo's
        rc, _, err, calls = _setup(repo, *args)
        assert rc == 0 and "pip" not in " ".join(calls), err

    time.sleep(0.01)
    (repo / "pyproject.toml").touch()  # changed dependencies: installed again
    rc, _, err, calls = _setup(repo, "--demo")
    assert rc == 0 and calls[-2:] == ["python -m pip install --disable-pip-version-check --progress-bar off -e .",
                                      "pds install"], err


def test_a_failed_pip_install_is_one_line_naming_its_log_and_nothing_is_marked_installed(repo: Path) -> None:
    rc, out, err, calls = _setup(repo, FAKE_PIP_FAIL="lupa>=2.2,<3")
    assert rc == 1 and out == ""
    assert err.splitlines()[-1] == (
        "setup: pip install -e '.[test]' failed (exit 1: ERROR: Could not find a version that satisfies the "
        "requirement lupa>=2.2,<3); log: .venv/pip-install.log; re-run: bash scripts/setup.sh"
    )
    assert "Looking in links" in (repo / ".venv" / "pip-install.log").read_text()
    assert "pds install" not in calls and not list((repo / ".venv").glob(".gelbridge-installed*"))

    rc, _, err, calls = _setup(repo, "--demo", FAKE_IMPORT_FAIL="1")
    assert rc == 1 and err.splitlines()[-1].startswith("setup: pip installed, but 'import gelbridge, lupa")
    assert err.splitlines()[-1].endswith("log: .venv/pip-install.log; re-run: bash scripts/setup.sh --demo")


def test_a_python_older_than_3_11_or_one_that_does_not_run_is_refused_with_what_to_set(repo: Path) -> None:
    rc, _, err, calls = _setup(repo, FAKE_PY_VERSION="3.10.13")
    assert rc == 1 and calls == []
    assert err.splitlines()[-1] == (
        "setup: Python 3.10.13 is too old (gelbridge needs >= 3.11): set PYTHON=python3.11 (or newer)"
    )
    rc, _, err, calls = _setup(repo, PYTHON="python3-not-here")
    assert rc == 1 and calls == []
    assert err.splitlines()[-1] == (
        "setup: python3-not-here does not run: install Python >= 3.11, or set PYTHON to one that runs"
    )

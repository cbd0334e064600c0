"""``gelbridge adapters list`` shows a script's load error as text, on a pipe and on a
terminal (rich's colors): what the script put in its error never drives the terminal
and is never read as rich markup."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: A script failing with an error that clears the screen, sets the window title, starts
#: a CSI in C1 form, reverses the text after it, and would be markup to rich.
EVIL = 'error("bad \\27]0;owned\\7\\27[2J\\194\\155\\226\\128\\174x [red]markup[/red]")\n'
RAW = [b"\x1b]0;owned", b"\x07", b"\x1b[2J", "\x9b".encode(), "\u202e".encode()]
SHOWN = "bad ␛]0;owned␇␛[2J<U+009B><U+202E>x [red]markup[/red]"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "evil.lua").write_text(EVIL)
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f'[adapters]\ndirs = ["{scripts}"]\n')
    return cfg


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_") and k not in ("NO_COLOR", "TERM")}
    return {**out, "COLUMNS": "250", "TERM": "xterm-256color"}


def test_a_script_error_is_shown_on_a_pipe(config: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "gelbridge", "adapters", "list", "--config", str(config)],
                       capture_output=True, timeout=60, env=env())
    assert p.returncode == 0, p.stderr
    assert all(raw not in p.stdout for raw in RAW)
    assert SHOWN in p.stdout.decode() and "failed: evil.lua:1:" in p.stdout.decode()


def test_a_script_error_is_shown_on_a_terminal(config: Path) -> None:
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gelbridge", "adapters", "list", "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env(), close_fds=True)
    os.close(child)
    got = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            got += chunk
        assert proc.wait(timeout=10) == 0, got
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    assert b"\x1b[" in got  # rich saw a terminal: its own colors are there
    assert all(raw not in got for raw in RAW)
    text = got.decode()
    assert "failed" in text and SHOWN in text

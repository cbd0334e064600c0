"""Driving gelbridge commands as subprocesses, as a user's shell does."""

from __future__ import annotations

import select
import subprocess
import time


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next stdout line of ``proc`` ("" when none came within ``timeout`` or it exited)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            break
    return ""

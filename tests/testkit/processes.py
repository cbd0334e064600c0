"""Driving gelbridge commands as subprocesses, as a user's shell does."""

from __future__ import annotations

import select
import subprocess
import sys
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


def without_modules(modules: list[str], *args: str) -> list[str]:
    """The command line of ``python -m gelbridge ARGS`` in a process where importing any of
    ``modules`` (and their submodules) fails, as when an optional extra is not installed."""
    shim = (
        "import sys\n"
        "class _NotInstalled:\n"
        f"    names = {tuple(modules)!r}\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in self.names:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NotInstalled())\n"
        f"sys.argv = ['gelbridge', *{list(args)!r}]\n"
        "from gelbridge._cli import main\n"
        "main()\n"
    )
    return [sys.executable, "-c", shim]

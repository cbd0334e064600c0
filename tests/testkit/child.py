"""Running code that may end its own process (a Lua PANIC aborts it) in a child process,
so that a test learns the exit code and stderr instead of dying with it.

The child runs ``code`` with ``python -c`` and the tree under test on its path; it
reports by printing one JSON value per line (``report(value)`` in the child's code), which
the parent reads back as ``ChildRun.reports``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: prepended to every child's code: ``report(value)`` prints one JSON line, flushed
PRELUDE = """\
import json as _json, sys as _sys
def report(value):
    _sys.stdout.write(_json.dumps(value) + "\\n")
    _sys.stdout.flush()
"""


@dataclass
class ChildRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def reports(self) -> list[Any]:
        """The JSON values the child reported, in order."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def describe(self) -> str:
        """For an assertion message: the exit code and the end of stderr."""
        return f"exit code {self.returncode}; stderr:\n{self.stderr[-3000:]}"


def run_child(code: str, *args: str, timeout: float = 120.0, env: dict[str, str] | None = None) -> ChildRun:
    """Run ``code`` (dedented) in a fresh interpreter with ``args`` as ``sys.argv[1:]``."""
    paths = [str(ROOT), str(ROOT / "tests")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(ROOT),
    )
    return ChildRun(proc.returncode, proc.stdout, proc.stderr)

"""No input can take the process down through the sandbox: every entry into Lua with
values near each limit ends in a result or a typed error, never a Lua PANIC.

Pushing an argument into Lua happens outside any protected call; before the room was
checked first, a request larger than the free memory aborted the whole worker
(``PANIC: unprotected error in call to Lua API (not enough memory)``). The cases run in a
child process (``tests/testkit/lua_child.py``) because a PANIC cannot be caught in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.host.conftest import ENGINES

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_entry_near_every_limit_ends_in_a_result_or_a_typed_error(engine: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.testkit.lua_child", engine], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert "PANIC" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    outcomes = {line["case"]: line["outcome"] for line in lines if "case" in line}
    assert lines[-1] == {"done": len(outcomes)}
    assert all(o == "ok" or o.startswith(("violation:", "error:")) for o in outcomes.values()), outcomes
    # What fits is answered; what cannot fit is refused as memory, not as a broken host.
    assert outcomes["request:half"] == "ok"
    for size in ("limit", "limit+1", "double"):
        assert outcomes[f"request:{size}"] == "violation:memory"
        assert outcomes[f"response:{size}"] == "violation:memory"
    assert outcomes["error-body:huge"] == "violation:memory"
    assert outcomes["headers:huge"] == "violation:memory"
    # Garbage of earlier chunks is collected before a push, never mistaken for a full runtime.
    assert {o for c, o in outcomes.items() if c.startswith("stream-garbage:")} == {"ok"}
    assert outcomes["keep:most"] == "ok"
    assert outcomes["request-after-keep:16"] == "ok"
    assert outcomes["string.rep:max"] == "ok"
    assert outcomes["string.rep:max+1"] == "violation:string_size"
    assert outcomes["after-all"] == "ok"

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
    # What fits is answered; what cannot is refused as a limit, not as a broken host.
    for size in ("1MiB", "quarter", "string-1", "string"):
        assert outcomes[f"request:{size}"] == "ok", size
    for size in ("string+1", "memory", "double"):
        assert outcomes[f"request:{size}"] == "violation:string_size"
        assert outcomes[f"response:{size}"] == "violation:string_size"
    assert outcomes["error-body:string+1"] == outcomes["headers:string+1"] == "violation:string_size"
    assert outcomes["error-body:quarter"] == outcomes["stream:quarter"] == "ok"
    # Garbage of earlier chunks is collected before a push, never mistaken for a full runtime.
    assert {o for c, o in outcomes.items() if c.startswith("stream-garbage:")} == {"ok"}
    # Live data the script keeps leaves no room: the push is refused, and a fresh runtime
    # answers the next call (a full one kept would refuse every call from then on).
    assert outcomes["keep:half"] == outcomes["request-after-keep:16"] == "ok"
    assert outcomes["request-after-keep:half-1MiB"] == "violation:memory"
    assert outcomes["request-after-refusal:16"] == "ok"
    assert outcomes["string.rep:max-1"] in ("ok", "violation:memory")  # memory: its copies are 32 MB
    assert outcomes["string.rep:max+1"] == "violation:string_size"
    assert outcomes["after-all"] == "ok"

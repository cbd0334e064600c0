"""A terminal that cannot encode what gelbridge shows (the visible forms of controls,
any non-ASCII text) gets escapes, never a UnicodeEncodeError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"


def test_open_on_an_ascii_only_stdout_prints_escapes_instead_of_failing(tmp_path: Path) -> None:
    records = tmp_path / "records.json"
    text = (EXAMPLE / "records.json").read_text(encoding="utf-8")
    records.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = subprocess.run([sys.executable, "-m", "gelbridge", "--help"], capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    bad = subprocess.run([sys.executable, "-m", "gelbridge", "open", "--keyring", str(tmp_path / "none.json"),
                          str(records)], capture_output=True, env=env, timeout=60)
    assert b"UnicodeEncodeError" not in bad.stderr and b"Traceback" not in bad.stderr
    code = ("import sys; from gelbridge._cli import _printable_streams; _printable_streams(); "
            "print('caf\\u00e9 \\u241b'); print('\\u202e', file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout == b"caf\\xe9 \\u241b\n" and out.stderr == b"\\u202e\n"

#!/usr/bin/env bash
# The lint gate, run by scripts/test.sh before pytest: ruff (pyflakes, bugbear, import
# order, modern syntax; [tool.ruff] in pyproject.toml), mypy on the modules listed in
# [tool.mypy] files, and the layers of the import graph (tests/test_layers.py, a second
# or two; the suite runs it again). All must be clean.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff" >&2
.venv/bin/ruff check gelbridge tests scripts examples
# The turn's modules stay in small phases (issue 24): no function in _worker/, _mapping/ or _runtime/
# above McCabe complexity 15 (ruff's C901 here; tests/test_function_size.py holds them to
# 60 lines each).
echo "lint: complexity (ruff C901, at most 15, in gelbridge/_worker, gelbridge/_mapping and gelbridge/_runtime)" >&2
.venv/bin/ruff check --select C901 --config 'lint.mccabe.max-complexity = 15' gelbridge/_worker gelbridge/_mapping gelbridge/_runtime
echo "lint: mypy" >&2
.venv/bin/mypy
echo "lint: layers" >&2
.venv/bin/python -m pytest tests/test_layers.py -q

#!/usr/bin/env bash
# The lint gate, run by scripts/test.sh before pytest: ruff (pyflakes, bugbear, import
# order, modern syntax; [tool.ruff] in pyproject.toml), mypy on the modules listed in
# [tool.mypy] files, and the layers of the import graph (tests/test_layers.py, a second
# or two; the suite runs it again). All must be clean.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff" >&2
.venv/bin/ruff check gelbridge tests scripts examples
echo "lint: mypy" >&2
.venv/bin/mypy
echo "lint: layers" >&2
.venv/bin/python -m pytest tests/test_layers.py -q

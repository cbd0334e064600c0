#!/usr/bin/env bash
# The lint gate, run by scripts/test.sh before pytest: ruff (pyflakes, bugbear, import
# order, modern syntax; [tool.ruff] in pyproject.toml) and mypy on the modules listed in
# [tool.mypy] files. Both must be clean.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "lint: ruff" >&2
.venv/bin/ruff check gelbridge tests scripts examples
echo "lint: mypy" >&2
.venv/bin/mypy

#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, runs the lint gate
# (ruff, mypy and the layers, scripts/lint.sh), then pytest.
# The PDS integration tests run against the real reference PDS started by the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"

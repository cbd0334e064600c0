#!/usr/bin/env bash
# Install gelbridge and everything its tests need on a fresh machine:
#   - a virtualenv in .venv with gelbridge (editable) and the test dependencies;
#   - the reference PDS + local PLC (npm), cached outside the clone and reused;
#   - the machine's PostgreSQL (apt-installed when missing) with a cached initdb template,
#     for the tests of the shared state backend (scripts/postgres/install.sh).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.gelbridge-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python dependencies" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  .venv/bin/python -c "import gelbridge, lupa, nacl, atproto, httpx, pydantic, typer, psycopg" \
    || { echo "setup: Python dependencies failed to install" >&2; exit 1; }
  touch "$stamp"
fi

if [ "${GELBRIDGE_SKIP_PDS_INSTALL:-}" != "1" ]; then
  bash scripts/pds/install.sh
fi

if [ "${GELBRIDGE_SKIP_POSTGRES_INSTALL:-}" != "1" ]; then
  bash scripts/postgres/install.sh >/dev/null
fi

#!/usr/bin/env bash
# The tests that need no PDS on the other Python versions gelbridge supports (3.12, 3.13),
# each in its own virtualenv (.venv-3.12, .venv-3.13), installed like .venv (by
# scripts/setup.sh). A version that is not on this machine (pyenv or PATH) is skipped, and
# that is said.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local v="$1" p
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python "$(command -v "python$v" || true)"; do
    if [ -n "$p" ] && [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}

rc=0
for v in ${GELBRIDGE_OTHER_PYTHONS:-3.12 3.13}; do
  if ! py="$(find_python "$v")"; then
    echo "test_pythons: Python $v is not on this machine; skipped" >&2
    continue
  fi
  venv=".venv-$v"
  if ! PYTHON="$py" GELBRIDGE_VENV="$venv" GELBRIDGE_SKIP_PDS_INSTALL=1 GELBRIDGE_SKIP_POSTGRES_INSTALL=1 \
      bash scripts/setup.sh; then
    echo "test_pythons: installing into $venv failed (Python $v)" >&2; rc=1; continue
  fi
  echo "test_pythons: Python $v: the tests that need no PDS" >&2
  set +e
  "$venv/bin/python" -m pytest -q -m "not pds" -p no:cacheprovider "$@"
  r=$?
  set -e
  if [ "$r" -ne 0 ]; then echo "test_pythons: Python $v failed (pytest exit $r)" >&2; rc=1; fi
done
exit "$rc"

#!/usr/bin/env bash
# The tests that need no PDS on the other Python versions gelbridge supports (3.12, 3.13),
# each in its own virtualenv (.venv-3.12, .venv-3.13), installed like .venv. A version
# that is not on this machine (pyenv or PATH) is skipped, and that is said.
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
  stamp="$venv/.gelbridge-installed"
  if [ ! -x "$venv/bin/python" ]; then
    echo "test_pythons: creating $venv ($("$py" --version))" >&2
    "$py" -m venv "$venv"
  fi
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "test_pythons: installing into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 \
      | grep -v '^WARNING: Location' >&2 || true
    "$venv/bin/python" -c "import gelbridge, lupa, nacl, atproto" || { echo "test_pythons: install failed on $v" >&2; rc=1; continue; }
    touch "$stamp"
  fi
  echo "test_pythons: Python $v: the tests that need no PDS" >&2
  set +e
  "$venv/bin/python" -m pytest -q -m "not pds" -p no:cacheprovider "$@"
  r=$?
  set -e
  if [ "$r" -ne 0 ]; then echo "test_pythons: Python $v failed (pytest exit $r)" >&2; rc=1; fi
done
exit "$rc"

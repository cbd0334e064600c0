#!/usr/bin/env bash
# gelbridge's main job on embedded defaults, on a fresh machine: installs what it needs
# (scripts/setup.sh --demo: gelbridge and the reference PDS; not the test tools, not
# PostgreSQL), then `gelbridge demo` starts a local PDS and a local model endpoint, writes
# a sealed user message, lets the worker answer it, and prints the opened conversation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo >/dev/null
exec .venv/bin/gelbridge demo "$@"

#!/usr/bin/env bash
# Sets up and runs mcpd in its development default on https://127.0.0.1:9091 with its own
# certificate, token and config under ./dev-state; prints the export lines for linuxctl. The token
# is kept across restarts (--new-token replaces it); a second start while one runs refuses and
# changes nothing. Extra arguments go to `mcpd dev` (--port N, --new-token). `exec`: the shell
# becomes `mcpd dev`, so Ctrl-C, kill or a closed terminal reach it, and nothing it started
# (root helper, front, workers) outlives it, in the foreground or in the background.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/mcpd dev --state-dir ./dev-state "$@"

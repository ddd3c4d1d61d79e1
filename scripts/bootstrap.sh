#!/usr/bin/env bash
# Shared setup for scripts/dev.sh and scripts/test.sh: system packages (when root and missing)
# and a virtual environment in .venv with mcpd installed (editable) plus its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
[ -e /usr/lib/x86_64-linux-gnu/libmagic.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/libmagic.so.1 ] || need_apt+=(libmagic1)
command -v useradd >/dev/null 2>&1 || need_apt+=(passwd)
[ -e /lib/x86_64-linux-gnu/libpam.so.0 ] || [ -e /lib/aarch64-linux-gnu/libpam.so.0 ] || need_apt+=(libpam0g libpam-modules)
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
  else
    echo "missing system packages: ${need_apt[*]} (run as root or install them)" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[test]'

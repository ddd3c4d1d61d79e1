#!/usr/bin/env bash
# Shared setup for scripts/dev.sh and scripts/test.sh: system packages (when root and missing)
# and a virtual environment at .venv with mcpd installed plus its test extras.
# `bootstrap.sh --check` only reports missing system packages (exit 1 when some are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
# ldconfig and useradd live in /sbin and /usr/sbin, which a non-root PATH often lacks.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

need_apt=()
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
ldconfig -p 2>/dev/null | grep 'libmagic\.so\.1' >/dev/null || need_apt+=(libmagic1)  # (not grep -q: under pipefail its early exit makes ldconfig fail with SIGPIPE)
ldconfig -p 2>/dev/null | grep 'libpam\.so\.0' >/dev/null || need_apt+=(libpam0g libpam-modules)
command -v useradd >/dev/null 2>&1 || need_apt+=(passwd)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
# npm fetches the pinned Node 22 and MCP clients of the interoperability tests (tests/support/node_clients.py)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
# the audit log's rotation is tested with the real logrotate and the shipped etc/logrotate.d/mcpd
command -v logrotate >/dev/null 2>&1 || need_apt+=(logrotate)
# the packages' tests inspect the .rpm that scripts/package/build.sh makes (tests/integration/test_package.py)
command -v rpm >/dev/null 2>&1 || need_apt+=(rpm)
# the confirmation page is tested in a real headless browser (tests/integration/test_confirm_browser.py)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v certutil >/dev/null 2>&1 || need_apt+=(libnss3-tools)  # (the browser's trust of the test CA)
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
[ -x /usr/bin/python3 ] || need_apt+=(python3 python3-venv)
if [ "${1:-}" = "--check" ]; then
  if [ "${#need_apt[@]}" -gt 0 ]; then echo "missing system packages: ${need_apt[*]}"; exit 1; fi
  echo "system packages: all present"; exit 0
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
  else
    echo "missing system packages: ${need_apt[*]} (run as root or install them)" >&2
  fi
fi

# Debian's interpreter: workers run as other OS accounts and must be able to execute it (an
# interpreter under /root, such as pyenv's, is not reachable by them). PYTHON overrides.
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e '.[test]'

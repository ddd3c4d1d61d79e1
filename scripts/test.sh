#!/usr/bin/env bash
# Runs the whole test suite (unit, integration against the real daemon over TLS, and, as root,
# the real OS accounts, PAM and root-helper tests). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# As root, the tests run code as other OS accounts (workers, `nobody` probes) from this checkout.
# When they cannot read it (e.g. a clone under /root), run the suite from a readable copy instead.
if [ "$(id -u)" = 0 ] && [ -z "${MCPD_TEST_RELOCATED:-}" ] \
   && ! setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$PWD/mcpd/__init__.py" 2>/dev/null; then
  copy=$(mktemp -d /tmp/mcpd-test-XXXXXX)
  chmod 755 "$copy"
  tar --exclude=./.venv --exclude=./dev-state -cf - . | tar -C "$copy" -xf -
  chmod -R a+rX "$copy"
  echo "checkout not readable by other accounts; running the suite from $copy" >&2
  MCPD_TEST_RELOCATED=1 bash "$copy/scripts/test.sh" "$@" && rc=0 || rc=$?
  rm -rf "$copy"
  exit "$rc"
fi

bash scripts/bootstrap.sh

# The release artefacts: the sdist and the wheel build, and PyPI would accept their metadata.
dist=$(mktemp -d /tmp/mcpd-dist-XXXXXX)
trap 'rm -rf "$dist"' EXIT
.venv/bin/python -m build --outdir "$dist" . >"$dist/build.log" 2>&1 || { cat "$dist/build.log" >&2; exit 1; }
.venv/bin/twine check --strict "$dist"/*.whl "$dist"/*.tar.gz

# With no arguments, the whole suite: every test but the serial ones (those that install mcpd
# system-wide) on MCPD_TEST_JOBS processes (pytest-xdist, a test file to a process, so a module
# runs its tests in order with its fixtures once; 3 by default: most tests wait on
# daemons, accounts and timers rather than the CPU), then the serial ones alone. Arguments: one
# plain pytest run of what they name.
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
rc=0
.venv/bin/python -m pytest -n "${MCPD_TEST_JOBS:-3}" --dist loadfile -m "not serial" || rc=$?
.venv/bin/python -m pytest -m serial || rc2=$?
[ "$rc" = 0 ] && rc=${rc2:-0}
exit "$rc"

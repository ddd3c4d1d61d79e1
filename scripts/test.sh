#!/usr/bin/env bash
# Runs the whole test suite (unit, integration against the real daemon over TLS, and, as root,
# the real OS accounts, PAM and root-helper tests). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"

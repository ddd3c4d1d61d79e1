#!/bin/sh
# acme.sh reload command for mcpd: install the certificate and key acme.sh just issued or
# renewed, then reload mcpd.
#
#   acme.sh --install-cert -d host.example --reloadcmd "/path/to/acme-sh-reloadcmd.sh"
#
# (no --key-file/--fullchain-file: acme.sh would write those in place; this script installs
# atomically with the right owner and mode instead). acme.sh runs the reload command with
# CERT_FULLCHAIN_PATH and CERT_KEY_PATH (its own copies, in ~/.acme.sh/host.example*/) in the
# environment. MCPD_TLS_DIR, MCPD_GROUP, MCPD_RELOAD and MCPD_BIN are passed on to install-pair.sh;
# its exit status is this command's, so acme.sh reports a pair that was refused.
set -eu

: "${CERT_FULLCHAIN_PATH:?run by acme.sh as --reloadcmd (CERT_FULLCHAIN_PATH is not set)}"
: "${CERT_KEY_PATH:?run by acme.sh as --reloadcmd (CERT_KEY_PATH is not set)}"
here=$(dirname "$(readlink -f "$0")")  # beside the script itself, even run through a symlink
installer=${MCPD_INSTALL_PAIR:-$here/install-pair.sh}
exec sh "$installer" "$CERT_FULLCHAIN_PATH" "$CERT_KEY_PATH"

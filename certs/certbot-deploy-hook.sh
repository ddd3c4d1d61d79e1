#!/bin/sh
# certbot deploy hook for mcpd: install the renewed certificate and key, then reload mcpd.
#
#   ln -s /usr/lib/mcpd/certs/certbot-deploy-hook.sh /etc/letsencrypt/renewal-hooks/deploy/mcpd.sh
#   or: certbot certonly ... --deploy-hook /usr/lib/mcpd/certs/certbot-deploy-hook.sh
#
# It runs install-pair.sh from the folder it is in (a symlink to it is followed), or
# MCPD_INSTALL_PAIR when set.
#
# certbot runs deploy hooks as root after each successful issuance or renewal, with
# RENEWED_LINEAGE (the live folder, e.g. /etc/letsencrypt/live/host.example) and RENEWED_DOMAINS
# (its names, space separated) in the environment. When MCPD_DOMAIN is set, only that lineage's
# renewals are installed (certbot runs the hooks in renewal-hooks/deploy for every certificate).
# MCPD_TLS_DIR, MCPD_GROUP, MCPD_RELOAD and MCPD_BIN are passed on to install-pair.sh; its exit
# status is this hook's, so certbot reports a pair that was refused.
set -eu

: "${RENEWED_LINEAGE:?run by certbot as a deploy hook (RENEWED_LINEAGE is not set)}"
if [ -n "${MCPD_DOMAIN:-}" ]; then
    case " ${RENEWED_DOMAINS:-} " in
        *" $MCPD_DOMAIN "*) ;;
        *) exit 0 ;;
    esac
fi
here=$(dirname "$(readlink -f "$0")")  # beside the script itself, even run through a symlink
installer=${MCPD_INSTALL_PAIR:-$here/install-pair.sh}
exec sh "$installer" "$RENEWED_LINEAGE/fullchain.pem" "$RENEWED_LINEAGE/privkey.pem"

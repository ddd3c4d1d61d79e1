#!/bin/sh
# Install a certificate chain and its key for mcpd, then tell mcpd to reload them.
#
#   install-pair.sh FULLCHAIN KEY
#
# Run as root (by certbot-deploy-hook.sh or acme-sh-reloadcmd.sh, or by hand). Each file is
# copied beside its destination with its final owner and mode (certificate 0644, key 0640,
# both root:mcpd) and checked there exactly as the front checks a pair before using it
# (`mcpd certs check`: both parse, the key is the certificate's, the certificate is valid now).
# A pair that fails is refused: exit 1 with the reason, nothing changed, no reload. A good pair
# is renamed over the old one, so the front never reads a half-written file; the pair it
# replaces is kept as server.crt.prev and server.key.prev (same owner and modes). Nothing is
# installed when either source is missing or empty. The exit status is non-zero whenever the
# pair was not installed, or the reload failed, so an ACME client reports it.
#
# Environment (all optional):
#   MCPD_TLS_DIR   destination folder                  [/etc/mcpd/tls]
#   MCPD_GROUP     group that may read the key (the front's)  [mcpd]
#   MCPD_RELOAD    command that tells mcpd              [systemctl reload mcpd, when it is active]
#   MCPD_BIN       the mcpd command that checks the pair [mcpd on PATH, else /usr/sbin/mcpd, else
#                                                        /opt/mcpd/bin/mcpd]
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 FULLCHAIN KEY" >&2
    exit 2
fi
chain=$1
key=$2
dest=${MCPD_TLS_DIR:-/etc/mcpd/tls}
group=${MCPD_GROUP:-mcpd}

for f in "$chain" "$key"; do
    if [ ! -f "$f" ] || [ ! -s "$f" ]; then
        echo "$0: $f is missing or empty: nothing installed" >&2
        exit 1
    fi
done
if [ ! -d "$dest" ]; then
    echo "$0: no folder $dest (install-systemd makes it, 0750 root:$group)" >&2
    exit 1
fi
mcpd=${MCPD_BIN:-}
if [ -z "$mcpd" ]; then
    for candidate in "$(command -v mcpd 2>/dev/null || true)" /usr/sbin/mcpd /opt/mcpd/bin/mcpd; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then mcpd=$candidate; break; fi
    done
fi
if [ -z "$mcpd" ] || [ ! -x "$mcpd" ]; then
    echo "$0: cannot find the mcpd command to check the pair (set MCPD_BIN): nothing installed" >&2
    exit 1
fi

umask 077
tmp_crt=$(mktemp "$dest/.server.crt.XXXXXX")
tmp_key=$(mktemp "$dest/.server.key.XXXXXX")
trap 'rm -f "$tmp_crt" "$tmp_key"' EXIT
cat "$chain" > "$tmp_crt"
cat "$key" > "$tmp_key"
chown "root:$group" "$tmp_crt" "$tmp_key"
chmod 0644 "$tmp_crt"
chmod 0640 "$tmp_key"
if ! why=$("$mcpd" certs check --cert "$tmp_crt" --key "$tmp_key" 2>&1 >/dev/null); then
    echo "$0: $chain and $key refused, nothing installed, the pair in $dest stays: $why" >&2
    exit 1
fi
# The pair in place stays reachable under .prev (a hard link keeps its owner and mode); then
# the new files are renamed over it.
for name in server.crt server.key; do
    if [ -f "$dest/$name" ] && [ ! -L "$dest/$name" ]; then
        ln -f "$dest/$name" "$dest/$name.prev"
    fi
done
mv -f "$tmp_crt" "$dest/server.crt"
mv -f "$tmp_key" "$dest/server.key"
trap - EXIT

if [ -n "${MCPD_RELOAD:-}" ]; then
    sh -c "$MCPD_RELOAD"
elif systemctl is-active --quiet mcpd 2>/dev/null; then
    systemctl reload mcpd
else
    echo "$0: mcpd is not running; it loads the new pair when it starts" >&2
fi

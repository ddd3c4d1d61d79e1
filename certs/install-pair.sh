#!/bin/sh
# Install a certificate chain and its key for mcpd, then tell mcpd to reload them.
#
#   install-pair.sh FULLCHAIN KEY
#
# Run as root (by certbot-deploy-hook.sh or acme-sh-reloadcmd.sh, or by hand). Each file is
# copied beside its destination with its final owner and mode (certificate 0644, key 0640,
# both root:mcpd), then renamed over it, so the front never reads a half-written file. The front
# checks the new pair before it uses it: a bad one is refused with one log line and the pair in
# use stays (`journalctl -u mcpd`). Nothing is installed when either source is missing or empty.
#
# Environment (all optional):
#   MCPD_TLS_DIR   destination folder                  [/etc/mcpd/tls]
#   MCPD_GROUP     group that may read the key (the front's)  [mcpd]
#   MCPD_RELOAD    command that tells mcpd              [systemctl reload mcpd, when it is active]
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

umask 077
tmp_crt=$(mktemp "$dest/.server.crt.XXXXXX")
tmp_key=$(mktemp "$dest/.server.key.XXXXXX")
trap 'rm -f "$tmp_crt" "$tmp_key"' EXIT
cat "$chain" > "$tmp_crt"
cat "$key" > "$tmp_key"
chown "root:$group" "$tmp_crt" "$tmp_key"
chmod 0644 "$tmp_crt"
chmod 0640 "$tmp_key"
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

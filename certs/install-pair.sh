#!/bin/sh
# Install a certificate chain and its key for mcpd, then tell mcpd to reload them.
#
#   install-pair.sh FULLCHAIN KEY
#
# Run as root (by certbot-deploy-hook.sh or acme-sh-reloadcmd.sh, or by hand). The destination
# folder, and every folder above it, must be root's and writable by root alone (a sticky folder
# such as /tmp above it is allowed: nobody else can rename what root put there); else nothing is
# written, exit 1: another account that can write there could plant a symlink for root to
# write through. Each file is copied beside its destination into a new file of a random name
# (mktemp), given its final owner and mode (certificate 0644, key 0640, both root:mcpd; chown -h,
# so no symlink is followed) and checked there exactly as the front checks a pair before using
# it (`mcpd certs check`: both parse, the key is the certificate's, the certificate is valid now).
# A pair that fails is refused: exit 1 with the reason, nothing changed, no reload. A good pair
# is renamed over the old one, certificate then key, so the front never reads a half-written
# file; a front that looks between the two renames sees a key not of the certificate, refuses
# it and keeps the pair it has (a reload) or waits until both files settled (its watcher), and
# should the second rename fail the old certificate is put back. The pair it replaces is kept
# as server.crt.prev and server.key.prev: hard links to the very files (same owner and modes),
# or, when server.crt or server.key is a symlink, a copy of what it points to, with the
# installed owner and mode. Nothing is installed when either source is missing, empty or no
# regular file. Temporary files are removed on any failure or signal. The exit status is
# non-zero whenever the pair was not installed, or the reload failed, so an ACME client reports it.
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
        echo "$0: $f is missing, empty or no regular file: nothing installed" >&2
        exit 1
    fi
done
if [ ! -d "$dest" ]; then
    echo "$0: no folder $dest (install-systemd makes it, 0750 root:$group)" >&2
    exit 1
fi
# The folder as it really is (no symlink left in its name), then it and each folder above it.
real=$(readlink -f -- "$dest")
dir=$real
while :; do
    if ! info=$(stat -c '%u %a' -- "$dir"); then
        echo "$0: cannot look at $dir: nothing installed" >&2
        exit 1
    fi
    owner=${info% *}
    mode=$(( 0${info#* } ))
    if [ "$owner" != 0 ]; then
        echo "$0: $dir is owned by uid $owner, not root: another account could plant a symlink there;" \
             "nothing installed (chown root $dir)" >&2
        exit 1
    fi
    if [ $(( mode & 022 )) -ne 0 ] && { [ "$dir" = "$real" ] || [ $(( mode & 01000 )) -eq 0 ]; }; then
        echo "$0: $dir is writable by its group or every account: another account could plant a symlink" \
             "there; nothing installed (chmod go-w $dir)" >&2
        exit 1
    fi
    [ "$dir" = / ] && break
    dir=$(dirname -- "$dir")
done
dest=$real
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
tmp_crt='' tmp_key='' tmp_prev=''
cleanup() { rm -f -- ${tmp_crt:+"$tmp_crt"} ${tmp_key:+"$tmp_key"} ${tmp_prev:+"$tmp_prev"}; }
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
tmp_crt=$(mktemp -- "$dest/.server.crt.XXXXXX")
tmp_key=$(mktemp -- "$dest/.server.key.XXXXXX")
cat -- "$chain" > "$tmp_crt"
cat -- "$key" > "$tmp_key"
chown -h "root:$group" "$tmp_crt" "$tmp_key"
chmod 0644 "$tmp_crt"
chmod 0640 "$tmp_key"
if ! why=$("$mcpd" certs check --cert "$tmp_crt" --key "$tmp_key" 2>&1 >/dev/null); then
    echo "$0: $chain and $key refused, nothing installed, the pair in $dest stays: $why" >&2
    exit 1
fi
# The pair in place stays reachable under .prev: a hard link keeps its owner and mode; a
# symlink (to a file) is copied, as the file would be installed.
for name in server.crt server.key; do
    if [ -L "$dest/$name" ]; then
        if [ -f "$dest/$name" ]; then
            tmp_prev=$(mktemp -- "$dest/.$name.prev.XXXXXX")
            cat -- "$dest/$name" > "$tmp_prev"
            chown -h "root:$group" "$tmp_prev"
            if [ "$name" = server.key ]; then chmod 0640 "$tmp_prev"; else chmod 0644 "$tmp_prev"; fi
            mv -f -T -- "$tmp_prev" "$dest/$name.prev"
            tmp_prev=''
        fi
    elif [ -f "$dest/$name" ]; then
        ln -f -T -- "$dest/$name" "$dest/$name.prev"
    fi
done
mv -f -T -- "$tmp_crt" "$dest/server.crt"
tmp_crt=''
if ! mv -f -T -- "$tmp_key" "$dest/server.key"; then
    if [ -f "$dest/server.crt.prev" ]; then ln -f -T -- "$dest/server.crt.prev" "$dest/server.crt"; fi
    echo "$0: cannot install the key in $dest: the certificate in place was put back" >&2
    exit 1
fi
tmp_key=''
trap - EXIT HUP INT TERM

if [ -n "${MCPD_RELOAD:-}" ]; then
    sh -c "$MCPD_RELOAD"
elif systemctl is-active --quiet mcpd 2>/dev/null; then
    systemctl reload mcpd
else
    echo "$0: mcpd is not running; it loads the new pair when it starts" >&2
fi

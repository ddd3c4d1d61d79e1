#!/bin/sh
# mcpd package: before its files are removed (deb prerm, rpm %preun). On a removal (not an
# upgrade) stops and disables the units, so nothing runs code that is about to disappear and no
# enablement link is left pointing at a removed unit.
# Arguments: deb "remove" or "upgrade NEW-VERSION" (and others: nothing to do); rpm "0"
# (erase) or "1" (upgrade).
set -e
case "$1" in
  remove|0) ;;
  *) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
  systemctl stop mcpd-jwks.timer mcpd-jwks.service mcpd.service mcpd-helper.service mcpd-helper.socket || true
fi
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable mcpd.service mcpd-helper.socket mcpd-jwks.timer >/dev/null 2>&1 || true
fi
exit 0

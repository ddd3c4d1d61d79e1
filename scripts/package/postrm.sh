#!/bin/sh
# mcpd package: after its files are removed (deb postrm, rpm %postun).
# - remove (deb "remove", rpm "0"): the .pyc files and folders of /opt/mcpd the package did not
#   list are removed; configuration, data and logs stay.
# - purge (deb "purge" only; rpm has none): also the configuration left in /etc/mcpd (users.yaml,
#   tls/ with the TLS key, edited files), the state folders (/var/lib/mcpd, /var/lib/mcpd-helper:
#   login tokens, lockout), the logs (/var/log/mcpd: the audit log; /var/log/mcpd-front) and
#   /run/mcpd. Archive the audit log first if it must be kept.
# The accounts mcpd, mcpd-policy and mcpd-walk are kept (files they owned anywhere else would
# otherwise pass to the next account given their ids); `userdel` them by hand if wanted.
set -e
case "$1" in
  remove|purge|0)
    if [ -d /opt/mcpd ]; then
      find /opt/mcpd -depth -name __pycache__ -type d -exec rm -rf {} + 2>/dev/null || true
      find /opt/mcpd -depth -type d -empty -delete 2>/dev/null || true
    fi
    if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
    ;;
esac
if [ "$1" = purge ]; then
  rm -rf /etc/mcpd /var/lib/mcpd /var/lib/mcpd-helper /var/lib/mcpd-jwks /var/log/mcpd /var/log/mcpd-front /run/mcpd
fi
exit 0

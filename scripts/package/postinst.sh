#!/bin/sh
# mcpd package: after its files are unpacked (deb postinst, rpm %post). Creates the service
# accounts (systemd-sysusers) and folders with their owners and modes (systemd-tmpfiles), and
# makes systemd read the units again. It never enables or starts a unit: on an upgrade it
# restarts only the units that are running already (they would otherwise run the old code
# beside the new files).
# Arguments: deb "configure OLD-VERSION" (OLD-VERSION empty on a first install), or
# "abort-*" (nothing to do); rpm "1" (install) or "2" (upgrade).
set -e
case "$1" in
  configure) if [ -n "$2" ]; then upgrade=yes; else upgrade=no; fi ;;
  1) upgrade=no ;;
  2) upgrade=yes ;;
  *) exit 0 ;;
esac
# The accounts first: the tmpfiles lines name them.
systemd-sysusers /usr/lib/sysusers.d/mcpd.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/mcpd.conf
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
  if [ "$upgrade" = yes ]; then
    systemctl try-restart mcpd-helper.service mcpd.service || true
  fi
fi
if [ "$upgrade" = no ]; then
  echo 'mcpd: installed, not started. Settings: /etc/mcpd/mcpd.yaml; privileged reads: /etc/mcpd/mcp-sudo.yaml'
  echo '(grants nothing yet; a worked example: /etc/mcpd/mcp-sudo.yaml.example). Next, as root:'
  echo '  mcpd certs --dir /etc/mcpd/tls --host NAME    # each name clients use (or an ACME pair: /usr/share/doc/mcpd/certs/README.md)'
  echo '  mcpd users add NAME --os-user ACCOUNT         # a principal; prints its token once'
  echo '  systemctl enable --now mcpd-helper.socket mcpd.service'
  echo '  systemctl enable --now mcpd-jwks.timer        # only with OAuth issuers (/usr/share/doc/mcpd/OAUTH.md)'
  echo '  mcpd status                                   # what runs, and anything to look at'
fi
exit 0

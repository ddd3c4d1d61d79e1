"""``mcpd install-systemd``: put the shipped service files where the units expect them.

The wheel carries them under ``mcpd/share/`` (setup.py); a checkout has them at the repository's
top (``systemd/``, ``etc/``, ``docs/``, ``certs/``). :data:`PLACES` says where each goes, under ``root``
(``/`` by default, or a staging folder given with ``--root``):

- the units in ``/etc/systemd/system/``, their ``ExecStart=`` pointing at this installation (the
  ``mcpd`` script and the Python beside the running interpreter, e.g. a venv in ``/opt/mcpd``);
- ``sysusers.d`` and ``tmpfiles.d`` files in ``/etc/sysusers.d/`` and ``/etc/tmpfiles.d/``;
- the PAM service ``/etc/pam.d/mcpd`` and ``/etc/logrotate.d/mcpd``;
- the configuration in ``/etc/mcpd/``: ``mcpd.yaml``, ``mcp-sudo.yaml`` (granting nothing), and
  the examples ``mcp-sudo.yaml.example`` and ``users.yaml.example`` (never read by the daemon);
- the docs in ``/usr/local/share/doc/mcpd/`` (the units' ``Documentation=``);
- the certificate scripts (an ACME client's deploy hooks) in ``/usr/local/lib/mcpd/certs/``.

A file the operator owns (configuration, PAM service) is never overwritten: it is kept and
reported. With ``root`` = ``/`` (only as root), :func:`activate` then runs ``systemd-sysusers``
(the accounts ``mcpd``, ``mcpd-policy``, ``mcpd-walk`` and ``mcpd-jwks``), ``systemd-tmpfiles --create`` (the
folders; the policy process's state and audit folders become ``mcpd-policy``'s, 0700, files an
older root-owned layout left in them included) and ``systemctl daemon-reload``; nothing is run for
a staging root. A helper already running keeps its old code until it is restarted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mcpd

SHIPPED_FRONT = "/usr/local/bin/mcpd"  # the units' ExecStart= paths as shipped
SHIPPED_PYTHON = "/usr/bin/python3 -I -m mcpd.helper"


@dataclass(frozen=True)
class Place:
    """One shipped file: ``source`` under the share folder, ``target`` under the root, its mode,
    and whether an existing target is the operator's (kept) rather than ours (replaced)."""

    source: str
    target: str
    mode: int = 0o644
    keep_existing: bool = False


PLACES = (
    Place("systemd/mcpd.service", "etc/systemd/system/mcpd.service"),
    Place("systemd/mcpd-helper.service", "etc/systemd/system/mcpd-helper.service"),
    Place("systemd/mcpd-helper.socket", "etc/systemd/system/mcpd-helper.socket"),
    Place("systemd/mcpd-jwks.service", "etc/systemd/system/mcpd-jwks.service"),
    Place("systemd/mcpd-jwks.timer", "etc/systemd/system/mcpd-jwks.timer"),
    Place("systemd/sysusers.d/mcpd.conf", "etc/sysusers.d/mcpd.conf"),
    Place("systemd/tmpfiles.d/mcpd.conf", "etc/tmpfiles.d/mcpd.conf"),
    Place("etc/pam.d/mcpd", "etc/pam.d/mcpd", keep_existing=True),
    Place("etc/logrotate.d/mcpd", "etc/logrotate.d/mcpd"),
    Place("etc/mcpd/mcpd.yaml", "etc/mcpd/mcpd.yaml", 0o640, keep_existing=True),
    Place("etc/mcpd/mcp-sudo.yaml", "etc/mcpd/mcp-sudo.yaml", 0o600, keep_existing=True),
    Place("etc/mcpd/mcp-sudo.yaml.example", "etc/mcpd/mcp-sudo.yaml.example"),
    Place("etc/mcpd/users.yaml.example", "etc/mcpd/users.yaml.example"),
    Place("docs/REFERENCE.md", "usr/local/share/doc/mcpd/REFERENCE.md"),
    Place("docs/AUDITING.md", "usr/local/share/doc/mcpd/AUDITING.md"),
    Place("docs/PRIVSEP.md", "usr/local/share/doc/mcpd/PRIVSEP.md"),
    Place("docs/INTERNALS.md", "usr/local/share/doc/mcpd/INTERNALS.md"),
    Place("docs/SPEC-NOTES.md", "usr/local/share/doc/mcpd/SPEC-NOTES.md"),
    Place("docs/PACKAGING.md", "usr/local/share/doc/mcpd/PACKAGING.md"),
    Place("docs/OAUTH.md", "usr/local/share/doc/mcpd/OAUTH.md"),
    Place("README.md", "usr/local/share/doc/mcpd/README.md"),
    Place("certs/README.md", "usr/local/share/doc/mcpd/certs/README.md"),
    Place("certs/install-pair.sh", "usr/local/lib/mcpd/certs/install-pair.sh", 0o755),
    Place("certs/certbot-deploy-hook.sh", "usr/local/lib/mcpd/certs/certbot-deploy-hook.sh", 0o755),
    Place("certs/acme-sh-reloadcmd.sh", "usr/local/lib/mcpd/certs/acme-sh-reloadcmd.sh", 0o755),
)


class InstallError(Exception):
    """A shipped file is missing, or a file could not be written."""


def share_folder() -> Path:
    """Where the shipped files are: ``mcpd/share`` in an installed wheel, else the checkout's top.

    Raises:
        InstallError: neither holds ``systemd/mcpd.service``.
    """
    package = Path(mcpd.__file__).resolve().parent
    for folder in (package / "share", package.parent):
        if (folder / "systemd" / "mcpd.service").is_file():
            return folder
    raise InstallError(f"the service files are missing from this installation (looked in {package / 'share'} "
                       f"and {package.parent}); install mcpd from its wheel")


def exec_paths(text: str, python: str, front: str) -> str:
    """``text`` of a unit with the shipped ``ExecStart=`` paths replaced by this installation's:
    ``python`` (absolute, runs ``-I -m mcpd.helper``) and ``front`` (the ``mcpd`` script)."""
    return (text.replace(f"ExecStart={SHIPPED_PYTHON}", f"ExecStart={python} -I -m mcpd.helper")
                .replace(f"ExecStart={SHIPPED_FRONT} ", f"ExecStart={front} "))


def install(root: Path, share: Path | None = None, python: str | None = None,
            front: str | None = None) -> list[tuple[str, Path]]:
    """Copy every :data:`PLACES` file under ``root``; return ``[(what was done, target)]`` with
    ``"installed"``, ``"replaced"`` or ``"kept"`` (an operator's existing file).

    Args:
        root: the file system root to install into (``/``, or a staging folder).
        share: where the shipped files are (default :func:`share_folder`).
        python: the interpreter the helper unit runs (default: ``sys.executable``).
        front: the ``mcpd`` script the front unit runs (default: beside ``sys.executable``,
            else the shipped ``/usr/local/bin/mcpd``).

    Raises:
        InstallError: a shipped file is missing, or a target cannot be written.
    """
    share = share or share_folder()
    python = python or sys.executable
    if front is None:
        beside = Path(sys.executable).parent / "mcpd"
        front = str(beside) if os.access(beside, os.X_OK) else SHIPPED_FRONT
    done: list[tuple[str, Path]] = []
    for place in PLACES:
        source = share / place.source
        if not source.is_file() and place.source == "README.md":
            continue  # a wheel has the README in its metadata only
        target = root / place.target
        if place.keep_existing and os.path.lexists(target):
            done.append(("kept", target))
            continue
        try:
            data = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise InstallError(f"cannot read {source}: {exc.strerror}") from None
        if place.target.startswith("etc/systemd/system/"):
            data = exec_paths(data, python, front)
        existed = os.path.lexists(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.mcpd-install")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, place.mode)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.chmod(tmp, place.mode)
            os.replace(tmp, target)
        except OSError as exc:
            raise InstallError(f"cannot write {target}: {exc.strerror}") from None
        done.append(("replaced" if existed else "installed", target))
    return done


def prefix_warnings(prefix: str | None = None) -> list[str]:
    """What is wrong with running the units from installation ``prefix`` (default ``sys.prefix``):
    the front's unit hides ``/home`` and ``/root`` (``ProtectHome=yes``), and the helper runs this
    installation's code as root, so no folder of it may be writable by anyone but root."""
    path = Path(os.path.realpath(prefix or sys.prefix))
    problems = []
    if path == Path("/root") or Path("/root") in path.parents or Path("/home") in path.parents:
        problems.append(f"{path} is under /home or /root, which the front's unit hides (ProtectHome=yes): "
                        "install mcpd into /opt or /usr/local instead")
    if prefix is None:  # a venv's python is a link: the interpreter it runs must be reachable by every account
        real = Path(os.path.realpath(sys.executable))
        if real == Path("/root") or Path("/root") in real.parents or Path("/home") in real.parents:
            problems.append(f"this installation runs the interpreter {real}, under /home or /root, which the "
                            "policy process, workers and walkers (other accounts) cannot execute: make the venv "
                            "with the system's interpreter (/usr/bin/python3 -m venv /opt/mcpd)")
    for folder in (path, *path.parents):
        st = os.stat(folder)
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & 0o1000):
            problems.append(f"{folder} can be changed by an account other than root, and the root helper "
                            "runs code from it: make the installation root's and not group- or world-writable")
            break
    return problems


ACTIVATE = (
    ("systemd-sysusers", "/etc/sysusers.d/mcpd.conf"),  # mcpd, mcpd-policy, mcpd-walk, mcpd-jwks: before tmpfiles names them
    ("systemd-tmpfiles", "--create", "/etc/tmpfiles.d/mcpd.conf"),  # folders, owners and modes
    ("systemctl", "daemon-reload"),
)


def activate() -> None:
    """Run :data:`ACTIVATE` on the live system (root only).

    Raises:
        InstallError: a command is missing or fails (its message is included).
    """
    for command in ACTIVATE:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InstallError(f"{' '.join(command)}: {exc}") from None
        if proc.returncode != 0:
            raise InstallError(f"{' '.join(command)} failed: {(proc.stderr or proc.stdout).strip()}")

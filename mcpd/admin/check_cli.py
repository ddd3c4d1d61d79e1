"""``mcpd config check FILE`` and ``mcpd users check FILE``: check one file alone, like ``visudo -cf``.

Beside ``mcpd grants check FILE`` (:mod:`mcpd.admin.grants_cli`), for configuration management
that validates a file before it lands (Ansible's ``validate: mcpd config check %s``). Each reads
FILE once as the daemon does (:func:`mcpd.helper.wire.securefile.read_secure_file`: no symlink,
root's unless ``--any-owner``, not group- or world-writable), parses it with the one strict YAML
loader and validates it with the file's one schema (:func:`mcpd.common.config.from_dict`,
:func:`mcpd.common.identity.parse_users`). No other file is read (``mcpd.yaml``'s TLS files,
users and grants files are not opened) and nothing is written. Exit 0 with ``FILE: parsed OK``;
exit 1 with ``FILE:LINE: reason`` on stderr (the line of the key the schema names, found in the
parsed document; ``FILE: reason`` when the problem has no line, such as an unreadable file).
A users file's values (salts, digests) are never printed. A symlink is refused with the advice to
name the real file; a users or grants file every account may read is a warning (on stderr; the
check still passes).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable
from typing import Any

import click

from mcpd.common import config as mcpd_config
from mcpd.common import identity
from mcpd.common.printable import printable
from mcpd.common.strictyaml import LineDict, LineList, parse_strict_yaml
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_UNKNOWN = re.compile(r"^unknown key '([^']*)'")


def key_line(data: Any, where: str) -> int | None:
    """The 1-based line where the key a schema message names starts in ``data`` (the parsed
    document, :class:`LineDict`/:class:`LineList` containers), or None when it names none.

    Args:
        data: what :func:`parse_strict_yaml` returned.
        where: the dotted path of the message, as the schemas write it: ``workers.per_account``,
            ``users.alice.tokens[0].salt``, ``allowed_hosts[1]``; ``config`` (the top) has no line.
            The deepest part found gives the line (``limits.users.bob`` when ``bob`` is missing
            gives the line of ``users``).
    """
    line: int | None = None
    node = data
    for name, index in _STEP.findall(where.removesuffix(" key")):
        if name and isinstance(node, LineDict):
            key = next((k for k in node if str(k) == name), None)
            if key is None:
                break
            line, node = node.key_line[key], node[key]
        elif index and isinstance(node, LineList) and int(index) < len(node):
            line, node = node.item_line[int(index)], node[int(index)]
        else:
            break
    return line


def _located(message: str, source: str, data: Any) -> str:
    """``message`` (``SOURCE: where: reason`` from a schema) as ``SOURCE:LINE: where: reason``."""
    rest = message.removeprefix(f"{source}: ")
    where, sep, reason = rest.partition(": ")
    if not sep or rest == message:
        return message
    unknown = _UNKNOWN.match(reason)
    path = where if where != "config" else ""
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
    line = key_line(data, path)
    return f"{source}:{line}: {rest}" if line is not None else message


def check_file(path: str, owner_uid: int | None, validate: Callable[[Any, str], object],
               errors: tuple[type[Exception], ...]) -> list[str]:
    """Read ``path`` once (as :func:`read_secure_file` does, owner ``owner_uid``; None: any owner,
    still no symlink and not group- or world-writable), parse it strictly and run ``validate(data,
    path)``; return the problems as ``file:line: reason`` strings (empty: the file is good).

    Args:
        path: the file to check.
        owner_uid: the uid that must own it, or None for the caller's own files too.
        validate: the file's schema, raising one of ``errors`` with ``file: where: reason``.
        errors: the exceptions ``validate`` raises for a broken document.
    """
    if os.path.islink(path):
        return [symlink_problem(path)]
    try:
        text = read_secure_file(path, os.geteuid() if owner_uid is None else owner_uid)
        data = parse_strict_yaml(text, path)
    except ConfigFileError as exc:
        return list(exc.errors)
    try:
        validate(data, path)
    except errors as exc:
        return [_located(str(exc), path, data)]
    return []


def symlink_problem(path: str) -> str:
    """What to say of a file to check that is a symlink (the daemon never follows one there)."""
    return f"{path}: is a symlink; name the real file ({os.path.realpath(path)}), as the daemon's configuration must"


def readable_warning(path: str) -> str | None:
    """A warning when ``path`` (a users or grants file) is readable by every account, else None:
    who may read what, and token digests, are root's alone (0600 root:root)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if not mode & stat.S_IROTH:
        return None
    return f"warning: {path}: readable by every account (mode {stat.S_IMODE(mode):04o}): make it 0600 root:root"


def _config_schema(data: Any, path: str) -> object:
    try:
        return mcpd_config.from_dict(data or {})
    except mcpd_config.ConfigError as exc:
        raise mcpd_config.ConfigError(f"{path}: {exc}") from None


def _report(path: str, problems: list[str]) -> None:
    for line in problems:
        click.echo(printable(line), err=True)
    if problems:
        sys.exit(1)
    click.echo(printable(f"{path}: parsed OK"))


_any_owner = click.option("--any-owner", is_flag=True,
                          help="Accept a file owned by the current user (default: root's only, as the daemon)")


@click.group("config")
def config() -> None:
    """Check the daemon configuration (mcpd.yaml)."""


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@_any_owner
def config_check(file: str, any_owner: bool) -> None:
    """Check FILE as mcpd.yaml like `visudo -cf`: exit 0 if valid, 1 with file:line errors.

    Only FILE is read (not the files it names); nothing is written."""
    _report(file, check_file(file, None if any_owner else 0, _config_schema, (mcpd_config.ConfigError,)))


@click.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@_any_owner
def users_check(file: str, any_owner: bool) -> None:
    """Check FILE as users.yaml like `visudo -cf`: exit 0 if valid, 1 with file:line errors.

    Token salts and digests are never printed; nothing is written."""
    try:
        os.lstat(file)
    except FileNotFoundError:  # the daemon runs with no principals then; a check of it fails
        _report(file, [f"{file}: {identity.MISSING_USERS_FILE}"])
    problems = check_file(file, None if any_owner else 0, identity.parse_users, (identity.UsersFileError,))
    if not problems and (warning := readable_warning(file)):
        click.echo(printable(warning), err=True)
    _report(file, problems)

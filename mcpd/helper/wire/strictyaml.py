"""Loading root-owned YAML configuration the way ``visudo -c`` does (docs/REFERENCE.md §4.5).

Two steps, usable for ``mcp-sudo.yaml`` and ``users.yaml`` alike:

* :func:`read_secure_file` opens the file once (no symlink followed at the leaf, never blocking)
  and checks the *open descriptor* with ``fstat``: a regular file, owned by root (or the owner
  given), neither group- nor world-writable, and at most ``max_bytes`` long.
* :func:`parse_strict_yaml` parses one YAML document with a loader that refuses duplicate keys and
  merge keys and remembers line numbers: every mapping is a :class:`LineDict` (``.key_line[key]``),
  every sequence a :class:`LineList` (``.item_line[i]``).

It is the one YAML loader of ``mcpd.yaml``, ``users.yaml``, the grants and the linuxctl config.

Errors are :class:`ConfigFileError` whose ``errors`` are ``file:line: message`` strings. Messages
name keys and line numbers only; they never quote the file's text.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

import yaml

MAX_CONFIG_BYTES = 1024 * 1024  # a grants or users file over 1 MiB is refused


class ConfigFileError(Exception):
    """A configuration file is unsafe, unreadable, not YAML or breaks its schema.

    Attributes:
        errors: one ``file:line: message`` string per problem (``file: message`` without a line).
    """

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class LineDict(dict[Any, Any]):
    """A YAML mapping remembering where each of its keys starts (``key_line``, 1-based lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.key_line: dict[Any, int] = {}


class LineList(list[Any]):
    """A YAML sequence remembering where each of its items starts (``item_line``, 1-based lines)."""

    def __init__(self) -> None:
        super().__init__()
        self.item_line: list[int] = []


class _StrictError(Exception):
    """``args``: (1-based line, message)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings reject duplicate and merge keys and record line numbers."""


def _construct_map(loader: _StrictLoader, node: yaml.Node) -> LineDict:
    if not isinstance(node, yaml.MappingNode):
        raise _StrictError(node.start_mark.line + 1, "expected a mapping")
    out = LineDict()
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise _StrictError(line, "merge keys ('<<') are not allowed")
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise _StrictError(line, "a mapping key must be a scalar") from None
        if key in out:
            raise _StrictError(line, f"duplicate key {key!r} (first on line {out.key_line[key]})")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_line[key] = line
    return out


def _construct_seq(loader: _StrictLoader, node: yaml.Node) -> LineList:
    if not isinstance(node, yaml.SequenceNode):
        raise _StrictError(node.start_mark.line + 1, "expected a sequence")
    out = LineList()
    for item in node.value:
        out.append(loader.construct_object(item, deep=True))
        out.item_line.append(item.start_mark.line + 1)
    return out


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def parse_strict_yaml(text: str, source: str) -> Any:
    """Parse one YAML document strictly.

    Args:
        text: the document.
        source: the file name used as the prefix of error messages.

    Returns:
        ``None`` for an empty document, else the value with :class:`LineDict`/:class:`LineList`
        containers.

    Raises:
        ConfigFileError: syntax error, several documents, duplicate key or merge key.
    """
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except _StrictError as exc:
        raise ConfigFileError([f"{source}:{exc.args[0]}: {exc.args[1]}"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"{mark.line + 1}" if mark is not None else "?"
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigFileError([f"{source}:{line}: invalid YAML: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigFileError([f"{source}: invalid YAML: {type(exc).__name__}"]) from None
    finally:
        loader.dispose()


def check_secure_stat(st: os.stat_result, source: str, owner_uid: int = 0) -> None:
    """Refuse a file that root would be unwise to trust (docs/REFERENCE.md §4.5), from its ``fstat`` result.

    Args:
        st: ``os.fstat`` of the open descriptor.
        source: the file name for the messages.
        owner_uid: the required owner (0, root; development mode may pass its own uid).

    Raises:
        ConfigFileError: not a regular file, wrong owner, or group/world-writable.
    """
    if not stat.S_ISREG(st.st_mode):
        raise ConfigFileError([f"{source}: not a regular file"])
    if st.st_uid != owner_uid:
        who = "root" if owner_uid == 0 else f"uid {owner_uid}"
        raise ConfigFileError([f"{source}: not owned by {who} (owner uid {st.st_uid})"])
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigFileError([f"{source}: group- or world-writable (mode {mode:04o})"])


#: How :func:`read_secure_file` opens a file: ``os.open``, except in the policy process (not root),
#: which asks the root helper for the files only root may open (:mod:`mcpd.policy.main`).
open_file: Callable[[str, int], int] = os.open


def read_secure_file(path: str, owner_uid: int = 0, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """Open ``path`` once, check the descriptor (:func:`check_secure_stat`) and read it as UTF-8.

    Args:
        path: the file (a symlink as the last component is refused).
        owner_uid: the required owner uid.
        max_bytes: the largest accepted size, in bytes.

    Raises:
        ConfigFileError: cannot open, unsafe, too large, or not UTF-8.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = open_file(path, flags)
    except OSError as exc:
        raise ConfigFileError([f"{path}: cannot open: {exc.strerror}"]) from None
    try:
        check_secure_stat(os.fstat(fd), path, owner_uid)
        chunks: list[bytes] = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if sum(map(len, chunks)) > max_bytes:
                raise ConfigFileError([f"{path}: larger than {max_bytes} bytes"])
    except OSError as exc:
        raise ConfigFileError([f"{path}: cannot read: {exc.strerror}"]) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError([f"{path}: not UTF-8 (byte offset {exc.start})"]) from None


def load_secure_yaml(path: str, owner_uid: int = 0) -> Any:
    """:func:`read_secure_file` then :func:`parse_strict_yaml`; for ``users.yaml`` and grants alike.

    Raises:
        ConfigFileError: see both functions.
    """
    return parse_strict_yaml(read_secure_file(path, owner_uid), path)

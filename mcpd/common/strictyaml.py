"""The one strict YAML loader: of ``mcpd.yaml``, ``users.yaml``, the grants and the linuxctl config.

:func:`parse_strict_yaml` parses one YAML document with a loader that refuses duplicate keys and
merge keys and remembers line numbers: every mapping is a :class:`LineDict` (``.key_line[key]``),
every sequence a :class:`LineList` (``.item_line[i]``). The file is read first with
:func:`mcpd.helper.wire.securefile.read_secure_file` (:func:`load_secure_yaml` does both).

Root reads only its own few keys of ``mcpd.yaml`` (:mod:`mcpd.helper.wire.rootconf`, PyYAML's safe
loader), and starts nothing the policy process has not accepted whole with this loader: it exits
with the policy process when the file breaks these rules.
"""

from __future__ import annotations

from typing import Any

import yaml

from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file


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
        ConfigFileError: syntax error, a character YAML does not allow, nesting too deep for the
            parser, several documents, duplicate key or merge key.
    """
    loader = None
    try:
        loader = _StrictLoader(text)  # (its reader already refuses a control character)
        return loader.get_single_data()
    except RecursionError:
        raise ConfigFileError([f"{source}: invalid YAML: nested too deeply"]) from None
    except yaml.reader.ReaderError as exc:
        at = text.count("\n", 0, exc.position) + 1
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else "a byte"
        raise ConfigFileError([f"{source}:{at}: invalid YAML: {exc.reason} ({what})"]) from None
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
        if loader is not None:
            loader.dispose()


def load_secure_yaml(path: str, owner_uid: int = 0) -> Any:
    """:func:`read_secure_file` then :func:`parse_strict_yaml`; for ``users.yaml`` and grants alike.

    Raises:
        ConfigFileError: see both functions.
    """
    return parse_strict_yaml(read_secure_file(path, owner_uid), path)

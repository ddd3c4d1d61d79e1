"""The one argument validator set of every tool's ``parse_args`` (docs/REFERENCE.md §2.5).

Pure functions: they run in the front, in the worker and again in the root helper, which trusts
nothing. Every failure is ``ToolError(INVALID_ARGUMENT)`` with details ``argument``, so an agent
can read it and retry. An argument given as JSON ``null`` counts as absent.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mcpd.helper.wire.errors import invalid_argument


def digits(text: str) -> int | None:
    """``text`` as a non-negative integer when it is ASCII decimal digits only (``str.isdigit``
    alone also admits superscripts and other scripts' digits, which ``int`` then refuses or reads
    as something else), else ``None``. For numbers a client or a config writes as text: ports,
    ``Content-Length``, URI query numbers."""
    return int(text) if text.isascii() and text.isdigit() else None


PATH_MAX = 4096  # bytes, Linux PATH_MAX
NAME_MAX = 255  # bytes, one path component


def check_object(args: Any, known: Collection[str]) -> dict[str, Any]:
    """``args`` (``None`` = ``{}``) must be a JSON object whose keys are all in ``known``; returns it.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a non-object or an unknown key.
    """
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise invalid_argument("arguments must be an object")
    unknown = sorted(str(k)[:64] for k in args if k not in known)
    if unknown:
        raise invalid_argument(f"unknown argument: {unknown[0]}", argument=unknown[0])
    return args


def check_path(args: dict[str, Any], key: str) -> str:
    """The required absolute path ``args[key]``: a string, no NUL byte, valid UTF-8 (no lone
    surrogate), at most :data:`PATH_MAX` bytes, no component over :data:`NAME_MAX` bytes.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` naming the first rule broken.
    """
    value = args.get(key)
    if value is None:
        raise invalid_argument(f"missing required argument: {key}", argument=key)
    if not isinstance(value, str):
        raise invalid_argument(f"{key} must be a string", argument=key)
    if "\0" in value:
        raise invalid_argument(f"{key} contains a NUL byte", argument=key)
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid_argument(f"{key} is not valid UTF-8 (lone surrogate)", argument=key) from None
    if not value.startswith("/"):
        raise invalid_argument(f"{key} must be absolute", argument=key, path=value)
    if len(raw) > PATH_MAX:
        raise invalid_argument(f"{key} is longer than {PATH_MAX} bytes", argument=key)
    if max(len(c) for c in raw.split(b"/")) > NAME_MAX:
        raise invalid_argument(f"{key} has a component longer than {NAME_MAX} bytes", argument=key)
    return value


def check_int(args: dict[str, Any], key: str, default: int | None, low: int, high: int | None) -> int | None:
    """Optional integer ``args[key]`` in ``[low, high]`` (``high`` None: unbounded, any size: an
    offset of 2**64 or a line of 10**400 is an integer like any other, and the tool decides what
    it means past the end of a file), else ``default``. ``3.0`` and booleans are not integers.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a non-integer or a value out of range.
    """
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_argument(f"{key} must be an integer", argument=key)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid_argument(f"{key} must be {bound}", argument=key)
    return value


def check_number(args: dict[str, Any], key: str, default: float, above: float, high: float) -> float:
    """Optional number ``args[key]`` (an integer of any size or a float, not a boolean) with
    ``above < value <= high``, as a float; else ``default``. ``NaN`` and infinities are out of range.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a non-number or a value out of range.
    """
    value = args.get(key)
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not above < value <= high:
        raise invalid_argument(f"{key} must be a number above {above:g} and at most {high:g}", argument=key)
    return float(value)  # (in range, so an integer of any size has passed the bound first: no overflow)


def check_bool(args: dict[str, Any], key: str, default: bool = False) -> bool:
    """Optional boolean ``args[key]``, else ``default``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for anything but true/false.
    """
    value = args.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_argument(f"{key} must be true or false", argument=key)
    return default if value is None else value


def check_choice(args: dict[str, Any], key: str, choices: Collection[str], default: str | None) -> str | None:
    """Optional ``args[key]``, one of ``choices``, else ``default``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for any other value.
    """
    value = args.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise invalid_argument(f"{key} must be one of {', '.join(sorted(choices))}", argument=key)
    return value

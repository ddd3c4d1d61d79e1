"""Argument checks shared by ``files/list``, ``files/find`` and ``files/filetype`` (SPEC §2.5).

Pure functions: they run in the front and again in the root helper, which trusts nothing.
Every failure is ``ToolError(INVALID_ARGUMENT)`` naming the argument, so an agent can retry.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.errors import invalid_argument

PATH_MAX = 4096  # bytes, Linux PATH_MAX

PATH_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": PATH_MAX}
PRIVILEGED_SCHEMA: dict[str, Any] = {
    "type": "boolean",
    "default": False,
    "description": "Run through the root helper under an mcp-sudo.yaml grant (never silently downgraded).",
}


def check_object(args: Any, known: frozenset[str]) -> dict[str, Any]:
    """``args`` must be a JSON object whose keys are all in ``known``; returns it.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a non-object or an unknown key.
    """
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise invalid_argument("arguments must be an object")
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        raise invalid_argument(f"unknown argument: {unknown[0]}", argument=unknown[0])
    return args


def check_path(args: dict[str, Any], key: str) -> str:
    """The required absolute path ``args[key]`` (no NUL byte, at most 4096 bytes).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` when missing, not a string, relative, or containing NUL.
    """
    if key not in args:
        raise invalid_argument(f"missing required argument: {key}", argument=key)
    value = args[key]
    if not isinstance(value, str) or not value:
        raise invalid_argument(f"{key} must be a non-empty string", argument=key)
    if "\0" in value:
        raise invalid_argument(f"{key} contains a NUL byte", argument=key)
    if not value.startswith("/"):
        raise invalid_argument(f"{key} must be an absolute path", argument=key, path=value)
    if len(value.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise invalid_argument(f"{key} is longer than {PATH_MAX} bytes", argument=key)
    return value


def check_int(args: dict[str, Any], key: str, default: int | None, low: int, high: int | None) -> int | None:
    """Optional integer ``args[key]`` in ``[low, high]`` (``high`` None = unbounded), else ``default``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a non-integer (booleans included) or out of range.
    """
    if key not in args or args[key] is None:
        return default
    value = args[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_argument(f"{key} must be an integer", argument=key)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid_argument(f"{key} must be {bound}", argument=key, value=value)
    return value


def check_bool(args: dict[str, Any], key: str) -> bool:
    """Optional boolean ``args[key]`` (default False).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for anything but true/false.
    """
    value = args.get(key, False)
    if not isinstance(value, bool):
        raise invalid_argument(f"{key} must be a boolean", argument=key)
    return value


"""One exception family with stable codes (docs/REFERENCE.md §2.5).

Every failure a client can see is a :class:`ToolError` carrying one of the codes below. The
front turns it into a tool result with ``isError: true`` (or, for ``resources/read``, a JSON-RPC
error whose ``data.code`` is the code); the root helper turns it into a refusal plus an audit
record. Anything that is not a ``ToolError`` is an internal error: the client gets a generic
message and the traceback goes to the log only.
"""

from __future__ import annotations

from typing import Any

INVALID_ARGUMENT = "INVALID_ARGUMENT"
FILE_NOT_FOUND = "FILE_NOT_FOUND"
PERMISSION_DENIED = "PERMISSION_DENIED"
NOT_A_REGULAR_FILE = "NOT_A_REGULAR_FILE"
BINARY_FILE = "BINARY_FILE"
ENCODING_ERROR = "ENCODING_ERROR"
FILE_TOO_LARGE = "FILE_TOO_LARGE"
LINE_TOO_LONG = "LINE_TOO_LONG"
RANGE_OUT_OF_BOUNDS = "RANGE_OUT_OF_BOUNDS"
HELPER_UNAVAILABLE = "HELPER_UNAVAILABLE"
TIMEOUT = "TIMEOUT"
RATE_LIMITED = "RATE_LIMITED"
INTERNAL_ERROR = "INTERNAL_ERROR"

CODES = frozenset(v for k, v in dict(globals()).items() if k.isupper() and k == v)  # every code is its own name


class ToolError(Exception):
    """A failure with a stable docs/REFERENCE.md §2.5 code.

    Args:
        code: one of the module's code constants (``FILE_NOT_FOUND`` ...).
        message: the human message, shown as the tool result's ``content[0].text``. It never
            contains file contents, tokens or passwords.
        details: JSON-serialisable facts for the agent (``path``, ``reason``, ``size`` ...).

    Raises:
        ValueError: ``code`` is not one of :data:`CODES`.
    """

    def __init__(self, code: str, message: str, **details: Any) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The wire shape ``{"code", "message", "details"}`` used in frames and ``structuredContent``."""
        return {"code": self.code, "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"ToolError({self.code}, {self.message!r}, {self.details!r})"


def invalid_argument(message: str, **details: Any) -> ToolError:
    """Shorthand for an ``INVALID_ARGUMENT`` error (docs/REFERENCE.md §2.5: validation failures are tool errors)."""
    return ToolError(INVALID_ARGUMENT, message, **details)


def denied(path: str, reason: str) -> ToolError:
    """The ``PERMISSION_DENIED`` of an open refused for ``path``: message ``permission denied:
    <path>``, details ``path`` and ``reason`` (``symlink in path``, ``path changed while opening`` ...)."""
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason=reason)


def from_oserror(exc: OSError, path: str) -> ToolError:
    """Map an ``OSError`` from resolving ``path`` to the docs/REFERENCE.md §2.5 code, as root's
    opener meets them (an ``O_PATH`` resolution, whose symlink refusal the opener makes itself).

    ``ENOENT``/``ENOTDIR`` → ``FILE_NOT_FOUND``; ``EACCES``/``EPERM`` → ``PERMISSION_DENIED``
    (reason ``the account may not read it``); anything else → ``INTERNAL_ERROR`` with the errno
    name only. What only a reader meets (a symlink at the leaf, a directory, a FIFO or socket) is
    mapped by :func:`mcpd.common.readerrors.reader_error`, which adds those to this one.
    """
    import errno

    err = exc.errno
    if err in (errno.ENOENT, errno.ENOTDIR):
        return ToolError(FILE_NOT_FOUND, f"no such file: {path}", path=path)
    if err in (errno.EACCES, errno.EPERM):
        return denied(path, "the account may not read it")
    name = errno.errorcode.get(err or 0, "EIO")
    return ToolError(INTERNAL_ERROR, f"cannot read {path}: {name}", path=path, errno=name)

"""The file resource: ``resources/templates/list`` and ``resources/read`` (docs/REFERENCE.md §2.5, §3).

``file:///{+path}`` is the one resource template. ``resources/read`` of a ``file:`` URI runs the
``files/read`` op on the same route as the tool (the caller's account worker, or the privileged
backend with ``privileged``: the policy process decides, root opens), so the resource and the tool
cannot drift apart.

Rules:

* URIs: ``file:///abs/path`` and ``file://localhost/abs/path`` (and ``file:/abs/path``) are
  absolute; ``file:relative/path`` (no ``//`` and no leading ``/``) is relative to the caller's
  workspace. Any other host, another scheme, a NUL byte or bad percent-encoding is
  ``INVALID_ARGUMENT``. The path is percent-decoded as UTF-8.
* Workspace: ``workspaces[principal name]`` in mcpd.yaml, else ``default_workspace`` (``~`` = the
  OS account's home, ``""`` = none: relative URIs are ``INVALID_ARGUMENT``). A relative path is
  resolved lexically, component by component; ``..`` is allowed only while every step stays
  inside the workspace. ``~`` (not expanded), a path that decodes to a leading ``/`` (such as
  ``%2F%2Fetc``) and any escape are ``PERMISSION_DENIED`` with a ``reason``. Symlinks inside the
  workspace are not checked here: the kernel (or, privileged, the grant's opener) decides.
* Options come from the URI query (``start_line``, ``end_line``, ``encoding``,
  ``include_metadata``, ``privileged``) and from params (``encoding``, ``includeMetadata``,
  ``lineRange: {start, end}``, ``privileged``); params win over the query.
* Metadata is on by default for resources (``_meta`` holds ``files/read``'s metadata: path,
  size, lines, encoding, language, lastModified, sha256, and for a line range linesReturned,
  totalLines, lineRange); ``includeMetadata: false`` or ``?include_metadata=false`` turns it off,
  which a file over the response cap needs (it is not hashed: ``FILE_TOO_LARGE``).
* ``mimeType`` is guessed from the file name's extension (``mimetypes``), ``text/plain`` when
  unknown: it costs no second call and no second grant (libmagic is in ``files/filetype``).
* A file that is not text (``BINARY_FILE``), or one asked for with ``encoding=base64``, is
  answered as a ``blob`` (base64) of the whole file, with ``application/octet-stream`` when the
  extension says nothing; a binary file costs a second ``files/read`` (as bytes) on the same
  route, within the same call. A file whose bytes do not fit one answer (three quarters of the
  response cap) is ``FILE_TOO_LARGE``, suggesting ``files/read`` with ``encoding: base64``.
* Errors are JSON-RPC errors whose ``data`` is ``{"code", "message", "details"}`` (docs/REFERENCE.md §2.5), with
  the codes of the request's revision: ``FILE_NOT_FOUND`` → ``-32002`` (``-32602`` for 2026-07-28,
  which retired ``-32002``); what the server could not do (``HELPER_UNAVAILABLE``, ``TIMEOUT``,
  ``RATE_LIMITED``, ``INTERNAL_ERROR``) → ``-32603``; everything about the request itself (bad
  argument, permission, not a regular file, binary, encoding, size, range) → ``-32602``.
"""

from __future__ import annotations

import mimetypes
import posixpath
import pwd
import urllib.parse
from collections.abc import Mapping
from typing import Any

from mcpd.common.identity import Principal
from mcpd.common.redaction import with_redaction
from mcpd.common.validate import digits
from mcpd.core.tools import files_read
from mcpd.front.access import AccessLog, Call
from mcpd.front.limits import LimitsTracker
from mcpd.front.mcp.dispatcher import RequestContext, ToolPool
from mcpd.front.mcp.jsonrpc import INTERNAL, INVALID_PARAMS, RpcError
from mcpd.front.privileged import PrivilegedBackend
from mcpd.helper.wire.errors import (
    BINARY_FILE,
    ENCODING_ERROR,
    FILE_NOT_FOUND,
    FILE_TOO_LARGE,
    HELPER_UNAVAILABLE,
    INTERNAL_ERROR,
    PERMISSION_DENIED,
    RATE_LIMITED,
    TIMEOUT,
    ToolError,
    invalid_argument,
)

WHOLE = 1 << 62  # bytes: a blob is the whole file, up to what one answer may hold
_PAGE_IT = "files/read with encoding base64 reads it page by page (offset, next_offset)"
RESOURCE_NOT_FOUND = -32002  # JSON-RPC code of a missing resource (MCP up to 2025-11-25)
_SERVER_SIDE = frozenset({HELPER_UNAVAILABLE, TIMEOUT, RATE_LIMITED, INTERNAL_ERROR})

TEMPLATE: dict[str, Any] = {
    "uriTemplate": "file:///{+path}",
    "name": "file",
    "title": "File on the server",
    "description": (
        "A file on the server, read with the caller's account rights. Query options: "
        "start_line, end_line (1-based, inclusive), encoding (utf-8, ascii, latin-1, cp1252, utf-16, "
        "auto, base64: a blob), decompress (default true; false: a compressed file's own bytes), "
        "include_metadata (default true: size, lines, encoding, language, lastModified, sha256 "
        "in _meta), privileged (through an mcp-sudo.yaml grant). Example: "
        "file:///var/log/syslog?start_line=50&end_line=100. file:relative/path reads inside the "
        "caller's workspace. A file that is not text comes back as a blob (base64); a .gz, .xz, .bz2 or "
        ".zst file as its decompressed text."
    ),
    "mimeType": "text/plain",
}

_QUERY_KEYS = frozenset({"start_line", "end_line", "encoding", "include_metadata", "privileged", "decompress"})
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})


def rpc_error(exc: ToolError, modern: bool = False, uri: str | None = None) -> RpcError:
    """The JSON-RPC error for a failed resource read: code by the table in the module docstring
    (``modern``: a 2026-07-28 request), ``data = {"code", "message", "details"}``, and ``uri``, the
    URI as requested, when given."""
    if exc.code in _SERVER_SIDE:
        code = INTERNAL
    elif exc.code == FILE_NOT_FOUND and not modern:
        code = RESOURCE_NOT_FOUND
    else:
        code = INVALID_PARAMS
    data = exc.to_dict()
    if uri is not None:
        data["uri"] = uri
    return RpcError(code, exc.message, data)


#: Extensions the host's mime.types may lack (checked first, so the answer does not depend on it).
_MIME_BY_SUFFIX: dict[str, str] = {
    ".yaml": "application/yaml", ".yml": "application/yaml", ".md": "text/markdown", ".toml": "application/toml",
    ".json": "application/json", ".py": "text/x-python", ".sh": "text/x-shellscript", ".log": "text/plain",
    ".conf": "text/plain", ".cfg": "text/plain", ".ini": "text/plain", ".txt": "text/plain",
}


def mime_type(path: str, binary: bool = False) -> str:
    """A MIME type from ``path``'s extension (a small built-in table, then ``mimetypes``);
    ``text/plain`` when unknown (``application/octet-stream`` for a ``binary`` answer)."""
    suffix = posixpath.splitext(path)[1].lower()
    if suffix in _MIME_BY_SUFFIX and not binary:
        return _MIME_BY_SUFFIX[suffix]
    guessed, _ = mimetypes.guess_type(posixpath.basename(path), strict=False)
    return guessed or ("application/octet-stream" if binary else "text/plain")


def _other_encoding(exc: ToolError) -> str:
    """The ``suggestion`` of a resource read whose text is not in the encoding asked for."""
    found = exc.details.get("detectedEncoding")
    names = [found] if isinstance(found, str) and found not in ("unknown", "base64", "latin-1") else []
    options = ", ".join(f"?encoding={n}" for n in [*names, "latin-1", "auto"])
    return f"read it again with {options}, or ?encoding=base64 (its bytes, as a blob)"


def _denied(path: str, reason: str) -> ToolError:
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}: {reason}", path=path, reason=reason)


def resolve_relative(rel: str, workspace: str) -> str:
    """Resolve the decoded relative path ``rel`` inside ``workspace`` (absolute, clean), lexically.

    Raises:
        ToolError: ``PERMISSION_DENIED`` (details ``path``, ``reason``) for ``~``, a leading ``/``
            or a ``..`` that leaves the workspace at any step.
    """
    if rel.startswith("~"):
        raise _denied(rel, "~ is not expanded: name a path inside the workspace")
    if rel.startswith("/"):
        raise _denied(rel, "a relative resource path must not start with /")
    parts: list[str] = []
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise _denied(rel, "path leaves the workspace")
            parts.pop()
        else:
            parts.append(part)
    return "/".join([workspace.rstrip("/"), *parts]) if parts else workspace


def _bool(value: str, key: str) -> bool:
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise invalid_argument(f"{key} must be true or false", argument=key)


def _query_options(query: str) -> dict[str, Any]:
    """``files/read`` options from a URI query string (values checked again by ``parse_args``)."""
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise invalid_argument("malformed URI query", argument="uri") from None
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key not in _QUERY_KEYS:
            raise invalid_argument(f"unknown URI query option {key[:64]!r}", argument=key[:64])
        if key in out:
            raise invalid_argument(f"URI query option {key} given twice", argument=key)
        if key in ("start_line", "end_line"):
            number = digits(value)
            if number is None:
                raise invalid_argument(f"{key} must be an integer", argument=key)
            out[key] = number
        elif key in ("include_metadata", "privileged", "decompress"):
            out[key] = _bool(value, key)
        else:
            out[key] = value
    return out


def uri_privileged(uri: str) -> bool:
    """Whether ``uri``'s query asks for the privileged route, read as :func:`read_args` reads it
    (decoded: ``privileg%65d=true`` is ``privileged=true``); False for a URI it refuses (such a
    call is refused whatever its scopes)."""
    try:
        return bool(_query_options(split_uri(uri)[2]).get("privileged"))
    except ToolError:
        return False


def split_uri(uri: str) -> tuple[str, bool, str]:
    """Split a ``file:`` URI into ``(decoded path, is_relative, query)``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for another scheme, a host other than empty/``localhost``,
            an empty path, a NUL byte, or percent-encoding that is not UTF-8.
    """
    scheme, sep, rest = uri.partition(":")
    if not sep or scheme.lower() != "file":
        raise invalid_argument("only file: URIs are served", argument="uri")
    rest = rest.split("#", 1)[0]
    rest, _, query = rest.partition("?")
    relative = False
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            raise invalid_argument("file: URIs must name a local path (host empty or localhost)", argument="uri")
        raw = slash + path
    else:
        raw, relative = rest, not rest.startswith("/")
    if not raw:
        raise invalid_argument("the URI names no path", argument="uri")
    try:
        path = urllib.parse.unquote(raw, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise invalid_argument("the URI path is not percent-encoded UTF-8", argument="uri") from None
    if "\0" in path:
        raise invalid_argument("path must not contain a NUL byte", argument="uri")
    return path, relative, query


def read_args(uri: str, params: Mapping[str, Any], workspace: str | None) -> dict[str, Any]:
    """The ``files/read`` arguments (as ``files_read.parse_args`` returns them) for one read.

    Args:
        uri: the ``file:`` URI. params: the ``resources/read`` params (``encoding``,
            ``includeMetadata``, ``lineRange``, ``privileged``, ``decompress``; others ignored).
        workspace: the caller's workspace (absolute) or ``None``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` or ``PERMISSION_DENIED`` (see the module docstring).
    """
    path, relative, query = split_uri(uri)
    if relative:
        if workspace is None:
            raise invalid_argument("relative resource path, but no workspace is configured", argument="uri")
        path = resolve_relative(path, workspace)
    args: dict[str, Any] = {"include_metadata": True, **_query_options(query), "path": path}
    if "encoding" in params:
        args["encoding"] = params["encoding"]
    if "includeMetadata" in params:
        args["include_metadata"] = params["includeMetadata"]
    if "privileged" in params:
        args["privileged"] = params["privileged"]
    if "decompress" in params:
        args["decompress"] = params["decompress"]
    if "lineRange" in params:
        rng = params["lineRange"]
        if not isinstance(rng, dict) or set(rng) - {"start", "end"}:
            raise invalid_argument("lineRange must be an object with start and/or end", argument="lineRange")
        args.pop("start_line", None)
        args.pop("end_line", None)
        if rng.get("start") is not None:
            args["start_line"] = rng["start"]
        if rng.get("end") is not None:
            args["end_line"] = rng["end"]
    return files_read.parse_args(args)


class FileResources:
    """The :class:`mcpd.front.mcp.dispatcher.ResourceProvider` for ``file:`` URIs.

    Args:
        pool: the worker pool (unprivileged route). privileged: the privileged backend (the policy process's client).
        workspaces: principal name → absolute workspace folder (mcpd.yaml ``workspaces``).
        default_workspace: ``~`` (the OS account's home), ``""`` (none) or an absolute folder.
    """

    def __init__(
        self, pool: ToolPool, privileged: PrivilegedBackend, workspaces: Mapping[str, str], default_workspace: str
    ) -> None:
        self.pool = pool
        self.privileged = privileged
        self.workspaces = dict(workspaces)
        self.default_workspace = default_workspace
        self.limits: LimitsTracker | None = None  # the Dispatcher's, so resource reads count too
        self.access: AccessLog | None = None  # the Dispatcher's: each read is one record (docs/REFERENCE.md §7.1)

    def list_templates(self) -> list[dict[str, Any]]:
        """``resourceTemplates``: the one ``file:///{+path}`` template."""
        return [dict(TEMPLATE)]

    def workspace_of(self, principal: Principal) -> str | None:
        """The principal's workspace folder, or ``None`` when it has none."""
        root = self.workspaces.get(principal.name, self.default_workspace)
        if root == "~":
            try:
                root = pwd.getpwnam(principal.os_user).pw_dir
            except KeyError:
                return None
        if not root.startswith("/"):
            return None
        return "/" + "/".join(p for p in root.split("/") if p not in ("", "."))

    async def read(self, ctx: RequestContext, uri: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The ``ReadResourceResult``: ``{"contents": [{"uri", "mimeType", "text" or "blob", "_meta"?}]}``.

        Args:
            ctx: the request (caller, session). uri: the requested URI (echoed back unchanged).
            params: the ``resources/read`` params (options, see :func:`read_args`).

        Raises:
            RpcError: any ``ToolError`` of parsing, the workspace, the grant or the read, mapped
                by :func:`rpc_error`.
        """
        caller = ctx.caller
        call = Call(self.access, caller.principal, caller.peer, ctx.session_id, "resources/read", {"uri": uri},
                    ctx.trace)
        args: dict[str, Any] | None = None
        try:
            with call:
                args = read_args(uri, params, self.workspace_of(caller.principal))
                call.arguments = args
                if self.limits is not None:  # same quota and answer cap as tools/call (RATE_LIMITED)
                    args = self.limits.charge_call(caller.principal.name, args)
                if args["encoding"] == "base64":
                    args = {**args, "limit": WHOLE}  # a blob is the whole file
                try:
                    result = await self._read(ctx, call, args)
                except ToolError as exc:
                    if exc.code != BINARY_FILE:
                        raise
                    args = {**args, "encoding": "base64", "start_line": None, "end_line": None, "limit": WHOLE}
                    result = await self._read(ctx, call, args)  # not text: the same file as bytes
                if args["encoding"] == "base64" and not (result.get("metadata") or {}).get("eof", True):
                    raise ToolError(FILE_TOO_LARGE, "the file is too large for one resource read",
                                    path=args["path"], suggestion=_PAGE_IT)
                call.result = result
        except ToolError as exc:
            if exc.code == FILE_TOO_LARGE and args is not None and args.get("encoding") == "base64":
                exc = ToolError(FILE_TOO_LARGE, exc.message, **{**exc.details, "suggestion": _PAGE_IT})
            elif exc.code == ENCODING_ERROR and "suggestion" not in exc.details:
                exc = ToolError(ENCODING_ERROR, exc.message, **{**exc.details, "suggestion": _other_encoding(exc)})
            raise rpc_error(exc, ctx.modern, uri) from None
        item: dict[str, Any] = {"uri": uri}
        if args["encoding"] == "base64":
            item.update(mimeType=mime_type(args["path"], binary=True), blob=result["text"])
        else:
            item.update(mimeType=mime_type(args["path"]), text=result["text"])
        if result.get("metadata") is not None:
            item["_meta"] = result["metadata"]
        if isinstance(result.get("redacted"), dict):  # docs/REFERENCE.md §3 "Redaction"
            item["_meta"] = {**item.get("_meta", {}), "redacted": result["redacted"]}
        return {"contents": [item]}

    async def _read(self, ctx: RequestContext, call: Call, args: dict[str, Any]) -> dict[str, Any]:
        """One ``files/read`` op for the resource, on the route ``args["privileged"]`` names."""
        caller = ctx.caller
        args = with_redaction(files_read.NAME, args, caller.principal.redact)
        if args["privileged"]:
            call.stage = "forwarded"
            return await self.privileged.call(
                caller.token, caller.principal, ctx.session_id, caller.peer, files_read.NAME, args, ctx.trace
            )
        call.stage = "unprivileged"
        return await self.pool.call(caller.principal.os_user, files_read.NAME, args,
                                    token=caller.token, owner=caller.principal.name)

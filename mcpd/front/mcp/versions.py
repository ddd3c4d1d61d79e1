"""The MCP revisions this server speaks and what it says about itself in each
(docs/REFERENCE.md §2.1, §1.6): the versions offered, ``initialize``'s answer, the 2026-07-28
revision's ``_meta`` keys, result shape and caching hints.

Which method a revision serves is :mod:`mcpd.front.mcp.session`'s; checking a stateless request's
``_meta`` and headers is the Streamable HTTP transport's.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.version import version

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
# The stateless era (no initialize; version and capabilities in each request's _meta), served on
# Streamable HTTP only (mcpd.front.transport.streamable).
MODERN_VERSIONS = ("2026-07-28",)
#: the first revision without JSON-RPC batches: a session that negotiated it or a later one is
#: refused a batch whole
NO_BATCHES_SINCE = "2025-06-18"
#: the first revision with structured tool output (``outputSchema`` in ``tools/list``)
STRUCTURED_SINCE = "2025-06-18"
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
SERVER_INFO = {"name": "mcpd", "version": version()}
CAPABILITIES = {"tools": {"listChanged": False}, "resources": {"listChanged": False}}
#: the first session-era revision with tasks (docs/REFERENCE.md §2.6), and their capability there
TASKS_SINCE = "2025-11-25"
SESSION_TASKS: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
#: the 2026-07-28 revision's tasks extension, declared in ``server/discover`` and by its clients
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# Caching hints the 2026-07-28 revision requires on these results: (ttlMs, cacheScope). The lists
# change only with the daemon's configuration; a file can change at any time and is the caller's.
LIST_TTL_MS = 300_000
CACHE_HINTS: dict[str, tuple[int, str]] = {
    "server/discover": (LIST_TTL_MS, "public"),
    "tools/list": (LIST_TTL_MS, "public"),
    "resources/list": (LIST_TTL_MS, "public"),
    "resources/templates/list": (LIST_TTL_MS, "public"),
    "resources/read": (0, "private"),
}
INSTRUCTIONS = (
    "mcpd serves this Linux server's files read-only. Call files/read with an absolute path; "
    "use start_line/end_line or offset/limit for large files, and privileged: true only where a "
    "sudo-style grant exists."
)


def session_tasks(version: str | None) -> bool:
    """Whether a session of protocol ``version`` has tasks (2025-11-25 and later session revisions)."""
    return version is not None and version >= TASKS_SINCE


def capabilities(version: str | None) -> dict[str, Any]:
    """The server's capabilities in protocol ``version``: :data:`CAPABILITIES`, with tasks from
    2025-11-25 on (``capabilities.tasks`` in a session, the tasks extension in 2026-07-28)."""
    if version in MODERN_VERSIONS:
        return {**CAPABILITIES, "extensions": {TASKS_EXTENSION: {}}}
    if session_tasks(version):
        return {**CAPABILITIES, "tasks": SESSION_TASKS}
    return CAPABILITIES


def negotiate(requested: str) -> str:
    """Echo a supported protocol version, else offer the newest."""
    return requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION


def modern_result(method: str, result: dict[str, Any]) -> dict[str, Any]:
    """A result as the 2026-07-28 revision shapes it: ``resultType: "complete"``, the server's
    identity in ``_meta``, and ``ttlMs``/``cacheScope`` on the cacheable methods (:data:`CACHE_HINTS`)."""
    out = dict(result)
    out.setdefault("resultType", "complete")  # ("task": a task's CreateTaskResult, docs/REFERENCE.md §2.6)
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_SERVER_INFO: dict(SERVER_INFO)}
    hint = CACHE_HINTS.get(method)
    if hint is not None:
        out["ttlMs"], out["cacheScope"] = hint
    return out

"""``files/filetype``: what a file is, without reading more than a sample.

One flow for both routes. The last component is first examined with ``lstat`` as the worker's own
account (:func:`mcpd.core.walk.lstat_at`), so a symlink is reported as ``inode/symlink`` (with its
target) and a FIFO, socket or device as ``inode/fifo`` etc. without ever being opened: nothing can
block. Otherwise the route's opener is asked once (below) and, when ``lstat`` saw the path, what it
gives must be that inode (else ``PERMISSION_DENIED``, reason ``path changed while opening``).

* Unprivileged route: ``ctx.open_file`` is :func:`mcpd.core.fileopen.open_regular` (the kernel
  judges; it refuses anything but a regular file without opening it).
* Privileged content route: the policy process decided the path (docs/REFERENCE.md §4.4) and
  root resolved, checked and opened it once, but its descriptor never leaves the policy process (a filetype grant is no
  read grant): the policy process sends the worker, in ``ctx.facts``, what that descriptor showed
  (``fstat``'s mode, size, device and inode, and ``readlinkat(fd, "")``'s target for a symlink)
  and, for a regular file only, ``ctx.open_file(path)`` gives a sealed memfd holding the file's
  first :data:`SAMPLE_BYTES` bytes (copied there, not parsed: :func:`mcpd.policy.opened.described`).
  These facts stand in for the ``fstat`` of the unprivileged route, and when the caller may not
  ``lstat`` the path itself, for the ``lstat`` too. ``ctx.open_dir`` is never used,
  ``ctx.open_file`` at most once, and the descriptor is closed by the op. ``ctx.allow``, when
  set, must cover the path.

At most :data:`SAMPLE_BYTES` are read and everything else (libmagic's MIME type, text or binary,
encoding, line endings) is judged from those bytes.
"""

from __future__ import annotations

import codecs
import os
import stat
from typing import Any, NamedTuple

from mcpd.common.readerrors import reader_error
from mcpd.core import magicdb, textdecode
from mcpd.core.fileops import SAMPLE_BYTES, Context, allowed, clean, no_grant, type_name
from mcpd.core.tools import files_filetype
from mcpd.core.walk import lstat_at
from mcpd.helper.wire.errors import INTERNAL_ERROR, PERMISSION_DENIED, ToolError

BINARY_PROBE = 8 * 1024  # a NUL in these first bytes means binary (docs/REFERENCE.md §3's rule)

_INODE_MIME = {
    "dir": "inode/directory",
    "symlink": "inode/symlink",
    "fifo": "inode/fifo",
    "socket": "inode/socket",
    "char": "inode/chardevice",
    "block": "inode/blockdevice",
}


def filetype(path: str, ctx: Context) -> dict[str, Any]:
    """Describe ``path``'s type, MIME type, text/binary nature, encoding and line endings.

    Args:
        path: absolute path; a symlink is described, never followed.
        ctx: the op context (``open_file``; ``allow`` when set; ``facts`` on the privileged
            route, when ``open_file`` gives the sample memfd of a regular file only).

    Returns:
        ``{"path", "type", "mime", "size" (bytes)}`` and, for a symlink, ``"target"``; for a
        regular file also ``"description"`` (libmagic's text), ``"text": bool``,
        ``"encoding": str | None``, ``"bom": bool``, ``"line_endings": "LF" | "CRLF" | "CR" |
        "mixed" | "none" | None`` (None for binary), ``"line_ending_counts"`` and
        ``"sampled_bytes"`` (how many bytes the verdict rests on).

    Raises:
        ToolError: ``FILE_NOT_FOUND``, ``PERMISSION_DENIED`` (kernel refusal, outside the
            grant, or ``path changed while opening``), or the opener's own error.
    """
    path = clean(path)
    if not allowed(ctx, path):
        raise no_grant(path)
    inode, target, fd = _examine(path, ctx)
    kind = type_name(inode.mode)
    result: dict[str, Any] = {"path": path, "type": kind, "size": inode.size}
    if fd is None:
        result["mime"] = _INODE_MIME.get(kind, "inode/x-unknown")
        if target is not None:
            result["target"] = target
        return result
    sample = _sample(fd, path)
    result.update(describe_bytes(sample, truncated=len(sample) >= SAMPLE_BYTES))
    return result


class Inode(NamedTuple):
    """What the op reports and compares of a file: ``st_mode``, size (bytes), device and inode."""

    mode: int
    size: int
    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> Inode:
        return cls(st.st_mode, st.st_size, st.st_dev, st.st_ino)


def _examine(path: str, ctx: Context) -> tuple[Inode, str | None, int | None]:
    """``(inode, symlink target, descriptor to sample)`` of ``path``; the descriptor (the caller
    closes it) is given for a regular file only. See the module docstring for the two routes."""
    try:
        lst, target = lstat_at(path, None)  # the worker's own view: the kernel judges, as the caller
    except OSError:
        lst, target = None, None  # hidden from the caller: the route's opener decides (and names the error)
    if lst is not None and not stat.S_ISREG(lst.st_mode):
        return Inode.of(lst), target, None  # never opened
    inode, target, fd = _opened(path, ctx)
    if lst is not None and (inode.dev, inode.ino) != (lst.st_dev, lst.st_ino):
        if fd is not None:
            os.close(fd)
        raise ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path,
                        reason="path changed while opening")
    return inode, target, fd


def _opened(path: str, ctx: Context) -> tuple[Inode, str | None, int | None]:
    """The route's opener's view of ``path``: ``(inode, symlink target, descriptor to sample)``,
    the descriptor for a regular file only. Privileged route: ``ctx.facts`` and the sample memfd;
    unprivileged: ``fstat`` of the regular file ``ctx.open_file`` opened."""
    facts = getattr(ctx, "facts", None)
    if facts is not None:
        inode, target = _from_facts(facts)
        return inode, target, (ctx.open_file(path) if stat.S_ISREG(inode.mode) else None)
    fd = ctx.open_file(path)
    try:
        inode = Inode.of(os.fstat(fd))
    except OSError as err:
        os.close(fd)
        raise reader_error(err, path) from None
    if stat.S_ISREG(inode.mode):
        return inode, None, fd
    os.close(fd)  # (the unprivileged opener gives regular files only): described, never read
    return inode, None, None


def _from_facts(facts: dict[str, Any]) -> tuple[Inode, str | None]:
    """The :class:`Inode` and symlink target the policy process sent; ``INTERNAL_ERROR`` when
    they are missing or malformed (a broken policy process: nothing is guessed)."""
    numbers: list[Any] = [facts.get(k) for k in Inode._fields]
    target = facts.get("target")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers) or not (
            target is None or isinstance(target, str)):
        raise ToolError(INTERNAL_ERROR, "internal error: the file's facts are missing")
    return Inode(*numbers), target


def _sample(fd: int, path: str) -> bytes:
    """Read up to :data:`SAMPLE_BYTES` from the start of the open regular file ``fd``, then close it."""
    try:
        chunks: list[bytes] = []
        got = 0
        while got < SAMPLE_BYTES:
            chunk = os.pread(fd, SAMPLE_BYTES - got, got)  # never the shared offset: the descriptor may be shared
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise reader_error(err, path) from None
    finally:
        os.close(fd)


def describe_bytes(sample: bytes, truncated: bool) -> dict[str, Any]:
    """Judge the first bytes of a regular file.

    Args:
        sample: up to :data:`SAMPLE_BYTES` bytes from the start of the file.
        truncated: True when the file may continue past ``sample`` (a character or a
            ``\\r\\n`` cut at the end is then not held against it).

    Returns:
        The regular-file fields documented in :func:`filetype`.
    """
    mime = magicdb.classifier("mime").from_buffer(sample)
    description = magicdb.classifier("description").from_buffer(sample)
    encoding, bom = _encoding(sample, truncated)
    out: dict[str, Any] = {
        "mime": mime,
        "description": description,
        "text": encoding is not None or not sample,
        "encoding": encoding,
        "bom": bom,
        "line_endings": None,
        "line_ending_counts": None,
        "sampled_bytes": len(sample),
    }
    if encoding is not None:
        text = sample.decode(encoding, errors="replace")
        if bom and text.startswith("\ufeff"):
            text = text[1:]
        if truncated and text.endswith("\r"):
            text = text[:-1]  # its "\n" may be the next byte
        out["line_endings"], out["line_ending_counts"] = _line_endings(text)
    elif not sample:
        out["line_endings"] = "none"
        out["line_ending_counts"] = {"LF": 0, "CRLF": 0, "CR": 0}
    return out


def _encoding(sample: bytes, truncated: bool) -> tuple[str | None, bool]:
    """``(encoding, bom)``: BOM first, then strict UTF-8, then the reading core's guess
    (:func:`mcpd.core.textdecode.detect`: libmagic and charset-normalizer); None = binary."""
    bom_codec, _ = textdecode.sniff_bom(sample)
    if bom_codec is not None:
        return bom_codec, True
    if not sample or b"\0" in sample[:BINARY_PROBE]:
        return None, False
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(sample, final=not truncated)
        return "utf-8", False
    except UnicodeDecodeError:
        pass
    guess = textdecode.detect(sample)
    return (None, False) if guess == "unknown" else (guess, False)


def _line_endings(text: str) -> tuple[str, dict[str, int]]:
    """Classify line terminators in ``text``: one kind, ``mixed``, or ``none``."""
    crlf = text.count("\r\n")
    counts = {"LF": text.count("\n") - crlf, "CRLF": crlf, "CR": text.count("\r") - crlf}
    kinds = [k for k, n in counts.items() if n]
    if not kinds:
        return "none", counts
    return (kinds[0] if len(kinds) == 1 else "mixed"), counts


def op_filetype(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/filetype`` op handler: validates ``args`` again (the op trusts no caller).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` from ``files_filetype.parse_args``, or :func:`filetype`'s.
    """
    return filetype(files_filetype.parse_args(args)["path"], ctx)

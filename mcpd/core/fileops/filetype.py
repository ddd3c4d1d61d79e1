"""``files/filetype``: what a file is, without reading more than a sample (issue 4).

One flow for both routes. The last component is first examined with ``lstat`` as the worker's own
account (:func:`mcpd.core.walk.lstat_at`), so a symlink is reported as ``inode/symlink`` (with its
target) and a FIFO, socket or device as ``inode/fifo`` etc. without ever being opened: nothing can
block. Otherwise the path is opened once through ``ctx.open_file`` and, when ``lstat`` saw it, the
descriptor must be that inode (else ``PERMISSION_DENIED``, reason ``path changed while opening``).

* Unprivileged route: ``ctx.open_file`` is :func:`mcpd.core.fileopen.open_regular` (the kernel
  judges; it refuses anything but a regular file without opening it).
* Privileged content route: the root helper decided, resolved and checked the path (SPEC §4.4) and
  handed its one descriptor to the caller's worker, whose ``ctx.open_file(path)`` returns it:
  ``O_RDONLY`` for a regular file, ``O_PATH`` (opened for nothing: no driver run, no FIFO reader)
  for anything else. When the caller may not ``lstat`` the path itself, the type, size and a
  symlink's target come from that descriptor (``fstat``, ``readlinkat(fd, "")``); only a regular
  file's descriptor is ever read. ``ctx.open_dir`` is never used, ``ctx.open_file`` at most once,
  and the descriptor is closed by the op. ``ctx.allow``, when set, must cover the path.

At most :data:`SAMPLE_BYTES` are read and everything else (libmagic's MIME type, text or binary,
encoding, line endings) is judged from those bytes.
"""

from __future__ import annotations

import codecs
import os
import stat
from typing import Any

import magic

from mcpd.common.errors import PERMISSION_DENIED, ToolError, from_oserror
from mcpd.core import textdecode
from mcpd.core.fileops import SAMPLE_BYTES, Context, allowed, clean, no_grant, type_name
from mcpd.core.tools import files_filetype
from mcpd.core.walk import lstat_at

BINARY_PROBE = 8 * 1024  # a NUL in these first bytes means binary (SPEC §3's rule)

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
        ctx: the op context (``open_file``, which on the privileged route may return an
            ``O_PATH`` descriptor of a non-regular file; ``allow`` when set).

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
    st, target, fd = _examine(path, ctx)
    kind = type_name(st.st_mode)
    result: dict[str, Any] = {"path": path, "type": kind, "size": st.st_size}
    if fd is None:
        result["mime"] = _INODE_MIME.get(kind, "inode/x-unknown")
        if target is not None:
            result["target"] = target
        return result
    sample = _sample(fd, path)
    result.update(describe_bytes(sample, truncated=len(sample) >= SAMPLE_BYTES))
    return result


def _examine(path: str, ctx: Context) -> tuple[os.stat_result, str | None, int | None]:
    """``(stat, symlink target, descriptor to sample)`` of ``path``; the descriptor (the caller
    closes it) is given for a regular file only. See the module docstring for the two routes."""
    try:
        lst, target = lstat_at(path, None)  # the worker's own view: the kernel judges, as the caller
    except OSError:
        lst, target = None, None  # hidden from the caller: the route's opener decides (and names the error)
    if lst is not None and not stat.S_ISREG(lst.st_mode):
        return lst, target, None  # never opened
    fd = ctx.open_file(path)
    try:
        st = os.fstat(fd)
        if lst is not None and (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino):
            raise ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path,
                            reason="path changed while opening")
        if stat.S_ISREG(st.st_mode):
            return st, None, fd
        target = os.readlink("", dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None  # readlinkat(fd, "")
    except OSError as err:
        os.close(fd)
        raise from_oserror(err, path) from None
    except ToolError:
        os.close(fd)
        raise
    os.close(fd)  # an O_PATH descriptor (privileged route): described, never read
    return st, target, None


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
        raise from_oserror(err, path) from None
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
    mime = magic.from_buffer(sample, mime=True)
    description = magic.from_buffer(sample)
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

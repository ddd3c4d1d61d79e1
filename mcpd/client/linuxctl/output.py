"""How ``linuxctl`` writes results: data on stdout, summaries and notes on stderr.

Readable output never prints text the server or a file's owner controls (names, paths, messages)
as it is: it goes through :func:`mcpd.common.printable.printable`, so a file name holding a
newline, a terminal escape or a bidirectional override is shown escaped and cannot forge lines.
``--json`` is JSON (which escapes control characters itself); :func:`raw_path` gives the bytes
``find files -0`` writes. Errors are :mod:`.calls`'.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from mcpd.client.api import text_of
from mcpd.common.printable import printable


def write_out(data: bytes) -> None:
    """Write ``data`` to stdout exactly (no added newline); a closed pipe ends quietly."""
    out = sys.stdout.buffer
    try:
        out.write(data)
        out.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


def print_text(result: dict[str, Any]) -> None:
    """Print a listing-style result's text, escaped line by line, with exactly one final newline."""
    text = "\n".join(printable(line) for line in text_of(result).removesuffix("\n").split("\n"))
    write_out((text + "\n").encode("utf-8"))


def print_split(body: str, notes: list[str]) -> None:
    """Print ``body`` (the data lines, already escaped) on stdout and the ``notes`` (summaries,
    warnings, already escaped) on stderr."""
    if body:
        write_out((body if body.endswith("\n") else body + "\n").encode("utf-8"))
    for note in notes:
        click.echo(note, err=True)


def escaped_lines(text: str, fragments: list[str]) -> list[str]:
    """``text`` split into lines, each through :func:`printable`, where each of ``fragments`` (a
    path the server names, which may hold a newline) stays whole on its line: the fragments are
    set aside before the split and put back escaped."""
    keep = sorted({f for f in fragments if f and printable(f) != f}, key=len, reverse=True)
    for i, fragment in enumerate(keep):
        text = text.replace(fragment, f"\0{i}\0")  # no name holds a NUL: the marks are unambiguous
    lines = [printable(line) for line in text.split("\n")]
    for i, fragment in enumerate(keep):
        mark, shown = printable(f"\0{i}\0"), printable(fragment)
        lines = [line.replace(mark, shown) for line in lines]
    return lines


def raw_path(path: str) -> bytes:
    """The bytes of a path as the server's file system holds them (a name that is not UTF-8
    arrives with its bytes as lone surrogates, ``os.fsdecode``'s convention)."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogatepass")


def print_json(result: dict[str, Any], notes: list[str]) -> None:
    """Print the result's ``structuredContent`` as one JSON document; ``notes`` go to stderr."""
    click.echo(json.dumps(result.get("structuredContent"), indent=2, ensure_ascii=False))
    for note in notes:
        click.echo(note, err=True)

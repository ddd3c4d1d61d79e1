"""Calling the text reader as the worker does, over generated text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mcpd.common.config import ReadLimits
from mcpd.core import fileopen, ops

LIMITS = ReadLimits()


CTX = ops.OpContext(limits=LIMITS, open_file=fileopen.open_regular, open_dir=fileopen.open_directory)


def call(path: Path | str, limits: ReadLimits = LIMITS, **args: Any) -> dict[str, Any]:
    ctx = dataclasses.replace(CTX, limits=limits)
    reply = ops.run({"id": 7, "op": "files/read", "args": {"path": str(path), **args}}, ctx)
    assert reply["id"] == 7
    return reply


def text(path: Path | str, limits: ReadLimits = LIMITS, **args: Any) -> str:
    reply = call(path, limits, **args)
    assert reply["ok"], reply
    return str(reply["result"]["text"])

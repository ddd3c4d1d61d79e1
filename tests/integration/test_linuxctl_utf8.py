"""linuxctl given a path that is not valid UTF-8 (raw bytes from the shell) answers a clean usage
error naming the byte, exit 2, for every command that sends one: never a traceback."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.support.linuxctl import flags, linuxctl

BAD = os.fsdecode(b"/tmp/caf\x9b.txt")  # what Python makes of argv bytes that are no UTF-8


@pytest.mark.parametrize("command", [("get", "files"), ("get", "filetype"), ("list", "files"), ("find", "files")])
def test_a_path_that_is_not_utf8_is_a_usage_error_not_a_traceback(daemon: Any, command: tuple[str, str]) -> None:
    res = linuxctl(*flags(daemon), *command, BAD)
    assert res.returncode == 2, res.stderr
    assert b"Traceback" not in res.stderr and b"UnicodeEncodeError" not in res.stderr
    assert b"not valid UTF-8 (byte 0x9b at offset 8)" in res.stderr, res.stderr


def test_a_find_pattern_that_is_not_utf8_is_a_usage_error(daemon: Any) -> None:
    res = linuxctl(*flags(daemon), "find", "files", "/tmp", "--name", os.fsdecode(b"*\xff*"))
    assert res.returncode == 2 and b"Traceback" not in res.stderr and b"byte 0xff" in res.stderr, res.stderr

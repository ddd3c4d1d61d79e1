"""The record of a privileged read through a symlink names the file root opened (docs/REFERENCE.md,
the audit record's fields).

A grant covering ``/`` follows symlinks: root opens wherever the link leads and hands the
policy process the descriptor's real path, which it checks against the daemon's secrets. The
record named only the request (``requested_path``, and ``resolved_path``, its lexical cleaning):
a principal could read a root-only file through a link of an innocent name, remove the link, and
no record named the file read. The record now carries ``real_path``, the descriptor's real path,
whenever it is not the path judged; ``mcpd audit tail`` shows it and ``--path`` matches it.

Attacker: alice, granted ``/``, calling through the real front.
"""

from __future__ import annotations

import pytest

from tests.support.privsep_fixture import LOG_TEXT, SECRET_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401
from tests.support.root_objects import call, everywhere  # noqa: F401

pytestmark = pytest.mark.root


def test_the_record_of_a_read_through_a_symlink_names_the_file_read(everywhere: PrivsepDaemon) -> None:  # noqa: F811
    """alice reads the root-only file through ``notes.txt``, a symlink she then removes: the accept
    record names the link as asked and the root-only file as ``real_path``; a read of a plain path
    carries no ``real_path``."""
    d = everywhere
    link = d.srv / "app-evil" / "notes.txt"
    link.symlink_to(d.secret)
    try:
        got = call(d, "files/read", path=str(link))
    finally:
        link.unlink()
    assert got.get("text") == SECRET_TEXT  # granted: the grant covers /, which follows symlinks
    assert call(d, "files/read", path=str(d.log_file)).get("text") == LOG_TEXT
    records = [r for r in d.audit() if r.get("event") == "accept" and r.get("tool") == "files/read"]
    (through,) = [r for r in records if r.get("requested_path") == str(link)][-1:]
    (plain,) = [r for r in records if r.get("requested_path") == str(d.log_file)][-1:]
    assert (through["resolved_path"], through.get("real_path")) == (str(link), str(d.secret)), through
    assert "real_path" not in plain, plain

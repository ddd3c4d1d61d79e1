"""The root helper's socket protocol, spoken to directly (docs/PRIVSEP.md §3, §4; docs/REFERENCE.md §4.1, §5.1).

Each probe is a separate process that connects to the helper's socket with the uid, gid and
groups a case needs (the service user ``mcpd``, root, or a test account that is a member of the
``mcpd`` group), sends one frame or a bare length header, and prints what came back as JSON.
Root only.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from mcpd.helper.wire import frames
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon, proc_status  # noqa: F401
from tests.support.root_channels import as_mcpd, probe

pytestmark = pytest.mark.root
GIB = 1 << 30


def alerts(d: PrivsepDaemon) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r["event"] == "alert"]


def new_alert(d: PrivsepDaemon, before: int, seconds: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        found = alerts(d)
        if len(found) > before:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError("no alert record")
        time.sleep(0.05)


def rss_kib(pid: int) -> int:
    return int(proc_status(pid)["VmRSS"].split()[0])


def test_frame_announcing_1gb_is_refused_without_allocating(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    before, rss_before = len(alerts(d)), rss_kib(d.helper_pid)
    answer = as_mcpd(d, "header", GIB)
    assert answer["closed"] is True
    rec = new_alert(d, before)
    assert "malformed frame" in rec["reason"] and f"uid={d.service.pw_uid}" in rec["peer"]
    assert rss_kib(d.helper_pid) - rss_before < 32 * 1024  # KiB: far below the announced 1 GiB
    assert GIB > frames.HELPER_REQUEST_CAP


def test_unknown_request_type_alerts_and_closes(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    before = len(alerts(d))
    assert as_mcpd(d, "frame", {"type": "exec_shell", "cmd": "id"})["closed"] is True
    assert new_alert(d, before)["reason"] == "unknown request type"
    before = len(alerts(d))
    assert as_mcpd(d, "frame", {"type": "authenticate", "token": 5})["closed"] is True  # schema broken
    assert "authenticate" in new_alert(d, before)["reason"]


def test_connection_from_root_is_refused_with_alert(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    before = len(alerts(d))
    answer = probe(d, "frame", {"type": "authenticate", "token": d.tokens["alice"]}, 0, 0)
    assert answer["closed"] is True
    rec = new_alert(d, before)
    assert "uid=0 " in rec["peer"] + " " and "service user" in rec["reason"]


def test_other_account_in_the_service_group_is_refused_with_alert(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    alice = d.accounts["alice"]
    before = len(alerts(d))
    answer = probe(d, "frame", {"type": "authenticate", "token": d.tokens["alice"]}, alice.uid, alice.gid,
                   (d.service.pw_gid,))  # group membership alone is never enough
    assert answer["closed"] is True
    assert f"uid={alice.uid}" in new_alert(d, before)["peer"]


def test_authenticate_from_the_service_user(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    ok = as_mcpd(d, "frame", {"type": "authenticate", "id": 1, "token": d.tokens["alice"]})
    assert ok["reply"]["ok"] is True and ok["reply"]["id"] == 1
    assert ok["reply"]["principal"]["os_user"] == d.accounts["alice"].name
    bad = as_mcpd(d, "frame", {"type": "authenticate", "id": 2, "token": d.tokens["alice"] + "x"})
    assert bad["reply"] == {"ok": False, "id": 2}


def test_spawn_worker_refused_for_a_bad_token_and_root(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    unknown = as_mcpd(d, "frame", {"type": "spawn_worker", "id": 1, "token": d.tokens["alice"] + "x"})
    assert unknown["fds"] == 0 and unknown["reply"]["ok"] is False
    assert unknown["reply"]["error"]["details"]["reason"] == "invalid token"
    root = as_mcpd(d, "frame", {"type": "spawn_worker", "id": 2, "token": d.tokens["rooty"]})  # rooty maps to root
    assert root["fds"] == 0 and root["reply"]["ok"] is False
    assert root["reply"]["error"]["details"]["reason"] == "root account"


def test_spawn_worker_for_a_mapped_account_passes_the_socket(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    answer = as_mcpd(d, "frame", {"type": "spawn_worker", "id": 1, "token": d.tokens["bob"]})
    assert answer["reply"]["ok"] is True and answer["fds"] == 1
    pid = answer["reply"]["pid"]
    assert proc_status(pid)["Uid"].split()[0] == str(d.accounts["bob"].uid)
    status = proc_status(pid)
    assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"


def test_kill_worker_refuses_pids_it_did_not_spawn(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    answer = as_mcpd(d, "frame", {"type": "kill_worker", "id": 1, "token": d.tokens["alice"], "pid": d.front_pid})
    assert answer["reply"]["ok"] is False and answer["reply"]["error"]["details"]["reason"] == "not your worker"
    assert proc_status(d.front_pid)["State"][0] in "RS"
"""Checkpoints leave the host, and prove the log against a rewrite the host can make whole again
(docs/REFERENCE.md §7.3): the real daemon's two writers send them to a syslog socket, a real
journald (in a namespace of the test's own) takes the journal's and syslog's copies; `mcpd audit
verify --checkpoints` then passes on the untouched logs, and names what was cut or rewritten,
also when the chain and the head state were recomputed so that plain `verify` passes."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mcpd.common.audit.checkpoint import CHECKPOINT_IDENT
from mcpd.common.audit.writer import AuditLog
from tests.support.audit import call, forge_head, mcpd, rechain
from tests.support.journal import entries, journal, journal_json  # noqa: F401 - journal: a fixture
from tests.support.privsep_fixture import running_privsep
from tests.support.syslog import SyslogSink


@pytest.mark.root
def test_the_journal_keeps_both_copies_and_they_prove_the_log(journal: tuple[str, str], tmp_path: Path) -> None:
    ns, sock = journal
    log = tmp_path / "audit.jsonl"
    with AuditLog(str(log), journal=sock, checkpoints=(2, 60), syslog_socket=sock.replace("socket", "dev-log")) as w:
        for i in range(5):
            w.record("accept", user="alice", requested_path=f"/srv/f{i}")
    entries(ns, CHECKPOINT_IDENT, 6)  # (waits for journald to file them)
    lines = journal_json(ns, CHECKPOINT_IDENT)
    export = tmp_path / "journal.json"
    export.write_text("".join(line + "\n" for line in lines))
    found = [json.loads(line) for line in lines]
    native = [e for e in found if "MCPD_CHECKPOINT_SEQ" in e]
    assert sorted(e["MCPD_CHECKPOINT_SEQ"] for e in native) == ["2", "4", "5"]  # every 2 records, and on close
    assert len(found) == 6  # and each again as journald's syslog socket took it in
    proc = mcpd("audit", "verify", "--checkpoints", str(export), str(log))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: checkpoints: 3 of mcpd-audit match the log, the last covering seq 5" in proc.stdout
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:3]))  # cut after the checkpoint of seq 2
    proc = mcpd("audit", "verify", "--checkpoints", str(export), str(log))
    assert proc.returncode == 1 and f"{log}:3: truncated: record seq 4 is missing: the log ends at seq 3" in proc.stdout


@pytest.mark.root
def test_a_consistent_rewrite_of_the_daemons_log_is_caught_by_its_checkpoints(tmp_path: Path) -> None:
    sink = SyslogSink()
    try:
        with running_privsep(audit={"checkpoint_records": 1, "checkpoint_seconds": 60,
                                    "syslog_socket": sink.path}) as d:
            privileged = call(d, "alice", d.log_file, True)
            assert not privileged.get("isError"), privileged
            call(d, "alice", d.srv / "no-such-file", False)  # the front's access log records this one
            assert d.front is not None
            d.front.terminate()
            d.front.wait(30)
            d.kill_helper(signal.SIGTERM)  # every record written, and its checkpoint sent
            cps = sink.write(tmp_path / "syslog.log")
            config = ["--config", str(d.config_path)]
            last = json.loads(d.audit_path.read_bytes().splitlines()[-1])["seq"]

            for access in ([], ["--access"]):
                proc = mcpd("audit", "verify", *config, "--checkpoints", str(cps), *access)
                assert proc.returncode == 0, proc.stdout + proc.stderr
                assert "OK: checkpoints: " in proc.stdout and "of other logs not checked" in proc.stdout
            assert f"the last covering seq {last};" in mcpd("audit", "verify", *config, "--checkpoints",
                                                             str(cps)).stdout

            original = d.audit_path.read_bytes()
            d.audit_path.write_bytes(b"".join(original.splitlines(keepends=True)[:-2]))  # its last 2 records cut
            proc = mcpd("audit", "verify", *config, "--checkpoints", str(cps))
            assert proc.returncode == 1 and f"truncated: record seq {last - 1} is missing" in proc.stdout

            d.audit_path.write_bytes(original)
            served = next(json.loads(line) for line in original.splitlines() if b'"decision":"accept"' in line
                          and str(d.log_file).encode() in line)
            rechain(d.audit_path, served["seq"], str(d.log_file).encode(), str(d.log_file).upper().encode())
            forge_head(d)
            plain = mcpd("audit", "verify", *config)
            assert plain.returncode == 0, plain.stdout + plain.stderr  # whole chain, end where its head says
            proc = mcpd("audit", "verify", *config, "--checkpoints", str(cps))
            assert proc.returncode == 1
            line = next(x for x in proc.stdout.splitlines() if "rewritten" in x)
            assert f": rewritten: record seq {served['seq']} hashes to " in line
            assert line.endswith(f"the first record changed is one of seq {served['seq']}..{served['seq']} "
                                 f"(the checkpoint of seq {served['seq'] - 1} matches)")
    finally:
        sink.close()

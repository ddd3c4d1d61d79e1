"""``mcpd status`` against a running daemon (root helper, front as the service user, metrics on):
every fact it reports is checked against the daemon's own files and the wire, a refused reload,
an invalid grants file and a dead helper show as problems (exit 1), and text from a certificate
is escaped."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcpd.common.version import version
from tests.conftest import SseSession
from tests.support.net import free_port
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, running_privsep, start_privsep, stop_privsep
from tests.support.tls import Target, file_fingerprint, hup, install, new_pair, served, wait_served

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def d() -> Iterator[PrivsepDaemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    front_state = Path(tempfile.mkdtemp(prefix="mcpd-front-state-", dir="/tmp"))
    daemon = None
    try:
        svc = pwd.getpwnam("mcpd")
        os.chown(front_state, svc.pw_uid, svc.pw_gid)
        os.chmod(front_state, 0o750)
        daemon = start_privsep(AccountFactory(), metrics_listen=f"127.0.0.1:{free_port()}",
                               state_dir=str(front_state))
        yield daemon
    finally:
        if daemon is not None:
            stop_privsep(daemon)
        subprocess.run(["rm", "-rf", str(front_state)], check=False)


def status(d: PrivsepDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "status", "--config", str(d.config_path), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def as_json(d: PrivsepDaemon) -> tuple[int, dict[str, Any]]:
    proc = status(d, "--json")
    return proc.returncode, json.loads(proc.stdout)


def cert_named(d: PrivsepDaemon, cn: str) -> tuple[bytes, bytes]:
    ca_key = serialization.load_pem_private_key((d.state_dir / "tls" / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((d.state_dir / "tls" / "ca.crt").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def test_status_reports_the_running_daemon(d: PrivsepDaemon) -> None:
    async def with_one_sse_session() -> tuple[tuple[int, dict[str, Any]], subprocess.CompletedProcess[str]]:
        async with SseSession(Target(d.url, d.cacert, d.tokens["alice"])) as s:  # type: ignore[arg-type]
            await s.initialize()
            return await asyncio.to_thread(as_json, d), await asyncio.to_thread(status, d)

    (code, s), plain = asyncio.run(with_one_sse_session())
    assert code == 0 and s["problems"] == [], s["problems"]
    assert s["version"] == version()
    port = d.url.rsplit(":", 1)[1]
    assert s["listen"]["address"] == f"127.0.0.1:{port}" and s["listen"]["answers"]
    on_disk = file_fingerprint((d.state_dir / "tls" / "server.crt").read_bytes())
    assert s["listen"]["fingerprint_sha256"] == served(d) == on_disk == s["tls"]["fingerprint_sha256"]
    assert s["tls"]["valid"] and s["tls"]["front"]["last_check_ok"]
    assert s["tls"]["front"]["fingerprint_sha256"] == on_disk and s["tls"]["front"]["pid"] == d.front_pid
    assert s["metrics"]["answers"] and s["metrics"]["sessions"].get("sse") == 1
    assert s["metrics"]["helper_up"] is True and isinstance(s["metrics"]["workers"], int)
    assert s["helper"]["socket_present"]
    assert s["policy"]["grants_valid"] and s["policy"]["users_valid"]
    assert s["policy"]["last_reload"]["ok"]
    last = [json.loads(ln) for ln in d.audit_text().splitlines() if ln.strip()][-1]
    head = s["chains"]["audit"]
    assert head["seq"] <= last["seq"] and head["seq"] > 0 and len(head["hash"]) == 64

    assert plain.returncode == 0, plain.stdout + plain.stderr
    for needle in (f"mcpd: {version()}", f"listening: 127.0.0.1:{port} (answers, TLSv1.3)", f"fingerprint: {on_disk}",
                   "sessions: mcp 0, sse 1", "policy process answers", "problems: none"):
        assert needle in plain.stdout, plain.stdout


def test_a_refused_reload_and_a_broken_grants_file_are_problems(d: PrivsepDaemon) -> None:
    good = served(d)
    cert, _ = new_pair(d)
    _, other_key = new_pair(d)
    install(d, cert, other_key)
    hup(d)
    deadline = time.monotonic() + 20
    while True:
        code, s = as_json(d)
        if s["tls"]["front"] and s["tls"]["front"]["refused"]:
            break
        assert time.monotonic() < deadline, s
    assert code == 1 and served(d) == good
    assert s["listen"]["fingerprint_sha256"] == good and not s["tls"]["valid"]
    assert any("last TLS reload was refused" in p for p in s["problems"]), s["problems"]
    assert any("TLS files would be refused" in p for p in s["problems"]), s["problems"]
    text = d.grants_path.read_text()
    try:
        d.write_grants("users: [\n", hup=False)
        code, s = as_json(d)
        assert code == 1 and not s["policy"]["grants_valid"]
        assert any("grants file" in p for p in s["problems"])
    finally:
        d.write_grants(text, hup=False)
    cert, key = new_pair(d)
    install(d, cert, key)
    hup(d)
    wait_served(d, file_fingerprint(cert))


def test_text_from_a_certificate_is_escaped_in_the_plain_view(d: PrivsepDaemon) -> None:
    cert, key = cert_named(d, "evil\x1b[2J\u202ename")
    install(d, cert, key)
    hup(d)
    wait_served(d, file_fingerprint(cert))
    plain = status(d)
    assert "\x1b" not in plain.stdout and "\u202e" not in plain.stdout, plain.stdout
    assert "evil" in plain.stdout
    code, s = as_json(d)
    assert "evil\x1b[2J\u202ename" in s["listen"]["subject"]  # JSON keeps the text, escaped by JSON itself
    cert, key = new_pair(d)
    install(d, cert, key)
    hup(d)
    wait_served(d, file_fingerprint(cert))


def test_a_missing_users_file_is_said_as_users_check_says_it(d: PrivsepDaemon) -> None:
    """No users.yaml: the daemon runs with no principals; status and `mcpd users check` both say
    it is missing and how to make the first principal (status does not call it valid)."""
    users = d.state_dir / "users.yaml"
    aside = d.state_dir / ".users.yaml.aside"
    os.rename(users, aside)
    try:
        plain = status(d)
        said = "missing (no principals yet: mcpd users add NAME --os-user ACCOUNT)"
        assert f"users file: {users}: {said}" in plain.stdout, plain.stdout
        checked = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", "check", str(users)],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert (checked.returncode, checked.stderr) == (1, f"{users}: {said}\n")
    finally:
        os.rename(aside, users)


def test_a_dead_helper_is_a_problem_even_with_metrics_off() -> None:
    """With the default configuration (no metrics endpoint to ask), status connects to the helper
    socket: while the helper runs it is accepted (as the service user: the policy process records
    no alert for it); once the helper is killed, its socket file still there, the refused
    connection is a problem and status exits 1."""
    with running_privsep() as alive:
        code, s = as_json(alive)
        assert code == 0 and s["problems"] == [], s["problems"]
        assert s["helper"]["socket_present"] and s["helper"]["accepts"] is True
        assert "accepts connections" in status(alive).stdout
        assert not [r for r in alive.audit() if r.get("event") == "alert"], alive.audit()
        alive.kill_helper()
        assert alive.socket_path.exists()  # what `present` alone used to call healthy
        code, s = as_json(alive)
        assert code == 1 and s["helper"]["accepts"] is False, s["helper"]
        assert any(f"the helper socket {alive.socket_path} accepts no connection" in p for p in s["problems"]), \
            s["problems"]
        plain = status(alive)
        assert plain.returncode == 1 and "problems: none" not in plain.stdout, plain.stdout
        assert "accepts no connection (Connection refused)" in plain.stdout, plain.stdout


def _child_as_service() -> tuple[int, pwd.struct_passwd]:
    """A child of this process running as the service account, as `mcpd status` forks one to
    connect to the helper socket; it lingers (a connect that takes its time)."""
    svc = pwd.getpwnam("mcpd")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(svc.pw_gid)
            os.setuid(svc.pw_uid)
            time.sleep(60)
        finally:
            os._exit(0)
    for _ in range(200):
        with open(f"/proc/{pid}/status") as f:
            if f"\nUid:\t{svc.pw_uid}\t" in f.read():
                return pid, svc
        time.sleep(0.01)
    raise AssertionError("the child never became the service account")


def test_a_child_the_service_account_stops_cannot_hang_status() -> None:
    """The service account may signal the child status runs as it: stopped (SIGSTOP, sent by
    that account), the wait ends at its deadline, the child is killed and reaped, and the answer is
    unknown, not a hang."""
    from mcpd.admin.status import _reap
    pid, svc = _child_as_service()
    subprocess.run(["setpriv", f"--reuid={svc.pw_uid}", f"--regid={svc.pw_gid}", "--clear-groups",
                    "kill", "-STOP", str(pid)], check=True, timeout=30)
    began = time.monotonic()
    try:
        code = _reap(pid, 1.0)
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # (not reaped: still ours)
        os.waitpid(pid, 0)
        raise
    assert code is None
    assert 1.0 <= time.monotonic() - began < 3.0
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)
    pid, _ = _child_as_service()
    os.kill(pid, signal.SIGTERM)  # a child that ends in time: its status, as before
    assert _reap(pid, 5.0) == -signal.SIGTERM


STOPPER = r"""
import os, signal, sys, time
parent, uid = sys.argv[1], sys.argv[2]
with open(f"/proc/{parent}/cmdline", "rb") as f:
    forked = f.read()  # (a fork of status, not another child of the test's, such as a daemon's front)
end = time.monotonic() + 20
while time.monotonic() < end:
    for p in filter(str.isdigit, os.listdir("/proc")):
        if int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                t = f.read()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                same = f.read() == forked
        except OSError:
            continue
        if same and f"\nPPid:\t{parent}\n" in t and f"\nUid:\t{uid}\t" in t:
            os.kill(int(p), signal.SIGSTOP)
            print(p, flush=True)
            sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
"""


def test_status_as_root_answers_when_the_service_account_stops_its_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack end to end: status (as root) forks its connect to the helper socket as the
    service account; that account, scanning /proc, stops the child (SIGSTOP). Status still answers
    by its deadline: whether the socket accepts is unknown, with the reason, a problem; the child
    is killed and reaped. (The connect is made to linger so the attacker's scan finds it surely.)"""
    from mcpd.admin import status as status_module
    from mcpd.common import config
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    os.chmod(folder, 0o755)
    sock = folder / "helper.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(8)
    os.chmod(sock, 0o777)
    real = status_module._connect
    monkeypatch.setattr(status_module, "_connect", lambda path: (time.sleep(30), real(path))[1])
    svc = pwd.getpwnam("mcpd")
    stopper = subprocess.Popen(["setpriv", f"--reuid={svc.pw_uid}", f"--regid={svc.pw_gid}", "--clear-groups",
                                sys.executable, "-c", STOPPER, str(os.getpid()), str(svc.pw_uid)],
                               stdout=subprocess.PIPE, text=True)

    def hung(*_: object) -> None:
        raise TimeoutError("mcpd status hangs on its stopped child")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(25)
    began = time.monotonic()
    out = None
    try:
        out = status_module.helper_socket(config.from_dict({"helper_socket": str(sock), "service_user": "mcpd"}))
        took = time.monotonic() - began
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        stopped = stopper.communicate(timeout=30)[0].strip()
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        if out is None and stopped:  # (it hung: the child is still ours, unreaped)
            with contextlib.suppress(OSError):
                os.kill(int(stopped), signal.SIGKILL)
                os.waitpid(int(stopped), 0)
    assert stopper.returncode == 0 and stopped, "the service account found no child to stop"
    assert took < status_module.TIMEOUT_SECONDS + status_module.CHILD_GRACE_SECONDS + 2
    assert out["accepts"] is None and out["problem"].startswith("unknown: the check as mcpd did not end"), out
    with pytest.raises(ChildProcessError):  # killed and reaped: no child of ours left
        os.waitpid(int(stopped), os.WNOHANG)


def test_untrusted_files_and_metrics_it_reads_give_unknown_never_a_traceback(tmp_path: Path) -> None:
    """What status reads that another account could write (the front's tls-state.json, the access
    log, the metrics answer) or that was damaged (the audit head): deeply nested JSON, NaN and
    infinite counts, an answer that is no metrics. Each is unknown or a problem, with the reason;
    status exits 1, no traceback."""
    import http.server
    import threading

    answers = [b'mcpd_sessions{transport="mcp"} NaN\nmcpd_workers +Inf\nmcpd_workers_busy -1\n'
               b"mcpd_pool_queued 2.5\nmcpd_helper_up NaN\n"]

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(answers[0])

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deep = b"[" * 200000 + b"]" * 200000
    try:
        front, helper = tmp_path / "front", tmp_path / "helper"
        front.mkdir()
        helper.mkdir(mode=0o700)
        (front / "tls-state.json").write_bytes(deep)
        (helper / "audit.head").write_bytes(deep)
        os.chmod(helper / "audit.head", 0o600)
        (tmp_path / "access.jsonl").write_bytes(b'{"seq": ' + deep + b"}\n")
        config = tmp_path / "mcpd.yaml"
        config.write_text(json.dumps({
            "listen": {"host": "127.0.0.1", "port": free_port()}, "metrics_listen": f"127.0.0.1:{server.server_port}",
            "state_dir": str(front), "helper_state_dir": str(helper), "helper_socket": "",
            "access_log": str(tmp_path / "access.jsonl"), "audit_log": str(tmp_path / "audit.jsonl"),
            "users_file": str(tmp_path / "users.yaml"), "grants_file": str(tmp_path / "grants.yaml")}))

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "status", "--config", str(config), *args],
                                  capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
            return proc

        s = json.loads(run("--json").stdout)
        assert s["metrics"]["answers"] is True and s["metrics"]["sessions"] == {"mcp": None}, s["metrics"]
        assert [s["metrics"][k] for k in ("workers", "workers_busy", "pool_queued", "helper_up")] == [None] * 4
        assert s["tls"]["front"] is None and s["tls"]["front_problem"].endswith("JSON nested too deeply")
        assert "not an audit head" in s["chains"]["audit"]["problem"]
        assert s["chains"]["access"]["seq"] == 0  # a last line that is no record: no seq
        plain = run().stdout
        assert "sessions: mcp unknown" in plain and "workers: unknown live, unknown busy, unknown calls" in plain
        assert "last reload: unknown (" in plain
        answers[0] = b"{" * 100000 + b"\n"  # no exposition format at all
        s = json.loads(run("--json").stdout)
        assert s["metrics"]["answers"] is False and "not Prometheus metrics" in s["metrics"]["problem"]
        assert any("not Prometheus metrics" in p for p in s["problems"]), s["problems"]
    finally:
        server.shutdown()
        server.server_close()

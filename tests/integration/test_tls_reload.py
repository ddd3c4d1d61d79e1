"""The front's certificate and key are reloaded without a restart: on SIGHUP (``systemctl reload
mcpd``) and when the files change. New handshakes get the new certificate; connections and
streams already open go on with theirs; a bad new pair is refused with one log line and the pair
in use stays. Real daemon (root helper, front as the service user), real TLS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import FRONT_ENV, SseSession
from tests.support.privsep_fixture import PrivsepDaemon
from tests.support.streamable import hdrs, open_session
from tests.support.tls import (  # noqa: F401  (d: the daemon fixture)
    SESSIONS,
    WAIT_SECONDS,
    Target,
    assert_read,
    d,
    expired_pair,
    file_fingerprint,
    hup,
    install,
    new_pair,
    peer_of,
    read_call,
    refusals,
    served,
    wait_served,
)

pytestmark = [pytest.mark.root, pytest.mark.anyio]

async def test_a_swapped_certificate_reaches_new_handshakes_and_16_open_sessions_go_on(d: PrivsepDaemon) -> None:
    t = Target(d.url, d.cacert, d.tokens["alice"])
    old = served(d)
    cert, key = new_pair(d)
    new = file_fingerprint(cert)
    assert new != old
    sse: list[SseSession] = []
    mcp: list[tuple[httpx.AsyncClient, str, Any, httpx.Response]] = []
    try:
        for _ in range(SESSIONS // 2):
            s = SseSession(t)  # type: ignore[arg-type]  # duck-typed: url, auth(), ssl_context()
            await s.__aenter__()
            sse.append(s)
            await s.initialize()
            assert peer_of(s.response) == old  # type: ignore[arg-type]
        for _ in range(SESSIONS // 2):
            c = httpx.AsyncClient(verify=t.ssl_context(), timeout=30, base_url=d.url)
            sid = await open_session(c, t)  # type: ignore[arg-type]
            cm = c.stream("GET", "/mcp", headers=hdrs(t, sid, accept="text/event-stream"))  # type: ignore[arg-type]
            g = await cm.__aenter__()
            assert g.status_code == 200 and peer_of(g) == old
            mcp.append((c, sid, cm, g))

        install(d, cert, key)
        hup(d)
        await asyncio.to_thread(wait_served, d, new)
        assert d.front is not None and d.front.poll() is None  # SIGHUP reloads, it does not stop the front

        # Every session goes on: the /sse ones answer on the streams opened before the swap (still
        # carried by the old certificate's connections), the /mcp ones answer their calls and their
        # GET streams, open across the swap, end cleanly only when their session is deleted.
        replies = await asyncio.gather(*(s.request("tools/call", read_call(d, 0)["params"]) for s in sse))
        for s, reply in zip(sse, replies):
            assert_read(reply)
            assert peer_of(s.response) == old  # type: ignore[arg-type]
        for i, (c, sid, _, _) in enumerate(mcp):
            r = await c.post("/mcp", json=read_call(d, 100 + i), headers=hdrs(t, sid))  # type: ignore[arg-type]
            assert r.status_code == 200, r.text
            assert_read(r.json())
        for c, sid, _cm, g in mcp:
            assert not g.is_closed
            r = await c.delete("/mcp", headers=hdrs(t, sid))  # type: ignore[arg-type]
            assert r.status_code == 200
            await asyncio.wait_for(g.aread(), WAIT_SECONDS)  # the stream ends normally, no reset
        assert served(d) == new
    finally:
        for s in sse:
            await s.close()
        for c, _, cm, _ in mcp:
            await cm.__aexit__(None, None, None)
            await c.aclose()
    assert not refusals(d)


def test_a_changed_pair_is_picked_up_without_a_signal(d: PrivsepDaemon) -> None:
    cert, key = new_pair(d)
    install(d, cert, key)
    wait_served(d, file_fingerprint(cert))
    assert served(d, tls12=True) == file_fingerprint(cert)  # TLS 1.2 handshakes get it too


BAD_PAIRS = {
    # kind of bad pair: the words its log line must hold
    "key of another certificate": "is not the key of the certificate",
    "key the front may not read": "cannot open the key",
    "key every account may read": "readable by every account",
    "expired certificate": "expired at",
    "not a certificate": "holds no PEM certificate",
    "not a key": "holds no usable PEM private key",
}


@pytest.mark.parametrize("kind", list(BAD_PAIRS))
def test_a_bad_new_pair_is_refused_with_one_log_line_and_the_old_one_stays(d: PrivsepDaemon, kind: str) -> None:
    good_cert, good_key = new_pair(d)
    install(d, good_cert, good_key)
    hup(d)
    wait_served(d, file_fingerprint(good_cert))
    before = len(refusals(d))
    cert, key = new_pair(d)
    mode, group = 0o640, None
    if kind == "key of another certificate":
        key = new_pair(d)[1]
    elif kind == "key the front may not read":
        mode, group = 0o600, 0
    elif kind == "key every account may read":
        mode = 0o644
    elif kind == "expired certificate":
        cert, key = expired_pair(d)
    elif kind == "not a certificate":
        cert = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    elif kind == "not a key":
        key = b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    install(d, cert, key, key_mode=mode, key_group=group)
    hup(d)
    deadline = time.monotonic() + WAIT_SECONDS
    while len(refusals(d)) == before:
        assert d.front is not None and d.front.poll() is None, d.log("front.log")
        assert time.monotonic() < deadline, "no refusal logged"
        time.sleep(0.05)
    new_lines = refusals(d)[before:]
    assert len(new_lines) == 1, new_lines
    assert BAD_PAIRS[kind] in new_lines[0], new_lines[0]
    assert file_fingerprint(good_cert) in new_lines[0]  # it names the certificate kept
    assert served(d) == file_fingerprint(good_cert)
    log = d.log("front.log")
    for k in (key, good_key):  # no key material in the log
        body = b"".join(k.splitlines()[1:-1]).decode()
        assert body[:40] not in log.replace("\n", "")
    # the next good pair is taken again
    cert, key = new_pair(d)
    install(d, cert, key)
    hup(d)
    wait_served(d, file_fingerprint(cert))


def test_systemctl_reload_sends_the_front_sighup() -> None:
    unit = (Path(__file__).resolve().parents[2] / "systemd" / "mcpd.service").read_text().splitlines()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit


def test_a_bad_pair_at_start_is_exit_78_with_the_reason(d: PrivsepDaemon, tmp_path: Path) -> None:
    cert, key = expired_pair(d)
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    os.chmod(tmp_path / "k.pem", 0o600)
    conf = tmp_path / "mcpd.yaml"
    conf.write_text(yaml.safe_dump({"listen": {"host": "127.0.0.1", "port": 1}, "helper_socket": "",
                                    "tls": {"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")},
                                    "users_file": "users.yaml", "state_dir": "."}))
    proc = subprocess.run([sys.executable, "-m", "mcpd.front.server", "--config", str(conf)], env=FRONT_ENV,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 78, proc.stderr
    assert "tls: cannot load certificate/key: the certificate" in proc.stderr and "expired at" in proc.stderr

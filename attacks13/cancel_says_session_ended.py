"""Flaw: a /mcp request cancelled by notifications/cancelled gets its POST answered 404 "session ended"
although the session lives on (SPEC §1.3/§1.6: 404 means an unknown or ended session; SDKs treat it
as "session terminated"). Start a daemon: python attacks13/_daemon.py /tmp/a13d1; then run this."""
import sys, threading, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from _probe import client, rpc, session, h

slow = Path("/tmp/a13-sparse.log")
with open(slow, "wb") as f:
    f.write(b"a\n" + b"b" * 9000)
    f.truncate(1 << 40)
with client() as c:
    sid = session(c)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", rpc(client(), sid, "tools/call", {
        "name": "files/read", "arguments": {"path": str(slow), "start_line": 3}}, id="slow")))
    t.start()
    time.sleep(1)
    c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}},
           headers=h(sid))
    t.join(30)
    r = out["r"]
    print("cancelled request's POST:", r.status_code, r.text)
    print("the same session afterwards:", rpc(c, sid, "ping").status_code)
    print("FLAW" if r.status_code == 404 else "held")

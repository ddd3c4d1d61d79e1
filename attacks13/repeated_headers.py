"""Flaw: repeated one-value headers on /mcp are served by their first copy. Session era: two
Mcp-Session-Id (or MCP-Protocol-Version) headers; stateless era: Mcp-Name/Mcp-Method sent twice, the
first matching the body, the second naming something else, which a gateway reading the last copy
would authorize (SPEC §1.6). Start a daemon: python attacks13/_daemon.py /tmp/a13d1; then run this."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from _probe import C, client, session

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
auth = [("Authorization", f"Bearer {C['token']}"), ("Accept", "application/json"), ("Content-Type", "application/json")]
flaws = 0
with client() as c:
    a, b = session(c), session(c)
    r = c.post("/mcp", content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
               headers=[*auth, ("Mcp-Session-Id", a), ("Mcp-Session-Id", b)])
    print("two Mcp-Session-Id:", r.status_code); flaws += r.status_code != 400
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                       "params": {"uri": "file:///etc/hostname", "_meta": META}}).encode()
    for name, other in (("Mcp-Name", "file:///etc/motd"), ("Mcp-Method", "tools/list")):
        hh = [*auth, ("MCP-Protocol-Version", V), ("Mcp-Method", "resources/read"), ("Mcp-Name", "file:///etc/hostname"),
              (name, other)]
        r = c.post("/mcp", content=body, headers=hh)
        print(f"{name} twice:", r.status_code, r.text[:80]); flaws += r.status_code != 400
print("FLAW" if flaws else "held")

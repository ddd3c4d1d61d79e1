"""Flaw: a 2026-07-28 request with id null is answered 200 with -32600; the session era answers the
same error 400 (SPEC §2.3, §1.6). Start a daemon: python attacks13/_daemon.py /tmp/a13d1; then run this."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from _probe import client, h

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
with client() as c:
    r = c.post("/mcp", json={"jsonrpc": "2.0", "id": None, "method": "tools/list", "params": {"_meta": META}},
               headers=h(**{"MCP-Protocol-Version": V, "Mcp-Method": "tools/list"}))
    print(r.status_code, r.text)
    print("FLAW" if r.status_code == 200 else "held")

"""The front's sessions, one table for both transports (``GET /sse`` and ``/mcp``): the table
(``table.py``), a session and its outgoing queue (``session.py``), its backpressure
(``backpressure.py``) and the outgoing-byte budgets by principal and in all (``budgets.py``).
The HTTP endpoints that open and use them are ``mcpd.front.transport``."""

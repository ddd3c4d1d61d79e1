"""The front's MCP layer: the JSON-RPC envelope (:mod:`.jsonrpc`), the MCP revisions served
(:mod:`.versions`), what the methods reach (:mod:`.dispatcher`) and one session's state
(:mod:`.session`). The transports (``mcpd.front.transport``) feed it parsed bodies."""

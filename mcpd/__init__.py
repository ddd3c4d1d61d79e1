"""mcpd: a Linux daemon serving a server's files to MCP agents over TLS (see SPEC.md)."""

__version__ = "0.1.0"

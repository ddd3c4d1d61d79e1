"""mcpd: a Linux daemon serving a server's files to MCP agents over TLS (behaviour: docs/REFERENCE.md).

The version comes from the package metadata: :func:`mcpd.common.version.version`. This package
file holds no code, so every process (the root helper included) loads nothing by importing it.
"""

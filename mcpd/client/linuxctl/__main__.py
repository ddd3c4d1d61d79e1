"""``python -m mcpd.client.linuxctl``: the ``linuxctl`` command."""

from mcpd.client.linuxctl import main

main()

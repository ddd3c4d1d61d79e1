"""The front's client of the policy process (``mcpd-policy``, docs/PRIVSEP.md), which alone reads
tokens and decides grants: the connections to it (:mod:`.channel`), token checks
(:mod:`.authenticator`), workers it has root start (:mod:`.spawner`) and privileged calls
(:mod:`.backend`). The front never decides anything privileged; it asks, always with the
caller's token."""

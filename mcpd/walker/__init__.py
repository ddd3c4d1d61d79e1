"""The walker of privileged ``files/list`` and ``files/find`` (docs/PRIVSEP.md): a process of its own,
not root, holding CAP_DAC_READ_SEARCH only. The root helper never imports this package."""

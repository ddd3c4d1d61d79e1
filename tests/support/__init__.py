"""Code the tests share: real OS accounts, the privilege-separated daemon, fuzz generators,
node clients, namespaces and file systems. No test module imports another; what two of them
need lives here."""

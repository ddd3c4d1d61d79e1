"""The wire layer: the small, frozen code every mcpd process shares with root.

Root loads it, so it lives in root's package and counts in root's line budget; every other
process imports it from here. It holds the frame format, the error codes, path cleaning, the
strict YAML loader, the opener's rules and the accounts and settings root starts with. Nothing
here imports anything of mcpd outside this package.
"""

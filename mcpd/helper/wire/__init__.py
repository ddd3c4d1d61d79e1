"""The wire layer: the small, frozen code every mcpd process shares with root.

Root loads it, so it lives in root's package and counts in root's line budget; every other
process imports it from here. It holds what root runs of the frame format, the error codes, path
cleaning, the checked reading of configuration files, the opener and its rules, and the accounts
and settings root starts with (what only the others use is in :mod:`mcpd.common`). Nothing here
imports anything of mcpd outside this package.
"""

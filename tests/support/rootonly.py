"""What a root-only test needs besides root: a tool, a kernel feature, a service.

A run as root (CI's) must run every root-only test, so a missing prerequisite there is a
failure with its reason; not root, the test skips. ``tests/conftest.py`` applies the same rule
to the skips of tests marked ``root``; this helper states it where the check is made, so it
holds for a fixture or test that is not marked too."""

from __future__ import annotations

import os

import pytest


def needs_root(reason: str) -> None:
    """Skip the calling test or fixture unless the run is root's; ``reason`` says what root is
    for (e.g. ``"creates OS accounts"``)."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {reason}")


def root_prerequisite(present: bool, reason: str) -> None:
    """A root-only test's prerequisite ``present`` or not; ``reason`` says what is missing and how
    to get it. Missing: as root, the test fails with ``reason``; not root, it skips."""
    if present:
        return
    if os.geteuid() == 0:
        pytest.fail(f"{reason} (a root-only test must run as root)", pytrace=False)
    pytest.skip(reason)

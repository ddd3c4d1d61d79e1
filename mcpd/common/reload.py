"""One holder for every file re-read on change (grants, users, ...): keep the last good value.

``Reloading(path, load)`` calls ``load(path)`` at once and again whenever :func:`filesig.signature`
(device, inode, size, mtime) changes. A failing ``load`` keeps the last good value and leaves its
errors in :attr:`Reloading.last_errors` (``exc.errors`` when the exception has it, else ``str``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from mcpd.common.filesig import Signature, signature

T = TypeVar("T")
log = logging.getLogger(__name__)


def _sig(path: str) -> Signature | None:
    try:
        return signature(path)
    except OSError:
        return None


class Reloading(Generic[T]):
    """The last good ``load(path)``; thread-safe (reloads are serialised, reads never block).

    Args:
        path: the file.
        load: parses the file, raising any ``Exception`` when it is unusable.
        empty: the value while nothing ever loaded; without it a failing first load raises
            ``load``'s exception from the constructor.
        fail_closed: on a failed load use ``empty`` instead of keeping the last good value
            (for files where a broken edit must not leave revoked entries alive).
    """

    def __init__(self, path: str, load: Callable[[str], T], empty: T | None = None, fail_closed: bool = False) -> None:
        self.path, self._load, self._empty, self._fail_closed = path, load, empty, fail_closed
        self._lock = threading.Lock()
        self._sig = _sig(path)
        self.last_errors: list[str] = []
        if empty is None:
            self.current: T = load(path)
        else:
            self.current = empty
            self.refresh(force=True)

    def refresh(self, force: bool = False) -> bool:
        """Re-read the file if its signature changed (always when ``force``).

        Returns:
            True when the file was read again, loaded or not: then :attr:`last_errors` is empty
            when :attr:`current` is the new value, else it lists why the read failed.
        """
        with self._lock:
            sig = _sig(self.path)
            if not force and sig == self._sig:
                return False
            self._sig = sig
            try:
                value = self._load(self.path)
            except Exception as exc:  # noqa: BLE001 - any failure keeps the last good value
                errors = getattr(exc, "errors", None)
                self.last_errors = [str(e) for e in errors] if isinstance(errors, list) else [str(exc)]
                log.error("%s not loaded (%s): %s", self.path, "nothing in force" if self._fail_closed and
                          self._empty is not None else "the last good version stays", "; ".join(self.last_errors))
                if self._fail_closed and self._empty is not None:
                    self.current = self._empty
                return True
            self.current, self.last_errors = value, []
            return True

"""libmagic with the system's database only.

libmagic's default database path puts ``$MAGIC``, then ``$HOME/.magic.mgc`` and ``$HOME/.magic``
before the system's; a worker runs as the caller's account, so a magic file planted there would
judge (and, printed in a description, return) the bytes of a sample it may not read. Every
classifier here loads the database libmagic was built with (``magic_getpath`` for checking,
which never looks at ``HOME``) or, when ``MAGIC`` is set, the usual system paths; never a path
from the environment.
"""

from __future__ import annotations

import ctypes
import functools
import os

import magic

#: where distributions keep the database, for a process whose environment names another
SYSTEM_DATABASES = ("/etc/magic", "/usr/share/misc/magic", "/usr/share/file/magic", "/usr/share/file/misc/magic")
_FILE_CHECK = 1  # libmagic's action for magic_getpath: the built-in path, no $HOME lookup


@functools.cache
def database() -> str:
    """The system's magic database as libmagic's ``magic_load`` takes it (paths joined by ``:``;
    libmagic adds ``.mgc`` to each): the path libmagic was built with, unless ``MAGIC`` is set,
    then the :data:`SYSTEM_DATABASES` that exist. Raises ``OSError`` when there is none."""
    if "MAGIC" not in os.environ:
        getpath = magic.libmagic.magic_getpath
        getpath.restype, getpath.argtypes = ctypes.c_char_p, [ctypes.c_char_p, ctypes.c_int]
        built = getpath(None, _FILE_CHECK)
        if built:
            return os.fsdecode(built)
    found = [p for p in SYSTEM_DATABASES if os.path.exists(p) or os.path.exists(p + ".mgc")]
    if not found:
        raise OSError("no system magic database")
    return ":".join(found)


@functools.cache
def classifier(kind: str) -> magic.Magic:
    """One shared :class:`magic.Magic` per ``kind`` (``"description"``, ``"mime"`` or
    ``"encoding"``) on :func:`database`. Raises ``ValueError`` for another kind."""
    if kind not in ("description", "mime", "encoding"):
        raise ValueError(kind)
    return magic.Magic(mime=kind == "mime", mime_encoding=kind == "encoding", magic_file=database())

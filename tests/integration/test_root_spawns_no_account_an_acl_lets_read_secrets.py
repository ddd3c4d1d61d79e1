"""Root's spawn guard "no worker for an account that can reach the daemon's secrets" holds
through POSIX ACLs: an ACL entry naming a group (``setfacl -m g:G:r``, the usual way to let a
second group read a certbot key without changing its owner) leaves the mode's group bits showing
the ACL mask and ``st_gid`` the owner's, so root reads the ACL's named users and groups too.
"""

from __future__ import annotations

import os
import struct

import pytest

from tests.support.secrets_layout import _through_worker, layout  # noqa: F401

pytestmark = pytest.mark.root

_ACL = "system.posix_acl_access"
_UNDEF = 0xFFFFFFFF
_USER_OBJ, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x04, 0x08, 0x10, 0x20


def _acl(owner: int, group_obj: int, other: int, named_gid: int, named: int) -> bytes:
    """The xattr form of ``u::owner,g::group_obj,g:named_gid:named,m::named|group_obj,o::other``."""
    entries = [(_USER_OBJ, owner, _UNDEF), (_GROUP_OBJ, group_obj, _UNDEF), (_GROUP, named, named_gid),
               (_MASK, named | group_obj, _UNDEF), (_OTHER, other, _UNDEF)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def test_no_worker_for_a_group_an_acl_on_a_secret_lets_read(layout) -> None:  # noqa: F811
    """Rule (docs/PRIVSEP.md section 3, root's ``spawn``): root refuses an account
    "in a group a secret on root's list (or its folder) grants access to at that moment". Attack:
    the CA key stays ``root:root 0600`` by its owner and group, but an ACL gives the key reader's
    group read on it and search on its folder; root is asked for a worker as the key reader."""
    d, _, reader = layout
    ca_key, tls = d.state_dir / "tls" / "ca.key", d.state_dir / "tls"
    st_key, st_tls = os.stat(ca_key), os.stat(tls)
    try:
        os.chown(ca_key, 0, 0)
        os.setxattr(ca_key, _ACL, _acl(6, 0, 0, reader.gid, 4))       # u::rw- g::--- g:reader:r-- o::---
        os.setxattr(tls, _ACL, _acl(7, 5, 0, reader.gid, 5))          # u::rwx g::r-x g:reader:r-x o::---
        got = _through_worker(d, reader.name, [str(ca_key)])
    finally:
        for p in (ca_key, tls):
            try:
                os.removexattr(p, _ACL)
            except OSError:
                pass
        os.chown(ca_key, st_key.st_uid, st_key.st_gid)
        os.chmod(ca_key, st_key.st_mode & 0o7777)
        os.chmod(tls, st_tls.st_mode & 0o7777)
    assert got is None, f"root spawned a worker for a group an ACL on the CA key lets read, which read: {got}"

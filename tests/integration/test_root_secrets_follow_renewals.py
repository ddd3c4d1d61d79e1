"""Root judges the daemon's secrets as they are at each open: a renewed TLS key stays secret.

The usual ACME layout (certbot): ``tls.key`` is ``/etc/letsencrypt/live/HOST/privkey.pem``, a
symlink to ``../../archive/HOST/privkeyN.pem``; a renewal writes ``privkeyN+1.pem`` beside it and
moves the symlink. Root's list of secrets and the policy's fixed deny were strings fixed when each
process started (each path and its ``realpath`` then), and root found the secrets' places again
only when the mount table changed: after a renewal the front's *new* key was on neither list, root
opened it for code as ``mcpd-policy``, and a principal granted ``/`` read it through the front.

Now root resolves its secrets at every open (symlinks followed as they are then), and when
``tls.key`` is a symlink, the whole folder of the file it leads to is secret: the earlier keys
there, and the next one certbot writes before it moves the link. The root helper runs in a mount
namespace of its own (private propagation), so no other session's mount makes the old code find
the places again in the middle of the test.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import privsep_fixture, rootns
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.root_channels import Channel, as_policy
from tests.support.root_objects import call, refused

pytestmark = pytest.mark.root
SECRET = "the daemon's own secrets are never served"


@pytest.fixture(scope="module")
def acme() -> Iterator[tuple[PrivsepDaemon, Path]]:
    """The fixture daemon with ``tls.key`` a certbot-style symlink ``live/h/privkey.pem`` ->
    ``../../archive/h/privkey1.pem`` (``0640 root:mcpd``, folders the front may enter), alice
    granted ``/``; yields the daemon and the letsencrypt-like folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    factory = AccountFactory()
    d = None
    le = None
    try:
        d = start_privsep(factory, helper_wrap=rootns.own_mount_namespace())
        le = Path(str(d.srv) + "-le")
        archive, live = le / "archive" / "h", le / "live" / "h"
        archive.mkdir(parents=True)
        live.mkdir(parents=True)
        for folder in (le, le / "archive", archive, le / "live", live):
            os.chmod(folder, 0o750)
            os.chown(folder, 0, d.service.pw_gid)
        key = archive / "privkey1.pem"
        shutil.copyfile(d.state_dir / "tls" / "server.key", key)
        os.chown(key, 0, d.service.pw_gid)
        os.chmod(key, 0o640)
        (live / "privkey.pem").symlink_to("../../archive/h/privkey1.pem")
        cfg = yaml.safe_load(d.config_path.read_text())
        cfg["tls"]["key"] = str(live / "privkey.pem")
        d.config_path.write_text(yaml.safe_dump(cfg))
        privsep_fixture._stop(d.front)
        d.restart_helper()
        d.start_front()  # the front loads the key through the symlink
        rule = {"allowed": True, "paths": ["/"]}
        d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {
            "files/read": dict(rule), "files/list": dict(rule)}}}}})
        deadline = time.monotonic() + 20
        while call(d, "files/read", path=str(d.secret)).get("text") is None:
            assert time.monotonic() < deadline, "the grants did not reload"
            time.sleep(0.2)
        yield d, le
    finally:
        if d is not None:
            stop_privsep(d)
        if le is not None:
            shutil.rmtree(le, ignore_errors=True)
        factory.cleanup()


def _key(path: Path, text: str, gid: int) -> Path:
    path.write_text(f"-----BEGIN PRIVATE KEY-----\n{text}\n-----END PRIVATE KEY-----\n")
    os.chown(path, 0, gid)
    os.chmod(path, 0o640)
    return path


def _point(link: Path, target: str) -> None:
    """What ``certbot renew`` does to the link: a new symlink renamed over the old one."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target)
    os.replace(new, link)


def _served_by_root(root: Channel, path: Path, follow: bool = False) -> str | None:
    """What root opens for code as ``mcpd-policy``: the file's first bytes, or None when refused."""
    reply, fds = root.ask("open", path=str(path), follow=follow, want="file")
    try:
        return os.read(fds[0], 100).decode() if reply["ok"] else None
    finally:
        for fd in fds:
            os.close(fd)


def test_the_renewed_tls_key_stays_a_secret(acme: tuple[PrivsepDaemon, Path]) -> None:
    """Before the renewal the key is refused both ways; after it the new key (the one the symlink
    names now) is refused too, to code as ``mcpd-policy`` asking root (directly and through the
    followed symlink) and to a principal granted ``/``; so is the old one."""
    d, le = acme
    archive, link = le / "archive" / "h", le / "live" / "h" / "privkey.pem"
    assert refused(call(d, "files/read", path=str(archive / "privkey1.pem")))
    new = _key(archive / "privkey2.pem", "the renewed key", d.service.pw_gid)
    _point(link, "../../archive/h/privkey2.pem")
    with as_policy(d) as root:
        got = {"new key by root": _served_by_root(root, new), "link followed by root": _served_by_root(root, link, True),
               "old key by root": _served_by_root(root, archive / "privkey1.pem")}
    got["new key through the front"] = call(d, "files/read", path=str(new)).get("text")
    assert got == dict.fromkeys(got), f"after a renewal a key is served: {got}"


def test_the_archive_folder_of_a_symlinked_key_is_secret_whole(acme: tuple[PrivsepDaemon, Path]) -> None:
    """The next key, written before the symlink moves to it, and the earlier ones are refused by
    root and through the front, and a privileged listing of the archive folder is refused; a
    certificate beside the link (``live/h``) is no secret and is served."""
    d, le = acme
    archive = le / "archive" / "h"
    future = _key(archive / "privkey9.pem", "the next key", d.service.pw_gid)
    cert = le / "live" / "h" / "cert.pem"
    cert.write_text("a public certificate\n")
    with as_policy(d) as root:
        assert _served_by_root(root, future) is None, "the next key, before the link moves to it"
        assert _served_by_root(root, cert) == "a public certificate\n"
    assert refused(call(d, "files/read", path=str(future)))
    assert refused(call(d, "files/list", path=str(archive)), SECRET)


def test_a_key_moved_to_another_folder_is_secret_at_once(acme: tuple[PrivsepDaemon, Path]) -> None:
    """The symlink moved to a key in a folder that was no secret a moment before: root refuses
    the key (and that folder) from the move on, and serves the folder before it."""
    d, le = acme
    other = le / "other"
    other.mkdir(mode=0o750, exist_ok=True)
    os.chown(other, 0, d.service.pw_gid)
    key = _key(other / "key.pem", "a key elsewhere", d.service.pw_gid)
    link = le / "live" / "h" / "privkey.pem"
    before = os.readlink(link)
    with as_policy(d) as root:
        assert _served_by_root(root, key) is not None  # no secret yet: what a grant covers
        _point(link, "../../other/key.pem")
        try:
            assert _served_by_root(root, key) is None, "the key the symlink names now"
        finally:
            _point(link, before)

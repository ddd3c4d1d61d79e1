"""``mcpd jwks fetch``: download each OAuth issuer's JWK Set into the file the policy process trusts.

The one job of mcpd with network access to an identity provider, run unprivileged (by
``mcpd-jwks.timer``, as the account ``mcpd-jwks``). For each issuer of the ``oauth`` block with a
``jwks_uri``: an HTTPS GET with a verifying TLS context (the system's CAs, or ``--cafile``), a
timeout and a size cap (:data:`mcpd.common.jwkset.MAX_JWKS_BYTES`), redirects only to https; the
answer must be a JWK Set of public keys (:func:`mcpd.common.jwkset.parse_jwk_set`). Its canonical
form replaces ``jwks_file`` atomically (a new file in the same folder, fsync, rename; mode 0644) in
a folder no other account can change; an unchanged set is not written; a symlink, or anything but
a regular file, at ``jwks_file`` is refused. On any failure the old file stays as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click

from mcpd.common.folders import safe_folder, write_file
from mcpd.common.jwkset import MAX_JWKS_BYTES, JWKSetError, canonical, parse_jwk_set
from mcpd.common.oauthconfig import JWKS_USER
from mcpd.common.printable import printable

EXIT_FAILED = 1  # at least one issuer's set could not be fetched or written (its old file kept)
EXIT_USAGE = 2  # no such issuer, or none with a jwks_uri
EXIT_CONFIG = 78  # mcpd.yaml unreadable or invalid


@dataclass(frozen=True)
class Source:
    """One issuer's JWK Set: its ``name``, where to fetch it and the file to write."""

    name: str
    jwks_uri: str
    jwks_file: str


class FetchError(Exception):
    """This issuer's set was not written; the message says why (the old file is kept)."""


def sources(config_path: str) -> list[Source]:
    """The issuers of ``config_path``'s ``oauth`` block, as :class:`Source`\\ s (``jwks_uri`` may be ``""``).

    Raises:
        mcpd.common.config.ConfigError: the configuration is unreadable or invalid.
    """
    from mcpd.common.config import load

    return [Source(i.name, i.jwks_uri, i.jwks_file) for i in load(config_path).oauth.issuers]


class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not newurl.lower().startswith("https://"):
            raise FetchError(f"redirected to a URL that is not https ({printable(newurl[:200])})")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`TimeoutError` in the block once ``seconds`` have passed (a SIGALRM timer: the
    whole download, connecting, TLS, headers and body, not each socket read; only in the main
    thread, where the command runs: elsewhere the block runs under its reads' timeouts alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no complete answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def download(url: str, cafile: str | None, timeout: float) -> bytes:
    """GET ``url`` over verified TLS; its body (at most :data:`MAX_JWKS_BYTES` bytes), all of it
    within ``timeout`` seconds (one deadline, however slowly the server sends).

    Raises:
        FetchError: not https, TLS not trusted, unreachable, not 200, too large, or too slow.
    """
    if not url.lower().startswith("https://"):
        raise FetchError("jwks_uri must be an https:// URL")
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise FetchError(f"cannot load the CA file {cafile}: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), _HttpsOnlyRedirects())
    request = urllib.request.Request(url, headers={"Accept": "application/jwk-set+json, application/json",
                                                   "User-Agent": "mcpd-jwks-fetch"})
    end = time.monotonic() + timeout
    try:
        with _deadline(timeout), opener.open(request, timeout=timeout) as resp:
            if resp.status != 200:
                raise FetchError(f"answered HTTP {resp.status}")
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > MAX_JWKS_BYTES:
                raise FetchError(f"larger than {MAX_JWKS_BYTES} bytes")
            body = b""
            while len(body) <= MAX_JWKS_BYTES:  # in chunks, against the one deadline
                if time.monotonic() > end:
                    raise TimeoutError(f"no complete answer within {timeout:g} s")
                chunk = resp.read1(65536)
                if not chunk:
                    break
                body += chunk
    except urllib.error.HTTPError as exc:
        raise FetchError(f"answered HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise FetchError(f"TLS certificate not trusted: {reason.verify_message}") from None
        raise FetchError(f"cannot reach it: {reason}") from None
    except (OSError, ssl.SSLError) as exc:  # timeouts, resets, TLS failures after connecting
        raise FetchError(f"cannot reach it: {type(exc).__name__}: {exc}") from None
    if len(body) > MAX_JWKS_BYTES:
        raise FetchError(f"larger than {MAX_JWKS_BYTES} bytes")
    return body


def _current(dirfd: int, name: str) -> bytes | None:
    """What ``name`` in ``dirfd`` holds now (None: no file yet).

    Raises:
        FetchError: a symlink or not a regular file at the destination.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FetchError(f"refusing to replace {name}: {'a symlink' if exc.errno == errno.ELOOP else exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000):
            raise FetchError(f"refusing to replace {name}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_JWKS_BYTES * 2 + 1)
    finally:
        os.close(fd)


def store(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (mode 0644) unless it holds exactly that; True when written.

    The folder must be this process's own (made 0700 when missing), or for root also the
    service account's (:data:`JWKS_USER`, whose the new file then is), in folders only root can
    change, and not writable by group or others.

    Raises:
        FetchError: an unsafe folder, a symlink or non-regular file at ``path``, or the write failed.
    """
    folder, name = os.path.split(os.path.abspath(path))
    owners = [os.geteuid()]
    if os.geteuid() == 0:  # root run by hand writes the service account's folder (the file becomes its own)
        with contextlib.suppress(KeyError):
            owners.append(pwd.getpwnam(JWKS_USER).pw_uid)
    for owner in owners:
        try:
            dirfd = safe_folder(folder, owner=owner, leaf_mask=0o022, create=owner == owners[0])
            break
        except OSError as exc:
            problem = exc
    else:
        raise FetchError(f"unsafe or missing folder {folder}: {problem.strerror or problem}") from None
    try:
        if _current(dirfd, name) == data:
            return False
        try:
            write_file(dirfd, name, data, mode=0o644)
        except OSError as exc:
            raise FetchError(f"cannot write {path}: {exc.strerror}") from None
        return True
    finally:
        os.close(dirfd)


def fetch_one(src: Source, cafile: str | None, timeout: float) -> tuple[bool, int]:
    """Fetch, check and store ``src``'s set; ``(written, number of keys)``.

    Raises:
        FetchError: any step failed (nothing written).
    """
    body = download(src.jwks_uri, cafile, timeout)
    try:
        keys = parse_jwk_set(body)
    except JWKSetError as exc:
        raise FetchError(f"not a usable JWK Set: {exc}") from None
    return store(src.jwks_file, canonical(keys)), len(keys)


@click.group("jwks")
def jwks() -> None:
    """The OAuth issuers' public keys (JWK Sets) the policy process verifies access tokens with."""


@jwks.command("fetch")
@click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="The daemon configuration (mcpd.yaml) naming the issuers")
@click.option("--issuer", "names", multiple=True, help="Only this issuer (its name in oauth.issuers; repeat)")
@click.option("--cafile", default=None, type=click.Path(dir_okay=False),
              help="Trust this CA (PEM) for the issuers' HTTPS instead of the system's CAs")
@click.option("--timeout", default=15.0, show_default=True, type=click.FloatRange(0.1, 300),
              help="Seconds allowed for each issuer's whole download")
def fetch_cmd(config_path: str, names: tuple[str, ...], cafile: str | None, timeout: float) -> None:
    """Download each issuer's jwks_uri into its jwks_file when the set changed (atomically, 0644).

    The answer must be a JWK Set of public RSA, EC or OKP keys (a private member or a symmetric
    key refuses it); on any failure the old file stays. Exit 0 when every set is current, 1 when
    one failed (the others are still written), 2 for an unknown --issuer or no issuer with a
    jwks_uri, 78 for a broken configuration."""
    from mcpd.common.config import ConfigError

    try:
        found = sources(config_path)
    except ConfigError as exc:
        click.echo(f"mcpd jwks fetch: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    unknown = [n for n in names if n not in {s.name for s in found}]
    if unknown:
        click.echo(printable(f"mcpd jwks fetch: no issuer {', '.join(unknown)} in {config_path} (oauth.issuers)"),
                   err=True)
        sys.exit(EXIT_USAGE)
    chosen = [s for s in found if s.jwks_uri and (not names or s.name in names)]
    if not chosen:
        click.echo(f"mcpd jwks fetch: no issuer with a jwks_uri in {config_path} (their jwks_file is "
                   "written by other means)", err=True)
        sys.exit(EXIT_USAGE)
    failed = False
    for src in chosen:
        try:
            written, count = fetch_one(src, cafile, timeout)
        except FetchError as exc:
            failed = True
            click.echo(printable(f"{src.name}: kept {src.jwks_file} as it was: {src.jwks_uri}: {exc}"), err=True)
            continue
        click.echo(printable(f"{src.name}: {'wrote' if written else 'unchanged'} {src.jwks_file} ({count} keys)"))
    sys.exit(EXIT_FAILED if failed else 0)

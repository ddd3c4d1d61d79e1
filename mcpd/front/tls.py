"""The listener's TLS certificate and key, reloaded without a restart (docs/REFERENCE.md §1.1).

:class:`LiveCertificate` owns the context the listener was created with and the pair in use.
A reload (:meth:`LiveCertificate.reload`: on ``SIGHUP``, or when :meth:`LiveCertificate.watch`
sees either file change) reads both files once each, checks them (:func:`read_pair`) and builds
a whole new context from those very bytes; only when all of that succeeded does it become the one
new handshakes use. The listener's context stays the same object: its SNI callback, run at every
ClientHello (with or without a server name), moves the new connection onto the current context
(``SSLObject.context``), so new handshakes present the new certificate while connections already
open keep theirs and go on. A pair that fails any check is refused with one log line naming the
reason (never key material) and the pair in use stays.

The pair's facts (fingerprint, subject, validity, last check) are written to
``<state_dir>/tls-state.json`` for ``mcpd status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import os
import ssl
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from mcpd.common.filesig import Signature, signature

log = logging.getLogger("mcpd.front.tls")

#: TLS 1.2 suites offered (OpenSSL names): ECDHE key exchange with AES-GCM or ChaCha20-Poly1305 only.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!SHA1:!SHA256:!SHA384:!CBC"

#: the largest certificate chain or key file read, in bytes
MAX_PEM_BYTES = 1 << 20
#: how often :meth:`LiveCertificate.watch` looks at the two files' signatures, in seconds
WATCH_SECONDS = 1.0
#: how far ahead of this host's clock a certificate's start of validity may be, in seconds
CLOCK_SKEW_SECONDS = 300
#: the file in the front's state folder that ``mcpd status`` reads
STATE_FILE = "tls-state.json"


class PairError(ValueError):
    """A certificate/key pair that cannot be used; ``str()`` is the reason, without key material."""


@dataclass(frozen=True)
class Pair:
    """A checked certificate chain and key (PEM bytes) and the facts ``mcpd status`` shows."""

    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    fingerprint: str  # SHA-256 of the leaf certificate's DER, hex pairs joined by ":"
    subject: str  # RFC 4514
    not_before: datetime.datetime
    not_after: datetime.datetime


def fingerprint(der: bytes) -> str:
    """The SHA-256 fingerprint of a DER certificate as upper-case hex pairs joined by ``:``
    (what ``openssl x509 -fingerprint -sha256`` prints after ``=``)."""
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def _read_once(path: str, what: str, secret: bool, owners: frozenset[int] = frozenset()) -> bytes:
    """The bytes of ``path``, read from one descriptor after checking what it is: a regular file of
    at most :data:`MAX_PEM_BYTES`, not writable by other accounts (its group nor every account),
    and (``secret``) not readable by every account and owned by one of ``owners``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise PairError(f"cannot open the {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PairError(f"the {what} {path} is not a regular file")
        if st.st_size > MAX_PEM_BYTES:
            raise PairError(f"the {what} {path} is larger than {MAX_PEM_BYTES} bytes")
        if st.st_mode & stat.S_IWOTH:
            raise PairError(f"the {what} {path} is writable by every account")
        if st.st_mode & stat.S_IWGRP:
            raise PairError(f"the {what} {path} is writable by its group (make it {'0640' if secret else '0644'} "
                            "root:mcpd)")
        if secret and st.st_mode & stat.S_IROTH:
            raise PairError(f"the {what} {path} is readable by every account (make it 0640 root:mcpd or 0600)")
        if secret and st.st_uid not in owners:
            raise PairError(f"the {what} {path} is owned by uid {st.st_uid}, neither root nor the account that "
                            "reads it (make it 0640 root:mcpd)")
        data = b""
        while len(data) <= MAX_PEM_BYTES:
            chunk = os.read(fd, MAX_PEM_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > MAX_PEM_BYTES:
            raise PairError(f"the {what} {path} is larger than {MAX_PEM_BYTES} bytes")
        return data
    except OSError as exc:
        raise PairError(f"cannot read the {what} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_pair(cert_path: str, key_path: str, now: datetime.datetime | None = None,
              owners: Iterable[int] = ()) -> Pair:
    """Read and check the certificate chain (PEM, leaf first) and its private key (PEM, not
    encrypted).

    The rule: each file opened once, a regular file, not writable by other accounts (group or
    every account), the key not readable by every account and owned by root, this process's
    account or one of ``owners`` (the service account, for a check run as root); both parse; the key is the leaf certificate's; the leaf is valid now (its
    start at most :data:`CLOCK_SKEW_SECONDS` ahead of ``now``, default this host's clock, and its
    end not passed).

    Raises:
        PairError: the first check that failed (no key material in the message).
    """
    cert_pem = _read_once(cert_path, "certificate", secret=False)
    key_pem = _read_once(key_path, "key", secret=True, owners=frozenset({0, os.geteuid(), *owners}))
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise PairError(f"the certificate {cert_path} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise PairError(f"the key {key_path} is encrypted (mcpd needs it without a passphrase)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PairError(f"the key {key_path} holds no usable PEM private key ({type(exc).__name__})") from None
    leaf = chain[0]
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise PairError(f"the key {key_path} is not the key of the certificate {cert_path}")
    now = now or datetime.datetime.now(datetime.UTC)
    start, end = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    if end <= now:
        raise PairError(f"the certificate {cert_path} expired at {end.isoformat()}")
    if start > now + datetime.timedelta(seconds=CLOCK_SKEW_SECONDS):
        raise PairError(f"the certificate {cert_path} is not valid before {start.isoformat()}")
    return Pair(cert_pem, key_pem, fingerprint(leaf.public_bytes(serialization.Encoding.DER)),
                leaf.subject.rfc4514_string(), start, end)


def server_context() -> ssl.SSLContext:
    """A server context with the listener's settings and no certificate yet: TLS 1.3 preferred,
    TLS 1.2 minimum with ECDHE and AEAD suites only (AES-GCM, ChaCha20-Poly1305), no compression or
    renegotiation."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)  # TLS 1.2: forward secrecy and AEAD only; TLS 1.3 suites are all AEAD
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    return ctx


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return fd
    except BaseException:
        os.close(fd)
        raise


def context_for(pair: Pair) -> ssl.SSLContext:
    """A :func:`server_context` holding ``pair``: OpenSSL reads the very bytes checked (from
    memory files, never the paths again) and checks the key against the certificate once more.

    Raises:
        PairError: OpenSSL refused the pair.
    """
    ctx = server_context()
    cert_fd = _memfd("mcpd-tls-cert", pair.cert_pem)
    try:
        key_fd = _memfd("mcpd-tls-key", pair.key_pem)
        try:
            ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
        except (OSError, ssl.SSLError) as exc:
            raise PairError(f"OpenSSL refused the pair ({exc.__class__.__name__}: {getattr(exc, 'reason', None)})") \
                from None
        finally:
            os.close(key_fd)
    finally:
        os.close(cert_fd)
    return ctx


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")


class LiveCertificate:
    """The listener's context (:attr:`context`, given to the server once) and the pair in use.

    Args:
        cert_path, key_path: the configured files (``tls.cert``, ``tls.key``).
        state_dir: where :data:`STATE_FILE` is written; ``None``: nowhere.

    Raises:
        PairError: the first load failed (the front must not start).
    """

    def __init__(self, cert_path: str, key_path: str, state_dir: str | None = None) -> None:
        self.cert_path, self.key_path, self.state_dir = cert_path, key_path, state_dir
        self._sigs = self._signatures()
        self.pair = read_pair(cert_path, key_path)
        self.context = self._current = context_for(self.pair)
        self.context.sni_callback = self._select
        self.loaded_at = self.checked_at = time.time()
        self.refused: str | None = None  # why the last reload failed; None after a good one
        self._write_state()

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        if ctx is not self._current:
            sslobj.context = self._current

    def _signatures(self) -> tuple[Signature | None, Signature | None]:
        out: list[Signature | None] = []
        for path in (self.cert_path, self.key_path):
            try:
                out.append(signature(path))
            except OSError:
                out.append(None)
        return out[0], out[1]

    def reload(self, why: str) -> bool:
        """Read and check both files now; on success new handshakes use the new pair.

        Returns:
            True when the new pair is in use; False when it was refused (logged once, the pair in
            use stays).
        """
        self._sigs = self._signatures()
        self.checked_at = time.time()
        try:
            pair = read_pair(self.cert_path, self.key_path)
            ctx = context_for(pair)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the pair in use stays
            self.refused = str(exc) if isinstance(exc, PairError) else f"unexpected {type(exc).__name__}"
            log.error("tls reload (%s) refused, the certificate in use (%s) stays: %s", why,
                      self.pair.fingerprint, exc)
            self._write_state()
            return False
        old, self.pair, self._current, self.refused = self.pair, pair, ctx, None
        self.loaded_at = self.checked_at
        log.info("tls reload (%s): %s, fingerprint %s, valid until %s%s", why, pair.subject, pair.fingerprint,
                 pair.not_after.isoformat(), "" if old.fingerprint != pair.fingerprint else " (the same certificate)")
        self._write_state()
        return True

    async def watch(self, every: float = WATCH_SECONDS) -> None:
        """Forever: look at both files' signatures (device, inode, size, mtime) every ``every``
        seconds and reload once they changed and then stayed the same for one look (an installer
        replacing the certificate and then the key is seen once, whole)."""
        seen = self._sigs
        while True:
            await asyncio.sleep(every)
            now = self._signatures()
            if now != self._sigs and now == seen:
                self.reload("files changed")
            seen = now

    def state(self) -> dict[str, object]:
        """What :data:`STATE_FILE` holds (JSON types only)."""
        return {
            "pid": os.getpid(), "cert": self.cert_path, "key": self.key_path,
            "fingerprint_sha256": self.pair.fingerprint, "subject": self.pair.subject,
            "not_before": self.pair.not_before.isoformat(), "not_after": self.pair.not_after.isoformat(),
            "loaded_at": _utc(self.loaded_at), "checked_at": _utc(self.checked_at),
            "last_check_ok": self.refused is None, "refused": self.refused,
        }

    def _write_state(self) -> None:
        if not self.state_dir:
            return
        path = os.path.join(self.state_dir, STATE_FILE)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tls-state.", dir=self.state_dir)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(self.state(), f)
                os.chmod(tmp, 0o640)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc.strerror)

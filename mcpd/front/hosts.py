"""The ``Host`` header check (``allowed_hosts``): defence in depth against DNS rebinding.

A page in a victim's browser that rebinds its own name to the server's address can reach the
server, but its requests name the attacker's host. With ``allowed_hosts`` set, a request whose
``Host`` names anything else is refused with ``421 Misdirected Request`` before authentication.
``auto`` stands for the names in the TLS certificate (subject alternative names, DNS and IP; the
common name when there are none), which are the names a verifying client can use anyway.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from cryptography import x509
from cryptography.x509.oid import NameOID
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Scope

from mcpd.common.validate import digits
from mcpd.front.refused import CheckMiddleware

AUTO = "auto"


def certificate_names(cert_path: str) -> list[str]:
    """The host names and addresses the PEM certificate at ``cert_path`` is valid for (lower case).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a PEM certificate.
    """
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [str(a.value).lower() for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return [n.lower() for n in san.get_values_for_type(x509.DNSName)] + \
        [str(a) for a in san.get_values_for_type(x509.IPAddress)]


def split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` for IPv6) → ``(host lower-cased, port or None)``; ``None``
    when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
    else:
        host, sep, port_text = value.partition(":")
        rest = sep + port_text
    if not host:
        return None
    if not rest:
        return host, None
    port = digits(rest[1:]) if rest.startswith(":") else None
    if port is None or not 0 < port < 65536:
        return None
    return host, port


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.rstrip(".")


class HostRule:
    """Which ``Host`` values are accepted.

    Args:
        entries: ``name`` (any port), ``name:port``, ``[v6]`` / ``[v6]:port``, ``*.domain`` (one
            label, like a wildcard certificate) or ``auto``; none means every host is accepted.
        cert_path: the certificate ``auto`` reads.

    Raises:
        ValueError: a malformed entry, or ``auto`` with an unreadable certificate.
    """

    def __init__(self, entries: Iterable[str], cert_path: str) -> None:
        self.rules: list[tuple[str, int | None]] = []
        for entry in entries:
            names: list[str] = []
            if entry == AUTO:
                try:
                    names = certificate_names(cert_path)
                except (OSError, ValueError) as exc:
                    raise ValueError(f"allowed_hosts: auto: cannot read the certificate's names: {exc}") from None
            else:
                names = [entry]
            for name in names:
                parsed = split_host(f"[{name}]" if ":" in name and not name.startswith("[")
                                    and name.count(":") > 1 else name)
                if parsed is None:
                    raise ValueError(f"allowed_hosts: malformed entry {name!r}")
                self.rules.append((_canonical(parsed[0]), parsed[1]))

    @property
    def enabled(self) -> bool:
        """Some host is named: the check is on."""
        return bool(self.rules)

    def allows(self, host_header: str | None) -> bool:
        """Whether a request with this ``Host`` value (``None``: no header) is accepted."""
        if not self.rules:
            return True
        parsed = split_host(host_header) if host_header else None
        if parsed is None:
            return False
        host, port = _canonical(parsed[0]), parsed[1]
        for name, want_port in self.rules:
            if want_port is not None and want_port != port:
                continue
            if name == host:
                return True
            if name.startswith("*.") and host.endswith(name[1:]):
                label = host[: len(host) - len(name) + 1]
                if label and "." not in label:
                    return True
        return False


class HostMiddleware(CheckMiddleware):
    """Refuse requests whose ``Host`` the :class:`HostRule` does not accept: ``421``."""

    def __init__(self, app: ASGIApp, rule: HostRule) -> None:
        self.app = app
        self.rule = rule

    def refusal(self, scope: Scope) -> Response | None:
        """The ``421`` for an HTTP request whose one ``Host`` header the rule does not accept (or
        that has none, or several), else ``None``; always ``None`` when no host is named."""
        if self.rule.enabled:
            hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
            if len(hosts) != 1 or not self.rule.allows(hosts[0]):
                return PlainTextResponse("host not allowed", status_code=421)
        return None

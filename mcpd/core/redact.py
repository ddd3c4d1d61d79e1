"""Secret detectors: text in, the same text with each recognised secret replaced by ``[REDACTED:<kind>]``.

Runs in the worker only (docs/REFERENCE.md §3 "Redaction"), on UTF-8 bytes, with RE2
(``google-re2``): every detector is one RE2 pattern, so the time is linear in the text whatever
it holds. The detectors (:data:`mcpd.common.redaction.DETECTORS`; run in :data:`ORDER`):

- ``private-key``: a PEM or OpenSSH private key block from its ``-----BEGIN ... PRIVATE KEY-----``
  line to its ``END`` line (or such a block base64-encoded, as kubeconfig's ``client-key-data``) (or to the end of the text when the text ends inside it, or from the
  start of the text when it starts inside one, :func:`redact`'s ``inside``). The block becomes the
  marker followed by as many newlines as it held: line numbers never change.
- ``cloud-key``: AWS access key ids (``AKIA``/``ASIA``...), AWS secret keys assigned to an
  ``aws_secret_access_key``-like name, a GCP service account's ``"private_key"``, an Azure
  connection string's ``AccountKey``.
- ``token``: ``Bearer`` credentials, JWTs (``eyJ...``), GitHub (``ghp_``, ``gho_``, ``github_pat_``...),
  Slack (``xox?-``) and mcpd's own bearer tokens.
- ``url-password``: the password of ``scheme://user:password@host`` (the user may be empty).
- ``shadow-hash``: a crypt hash (``$1$``, ``$5$``, ``$6$``, ``$y$``, ``$2b$``...) in a shadow-like ``name:hash:`` line
  (a locked account's ``!`` before it too).
- ``assignment``: the value of ``password=``, ``passwd:``, ``secret:``, ``api_key=``, ``token=``
  style settings (config, ``.env``, YAML, JSON, INI); a name must end in the keyword
  (``password_policy=strict`` is no secret), and booleans, ``${VAR}`` references and markers are left.

Only the secret part is replaced (``password=[REDACTED:assignment]``); newlines are never removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import re2

from mcpd.common.redaction import DETECTORS

MARK = b"[REDACTED:%s]"
#: the order detectors run in: a GCP key's ``private_key`` is a cloud key before it is a PEM block
ORDER = ("cloud-key", "private-key", "token", "url-password", "shadow-hash", "assignment")
LOOKBACK = 64 * 1024  # bytes looked at before a page to know whether it starts inside a private key block

_KEY_NAME = rb"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?"
_BEGIN = rb"-----BEGIN " + _KEY_NAME + rb"-----"
_END = rb"-----END " + _KEY_NAME + rb"-----"
#: a setting's name ends in one of these (any prefix), or in a short word after ``_``, ``.``, ``-`` or at its
#: start (``pwd`` only after one: a shell's ``PWD=/home/alice`` is no secret)
_ASSIGN_WORDS = rb"(?:[A-Za-z0-9_.-]*(?:password|passwd|passphrase|secret|api[_-]?key|apikey" \
    rb"|(?:private|access)[_-]?key)|(?:[A-Za-z0-9_.-]*[_.-])?(?:token|pass)|[A-Za-z0-9_.-]*[_.-]pwd)"

#: the end of a token: a byte no token holds, or the end of the text
_STOP = rb"(?:[^A-Za-z0-9_]|\z)"
#: kind -> patterns whose group 1 is the secret. A pattern starts with its literal where it can
#: (RE2 then skips to it at memchr speed); one that begins a word must not follow a word byte,
#: which :func:`_replace` checks (:data:`_WORD_START`) rather than a ``\b`` that would slow RE2 down
_SOURCES: dict[str, tuple[bytes, ...]] = {
    "private-key": (
        rb"(?s)(" + _BEGIN + rb"(?:.*?" + _END + rb"|.*\z))",
        # the same block base64-encoded whole, as kubeconfig's client-key-data holds it: "-----BEGIN"
        # then, within the name, "PRIVATE KEY" at one of its three base64 alignments
        rb"(LS0tLS1CRUdJTi[A-Za-z0-9+/]{0,60}(?:UFJJVkFURSBLRVk|QUklWQVRFIEtFW|SVZBVEUgS0VZ)[A-Za-z0-9+/=]*)",
    ),
    "cloud-key": (
        rb"((?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|APKA)[A-Z0-9]{16})" + _STOP,
        rb"(?i)aws_?secret_?(?:access_?)?key[\"']?\s*(?:=>|=|:)\s*[\"']?([A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+]|\z)",
        rb"\"private_key\"\s*:\s*\"([^\"]+)\"",
        rb"(?i)AccountKey=([A-Za-z0-9+/=]{20,})",
    ),
    "token": (
        rb"(?i)bearer\s+([A-Za-z0-9._~+/-]{16,}=*)",
        rb"(eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)",
        rb"((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,255})" + _STOP,
        rb"(github_pat_[A-Za-z0-9_]{22,255})" + _STOP,
        rb"(xox[abposr]-[A-Za-z0-9-]{10,255})",
        rb"(mcpd_[0-9a-f]{12}_[A-Za-z0-9_-]{43})",
    ),
    "url-password": (rb"://[^\s:/@\"'<>]{0,256}:([^\s@/\"'<>]{1,512})@",),
    "shadow-hash": (rb":!{0,2}(\$(?:1|2[abxy]|5|6|7|y|gy|sha1|md5|apr1)\$[./A-Za-z0-9$=,]{8,})(?::|\n|\z)",),
    "assignment": (
        rb"(?im)(?:^|[^A-Za-z0-9])" + _ASSIGN_WORDS + rb"[\"']?[ \t]*(?:=>|=|:)[ \t]*"
        rb"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"',;}{][^\n\"',;}]*)",
    ),
}
#: (kind, pattern index) of the patterns whose match must begin a word
_WORD_START = frozenset({("cloud-key", 0), ("token", 0), ("token", 1), ("token", 2), ("token", 3), ("token", 4),
                         ("token", 5)})
#: what precedes a shadow hash on its line: an account name (and ``:``), as ``/etc/shadow`` has it
_SHADOW_NAME = rb"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}\$?"
_PLAIN_VALUES = frozenset((b"true", b"false", b"yes", b"no", b"on", b"off", b"null", b"none", b"~", b"required",
                           b"optional"))


def _compile(source: bytes) -> Any:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = 32 * 1024 * 1024
    return re2.compile(source, opts)


_PATTERNS: dict[str, tuple[Any, ...]] = {kind: tuple(_compile(s) for s in sources) for kind, sources in _SOURCES.items()}
_SHADOW_NAME_RE = _compile(_SHADOW_NAME)
_END_RE = _compile(rb"(?m)" + _END + rb"[^\n]*")
_LAST_MARK = _compile(rb"(?s).*(" + _BEGIN + rb"|" + _END + rb")")


def _assignment_value(value: bytes) -> tuple[int, int] | None:
    """Where the secret lies in an assignment's value (without quotes and trailing blanks), or None."""
    start, end = 0, len(value)
    if value[:1] in (b'"', b"'"):
        start, end = 1, end - 1
    while end > start and value[end - 1] in b" \t\r":
        end -= 1
    core = value[start:end]
    if not core or core.lower() in _PLAIN_VALUES or core.startswith((b"${", b"$(", b"%(", b"{{", b"[REDACTED:")) \
            or core.startswith(b"<") and core.endswith(b">"):
        return None
    return start, end


def _starts_word(data: bytes, at: int) -> bool:
    return at == 0 or not (data[at - 1:at].isalnum() or data[at - 1:at] == b"_")


def _shadow_line(data: bytes, colon: int) -> bool:
    """Whether the ``:`` at ``colon`` follows an account name alone on its line (``name:$6$...``)."""
    start = data.rfind(b"\n", max(0, colon - 34), colon) + 1
    return (start > 0 or colon <= 33) and _SHADOW_NAME_RE.fullmatch(data[start:colon]) is not None


def _replace(data: bytes, kind: str, counts: dict[str, int]) -> bytes:
    """``data`` with every ``kind`` secret replaced (module docstring)."""
    mark = MARK % kind.encode()
    for i, regex in enumerate(_PATTERNS[kind]):
        word = (kind, i) in _WORD_START
        out: list[bytes] = []
        pos = 0
        for m in regex.finditer(data):
            start, end = m.span(1)
            if word and not _starts_word(data, m.start()):
                continue
            if kind == "shadow-hash" and not _shadow_line(data, m.start()):
                continue
            if kind == "assignment":
                where = _assignment_value(data[start:end])
                if where is None:
                    continue
                start, end = start + where[0], start + where[1]
            elif data.startswith(b"[REDACTED:", start):
                continue
            out += [data[pos:start], mark + b"\n" * data.count(b"\n", start, end)]
            pos = end
            counts[kind] = counts.get(kind, 0) + 1
        if out:
            out.append(data[pos:])
            data = b"".join(out)
    return data


def redact(data: bytes, detectors: tuple[str, ...] | list[str], inside: bool = False) -> tuple[bytes, dict[str, int]]:
    """``data`` (UTF-8 bytes) with the secrets of ``detectors`` replaced, and how many of each kind.

    ``inside``: the text starts inside a private key block (:func:`starts_inside`): up to its first
    ``END`` line (all of it when there is none) it is that key, redacted as one when
    ``private-key`` is among ``detectors``. The result has exactly as many ``\\n`` as ``data``.
    """
    counts: dict[str, int] = {}
    if not detectors or not data:
        return data, counts
    if inside and "private-key" in detectors:
        m = _END_RE.search(data)
        stop = len(data) if m is None else m.end()
        data = MARK % b"private-key" + b"\n" * data.count(b"\n", 0, stop) + data[stop:]
        counts["private-key"] = 1
    for kind in ORDER:
        if kind in detectors:
            data = _replace(data, kind, counts)
    return data, counts


def redact_text(text: str, detectors: tuple[str, ...] | list[str], inside: bool = False) -> tuple[str, dict[str, int]]:
    """:func:`redact` for ``str`` (lone surrogates kept as ``surrogatepass`` writes them)."""
    if not detectors or not text:
        return text, {}
    out, counts = redact(text.encode("utf-8", "surrogatepass"), detectors, inside)
    return (out.decode("utf-8", "surrogatepass") if counts else text), counts


def starts_inside(before: bytes) -> bool:
    """Whether text following ``before`` (UTF-8 bytes) lies inside a private key block: the last
    ``BEGIN ... PRIVATE KEY`` or ``END`` line of ``before`` is a ``BEGIN``."""
    if b"PRIVATE KEY" not in before:
        return False
    m = _LAST_MARK.search(before)
    return m is not None and m.group(1).startswith(b"-----BEGIN")


def inside_at(fd: int | Callable[[int, int], bytes], pos: int, codec: str = "utf-8", floor: int = 0) -> bool:
    """:func:`starts_inside` for byte ``pos`` of the open file ``fd`` (or of what a reader
    ``(n, pos) -> bytes`` reads, as a decompressed text's), judged on the
    :data:`LOOKBACK` bytes before it (not before ``floor``, a BOM's end), decoded with ``codec``."""
    if pos <= floor:
        return False
    start = max(floor, pos - LOOKBACK)
    unit = 4 if "32" in codec else 2 if "16" in codec else 1
    start += (pos - start) % unit
    raw = b""
    while len(raw) < pos - start:  # a reader may answer short
        got = os.pread(fd, pos - start - len(raw), start + len(raw)) if isinstance(fd, int) else \
            fd(pos - start - len(raw), start + len(raw))
        if not got:
            break
        raw += got
    if unit > 1 or codec not in ("utf-8", "ascii", "latin-1", "cp1252"):
        raw = raw.decode(codec, "ignore").encode("utf-8", "surrogatepass")
    return starts_inside(raw)


def add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` (kind -> number) to ``into``."""
    for kind, n in counts.items():
        into[kind] = into.get(kind, 0) + n


assert set(ORDER) == set(DETECTORS)  # every detector runs, once

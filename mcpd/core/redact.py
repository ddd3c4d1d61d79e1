"""Secret detectors: text in, the same text with each recognised secret replaced by ``[REDACTED:<kind>]``.

Runs in the worker only (docs/REFERENCE.md §3 "Redaction"), on UTF-8 bytes, with RE2
(``google-re2``): every detector is RE2 patterns and one forward pass over what they match (each byte
once), so the time is linear in the text whatever
it holds. The detectors (:data:`mcpd.common.redaction.DETECTORS`; run in :data:`ORDER`):

- ``private-key``: a PEM, OpenSSH or SSH2 private key block from its ``BEGIN ... PRIVATE KEY`` line
  to its ``END`` line (without one, to the end of the text, unless the BEGIN line is quoted); such
  a block base64-encoded whole, on one line or wrapped (:func:`_wrapped_end`); a PuTTY ``.ppk``'s
  private lines. A text that starts inside a block (:func:`redact`'s ``inside``, :func:`inside_at`,
  :func:`still_inside`) is redacted up to its END line. The block becomes the marker followed by
  as many newlines as it held: line numbers never change.
- ``cloud-key``: AWS access key ids (``AKIA``/``ASIA``...), AWS secret keys assigned to an
  ``aws_secret_access_key``-like name, a GCP service account's ``"private_key"``, an Azure
  connection string's ``AccountKey``.
- ``token``: ``Bearer`` credentials, JWTs (``eyJ...``), GitHub (``ghp_``, ``gho_``, ``github_pat_``...),
  Slack (``xox?-``) and mcpd's own bearer tokens, HTTP Basic credentials, Docker's ``"auth"``.
- ``url-password``: the password of ``scheme://user:password@host`` (the user may be empty).
- ``shadow-hash``: a crypt hash (``$1$``, ``$5$``, ``$6$``, ``$y$``, ``$2b$``...) in a shadow-like ``name:hash:`` line
  (a locked account's ``!`` before it too).
- ``assignment``: the value of ``password=``, ``passwd:``, ``secret:``, ``api_key=``, ``token=``
  style settings (config, ``.env``, YAML and its block scalars, JSON, INI, PHP ``define``, .netrc
  and redis words); a name must end in the keyword (``password_policy=strict`` is no secret), and
  booleans, ``${VAR}`` references, markers and the near-misses :func:`_no_secret` names are left.
  The table in docs/REFERENCE.md "Redaction" is the contract.

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
DEEP_LOOKBACK = 64 * 1024 * 1024  # bytes a key block's body is followed back before it counts as inside one

_KEY_NAME = rb"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?"
#: PEM's five dashes, or SSH.com's (RFC 4716 style) four and a space
_BEGIN = rb"(?:-----BEGIN |---- BEGIN )" + _KEY_NAME + rb"(?:-----| ----)"
_END = rb"(?:-----END |---- END )" + _KEY_NAME + rb"(?:-----| ----)"
#: what follows a BEGIN line that opens a key: anything but a closing quote or parenthesis (fail
#: closed); a BEGIN line quoted in a script (``'-----BEGIN ...-----'``) opens none unless an END follows
_OPENS = rb"(?:[^'\"`)]|\z)"
#: a setting's name ends in one of these (any prefix), or in a short word after ``_``, ``.``, ``-`` or at its
#: start (``pwd`` only after one: a shell's ``PWD=/home/alice`` is no secret)
_ASSIGN_WORDS = rb"(?:[A-Za-z0-9_.-]*(?:password|passwd|passphrase|secret|api[_-]?key|apikey" \
    rb"|(?:private|access|secret)[_-]?key|secret[_-]?key[_-]?base|(?:access|refresh|auth|id|session|client|identity)" \
    rb"[_-]?token)|(?:[A-Za-z0-9_.-]*[_.-])?(?:token|pass)|[A-Za-z0-9_.-]*[_.-]pwd)"
#: a quoted value (a backslash escapes the next byte), or an unquoted one (an LDIF ``{SCHEME}`` first);
#: an unquoted one runs to its line's end (or a quote, ``}``), :data:`_VALUE_CUT` then cuts it
_QUOTED = rb"\"(?:[^\"\\\n]|\\[^\n])*\"|'(?:[^'\\\n]|\\[^\n])*'"
_VALUE = rb"(" + _QUOTED + rb"|(?:\{[A-Za-z0-9.-]{1,20}\})?[^\s\"',;}{=][^\n\"'}]*)"

#: the end of a token: a byte no token holds, or the end of the text
_STOP = rb"(?:[^A-Za-z0-9_]|\z)"
#: kind -> patterns whose group 1 is the secret. A pattern starts with its literal where it can
#: (RE2 then skips to it at memchr speed); one that begins a word must not follow a word byte,
#: which :func:`_replace` checks (:data:`_WORD_START`) rather than a ``\b`` that would slow RE2 down
_SOURCES: dict[str, tuple[bytes, ...]] = {
    "private-key": (
        rb"(?s)(" + _BEGIN + rb"(?:.*?" + _END + rb"|" + _OPENS + rb".*\z))",
        # the same block base64-encoded whole, as kubeconfig's client-key-data holds it: "-----BEGIN"
        # then, within the name, "PRIVATE KEY" at one of its three base64 alignments
        rb"(LS0tLS1CRUdJTi[A-Za-z0-9+/]{0,60}(?:UFJJVkFURSBLRVk|QUklWQVRFIEtFW|SVZBVEUgS0VZ)[A-Za-z0-9+/=]*)",
        # a PuTTY .ppk file's private lines (base64, after "Private-Lines: N")
        rb"(?s)Private-Lines:[ \t]*[0-9]+[ \t]*\r?\n(.*?)(?:Private-MAC|Private-Hash|\z)",
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
        # HTTP Basic credentials (base64 of user:password) and a Docker config.json's "auth" (the same)
        rb"(?i)authorization[\"']?[ \t]*[:=][ \t]*[\"']?basic[ \t]+([A-Za-z0-9+/]{4,}={0,2})",
        rb"\"auth\"[ \t]*:[ \t]*\"([A-Za-z0-9+/]{4,}={0,2})\"",
    ),
    # the password runs to the last "@" before the host: a password may hold "@"
    "url-password": (rb"://[^\s:/@\"'<>]{0,256}:([^\s/\"'<>]{1,512})@",),
    "shadow-hash": (rb":!{0,2}(\$(?:1|2[abxy]|5|6|7|y|gy|sha1|md5|apr1)\$[./A-Za-z0-9$=,]{8,})(?::|\n|\z)",),
    "assignment": (
        rb"(?im)(?:^|[^A-Za-z0-9])" + _ASSIGN_WORDS + rb"[\"']?[ \t]*(?:=>|=|:)[ \t]*" + _VALUE,
        # PHP's define('DB_PASSWORD', '...') (WordPress's AUTH_KEY, ..._SALT too)
        rb"(?i)define\([ \t]*['\"](?:" + _ASSIGN_WORDS + rb"|[A-Za-z0-9_]*_(?:KEY|SALT))['\"][ \t]*,[ \t]*("
        + _QUOTED + rb")",
        # space-separated: .netrc's "login NAME password WORD", and a line of its own "password WORD"
        # (.netrc's long form), redis's "requirepass WORD" and "masterauth WORD"
        rb"(?i)[ \t]login[ \t]+[^\s]+[ \t]+password[ \t]+(\"[^\"\n]*\"|[^\s]+)",
        rb"(?im)^[ \t]*(?:password|passwd|requirepass|masterauth)[ \t]+(\"[^\"\n]*\"|[^\s]+)[ \t]*\r?$",
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
_VALUE_CUT = _compile(rb"[;,][ \t]*[A-Za-z_][A-Za-z0-9_.-]*[ \t]*[=:]")
_REF_DEFAULT = _compile(rb"\$\{[A-Za-z_][A-Za-z0-9_]*:?[-=+]")
_TYPE_NAME = _compile(rb"(?i)(?:str|string|bytes|int|bool|any|secretstr|optional\[str\])(?:[ \t]*[)=|,\]]|\z)")
_TYPE_STARTS = frozenset((b"str", b"byt", b"int", b"boo", b"any", b"sec", b"opt"))  # _TYPE_NAME's, checked first
_BLOCK_SCALAR = _compile(rb"[|>][1-9+-]{0,2}")
_SHADOW_NAME_RE = _compile(_SHADOW_NAME)
_END_RE = _compile(rb"(?m)" + _END + rb"[^\n]*")
_LAST_MARK = _compile(rb"(?s).*(" + _BEGIN + _OPENS + rb"|" + _END + rb")")
_ANY_MARK = _compile(_BEGIN + rb"|" + _END)
#: text that may lie inside a key block's body: base64 lines (a PGP checksum's ``=`` too) and
#: ``Name: value`` armor headers, from the first line start on
_BODY = _compile(rb"(?s)[^\n]*(?:\n(?:[A-Za-z0-9+/=\r]*|[A-Za-z][A-Za-z0-9-]*: [^\n]*))*")
#: how far back :func:`inside_at` follows a key block's body before it judges the text inside one
#: (fail closed): 64 MiB


def _assignment_value(value: bytes) -> tuple[int, int] | None:
    """Where the secret lies in an assignment's value (without quotes and trailing blanks), or None."""
    start, end = 0, len(value)
    if value[:1] in (b'"', b"'"):
        start, end = 1, end - 1
    else:
        cut = _VALUE_CUT.search(value) if b";" in value or b"," in value else None  # "pw;Database=x": not all one
        if cut is not None:
            end = cut.start()
    while end > start and value[end - 1] in b" \t\r":
        end -= 1
    core = value[start:end]
    if core.startswith(b"${"):  # ${VAR:-default}: the default is a secret, the reference none
        ref = _REF_DEFAULT.match(core)
        if ref is None:
            return None
        start += ref.end()
        end -= core.endswith(b"}")
        core = value[start:end]
    if not core or core.lower() in _PLAIN_VALUES or core.startswith((b"${", b"$(", b"%(", b"{{", b"[REDACTED:")) \
            or core.startswith(b"<") and core.endswith(b">"):
        return None
    return start, end


def _no_secret(data: bytes, at: int, vstart: int, core: bytes) -> bool:
    """Whether the assignment whose match starts at ``at`` and whose value ``core`` starts at
    ``vstart`` is no secret though it looks like one: a number for a ``token``/``pass`` name
    (``max_token: 4096``), a type annotation (``password: str)``), nsswitch.conf's
    ``passwd: files systemd``, a log message's ``error: password: authentication failed ...``."""
    head = data[at:vstart].rstrip(b" \t=:>\"'").lower()
    if core.isdigit() and head.endswith((b"token", b"pass")):
        return True
    if core[:3].lower() in _TYPE_STARTS and _TYPE_NAME.match(core) is not None:
        return True
    if head.endswith(b"passwd") and all(w in _NSS_SOURCES for w in core.lower().split()
                                        if not w.startswith(b"[")):
        return True
    # a log message's "level: password: words ...": the name follows ": " (a YAML flow "{password: ...}" does not)
    return data[at - 1:at + 1] == b": " and data[vstart:vstart + 1] not in b"\"'" and core.count(b" ") >= 2


def _line_start(data: bytes, at: int) -> int:
    """The start of the line holding byte ``at``, looked for no more than 256 bytes back (linear on
    a long line of many matches)."""
    lo = max(0, at - 256)
    nl = data.rfind(b"\n", lo, at)
    return nl + 1 if nl >= 0 else lo


def _block_end(data: bytes, at: int, end: int) -> int:
    """The end of a YAML block scalar (``password: |``, ``>-``) whose indicator ends at ``end``, the
    match starting at ``at``: the lines after it indented more than the key's line, blank ones too."""
    line = _line_start(data, at)
    indent = len(data[line:at + 1]) - len(data[line:at + 1].lstrip(b" \t-"))
    nl = data.find(b"\n", end)
    stop = end
    while nl >= 0:
        nxt = data.find(b"\n", nl + 1)
        row = data[nl + 1:len(data) if nxt < 0 else nxt]
        body = row.strip(b" \t\r")
        if body and len(row) - len(row.lstrip(b" \t")) <= indent:
            break
        if body:
            stop = nl + 1 + len(row.rstrip(b"\r"))
        if nxt < 0:
            break
        nl = nxt
    return stop


_NSS_SOURCES = frozenset((b"files", b"systemd", b"compat", b"sss", b"ldap", b"nis", b"nisplus", b"winbind", b"db",
                          b"dns", b"myhostname", b"resolve", b"mymachines", b"usrfiles", b"altfiles", b"extrausers",
                          b"cache", b"hesiod", b"mdns4_minimal", b"mdns4"))


def _wrapped_end(data: bytes, end: int) -> int:
    """Where a base64-encoded key that ends its line at ``end`` ends when it is wrapped over lines
    (GNU ``base64``'s 76 columns, ``openssl base64``'s 64): the lines after it that are all base64
    and no longer than its first, while the line before was as long as the first (a wrapped
    encoding's last line is the short one). One pass over those lines."""
    start = data.rfind(b"\n", 0, end) + 1
    width = end - start
    if width < 16:
        return end
    while True:
        nl = end + (data.startswith(b"\r", end))
        if not data.startswith(b"\n", nl):
            return end
        a = nl + 1
        b = a
        while b < len(data) and b - a <= width and data[b] in _B64:
            b += 1
        if b == a or b - a > width or (b < len(data) and data[b] not in b"\r\n"):
            return end
        end = b
        if b - a < width:
            return end


_B64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


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
            if start < pos:  # inside what a block scalar or a wrapped key already took: each byte once
                continue
            if word and not _starts_word(data, m.start()):
                continue
            if kind == "shadow-hash" and not _shadow_line(data, m.start()):
                continue
            if kind == "assignment":
                where = _assignment_value(data[start:end])
                if where is None or _no_secret(data, m.start(), start + where[0], data[start + where[0]:start + where[1]]):
                    continue
                start, end = start + where[0], start + where[1]
                if data[start:start + 1] in (b"|", b">") and _BLOCK_SCALAR.fullmatch(data[start:end]) is not None:
                    end = _block_end(data, m.start(), end)
            elif data.startswith(b"[REDACTED:", start):
                continue
            elif kind == "private-key" and i == 1:
                end = _wrapped_end(data, end)
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


def _last_mark(before: bytes) -> bool | None:
    """True when the last ``BEGIN ... PRIVATE KEY`` or ``END`` line of ``before`` is a ``BEGIN``
    that opens a key, False when it is an ``END``, None when ``before`` has neither."""
    if b"PRIVATE KEY" not in before:
        return None
    m = _LAST_MARK.search(before)
    return None if m is None else b"BEGIN" in m.group(1)[:11]


def starts_inside(before: bytes) -> bool:
    """Whether text following ``before`` (UTF-8 bytes) lies inside a private key block: the last
    ``BEGIN ... PRIVATE KEY`` or ``END`` line of ``before`` is a ``BEGIN``."""
    return bool(_last_mark(before))


def still_inside(inside: bool, text: bytes) -> bool:
    """Whether text following ``text`` lies inside a private key block, when ``text`` itself
    followed text that did (``inside``): the last marker of ``text`` decides, and without one
    the state goes on (a block longer than any window stays a block). ``text``: UTF-8 bytes
    holding whole marker lines (a stream's last :data:`LOOKBACK` bytes, or a block of lines)."""
    last = _last_mark(text)
    return inside if last is None else last


def inside_at(fd: int | Callable[[int, int], bytes], pos: int, codec: str = "utf-8", floor: int = 0) -> bool:
    """:func:`starts_inside` for byte ``pos`` of the open file ``fd`` (or of what a reader
    ``(n, pos) -> bytes`` reads, as a decompressed text's), judged on the
    :data:`LOOKBACK` bytes before it (not before ``floor``, a BOM's end), decoded with ``codec``;
    when those hold no marker and are all key body, on the body before them (:func:`_deep_inside`)."""
    if pos <= floor:
        return False
    start, raw = _window(fd, pos, LOOKBACK, 0, codec, floor)
    last = _last_mark(raw)
    if last is not None or start <= floor:
        return bool(last)
    return _deep_inside(fd, start, codec, floor, raw)


def _window(fd: int | Callable[[int, int], bytes], pos: int, size: int, past: int, codec: str,
            floor: int) -> tuple[int, bytes]:
    """Where the ``size`` bytes before ``pos`` start (not before ``floor``, whole ``codec`` units),
    and them and ``past`` bytes after ``pos``, as UTF-8."""
    start = max(floor, pos - size)
    unit = 4 if "32" in codec else 2 if "16" in codec else 1
    start += (pos - start) % unit
    raw = _read_back(fd, start, pos + past)
    if unit > 1 or codec not in ("utf-8", "ascii", "latin-1", "cp1252"):
        raw = raw.decode(codec, "ignore").encode("utf-8", "surrogatepass")
    return start, raw


def _deep_inside(fd: int | Callable[[int, int], bytes], pos: int, codec: str, floor: int, window: bytes) -> bool:
    """:func:`inside_at` when the window before ``pos`` holds no marker: if it is all key body
    (:data:`_BODY`), the body is followed back, in steps that double from :data:`LOOKBACK` to
    8 MiB (a decompressed text's reader starts over for each), to the marker before it (a
    ``BEGIN`` there: inside); text that is no key body, or the file's start, first: not inside;
    more than :data:`DEEP_LOOKBACK` bytes of body: inside (fail closed)."""
    gone, step = 0, LOOKBACK
    while True:
        if _BODY.fullmatch(window) is None or pos <= floor:
            return False
        if gone >= DEEP_LOOKBACK:
            return True
        step = min(step * 2, 8 * 1024 * 1024)
        start, raw = _window(fd, pos, step, 256, codec, floor)  # a little past: a marker the step cuts is whole
        last = _last_mark(raw)
        if last is not None:
            return last
        gone += pos - start
        pos, window = start, raw


def _read_back(fd: int | Callable[[int, int], bytes], start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of ``fd`` (or a reader, which may answer short), fewer at its end."""
    raw = b""
    while len(raw) < stop - start:
        got = os.pread(fd, stop - start - len(raw), start + len(raw)) if isinstance(fd, int) else \
            fd(stop - start - len(raw), start + len(raw))
        if not got:
            break
        raw += got
    return raw


def literal_marks(raw: bytes, out: bytes) -> dict[int, dict[str, int]]:
    """The markers the text ``raw`` itself holds (literal ``[REDACTED:<kind>]``, no secret) that
    survive into its redaction ``out`` (the same lines), by line index from 0 and kind: what a
    count of the markers shown must leave out (a file cannot forge a redaction count)."""
    got: dict[int, dict[str, int]] = {}
    lines: list[bytes] | None = None
    pos = raw.find(b"[REDACTED:")
    while pos >= 0:
        i = raw.count(b"\n", 0, pos)
        if i not in got:
            lines = out.split(b"\n") if lines is None else lines
            a = raw.rfind(b"\n", 0, pos) + 1
            b = raw.find(b"\n", pos)
            row = raw[a:len(raw) if b < 0 else b]
            shown = lines[i] if i < len(lines) else b""
            got[i] = {k: n for k in DETECTORS
                      if (n := min(row.count(MARK % k.encode()), shown.count(MARK % k.encode())))}
        pos = raw.find(b"[REDACTED:", pos + 1)
    return {i: n for i, n in got.items() if n}


def add_counts(into: dict[str, int], counts: dict[str, int]) -> None:
    """Add ``counts`` (kind -> number) to ``into``."""
    for kind, n in counts.items():
        into[kind] = into.get(kind, 0) + n


assert set(ORDER) == set(DETECTORS)  # every detector runs, once

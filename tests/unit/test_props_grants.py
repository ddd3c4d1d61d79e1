"""Property tests (hypothesis) of grant matching (docs/REFERENCE.md §4.3) against a brute-force matcher written
here: lexical cleaning by a component stack, per-component globs by plain recursion, and ``**``
by trying every split. The product's ``mcpd.helper.wire.pathmatch``, ``mcpd.common.grantmatch`` (entries and ``decide``) are only
imported. Derandomized, bounded example counts.
"""

from __future__ import annotations

import datetime
import functools

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpd.common import grantmatch
from mcpd.common import grantmatch as entries
from mcpd.helper.wire import pathmatch
from mcpd.policy import grants

SETTINGS = settings(derandomize=True, max_examples=700, deadline=None, database=None)
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)

# Few letters, so globs and names collide often; "[ab]", "[!a]", "*", "?" and "**" as patterns.
NAME = st.text(alphabet="ab.-", min_size=1, max_size=3).filter(lambda s: s not in (".", ".."))
GLOB = st.lists(st.sampled_from(["a", "b", "-", "*", "?", "[ab]", "[!a]", "[a-b]"]), min_size=1, max_size=3).map("".join).filter(
    lambda s: "**" not in s)  # (a "**" inside a component is refused: tested on its own)
PATTERN_PART = st.one_of(NAME, GLOB, st.just("**"))
ENTRY = st.lists(PATTERN_PART, max_size=4).map(tuple)
PATH = st.lists(NAME, max_size=5).map(tuple)
RAW_PART = st.one_of(NAME, st.sampled_from([".", "..", ""]))
RAW_PATH = st.lists(RAW_PART, max_size=7).map(lambda parts: "/" + "/".join(parts))


# -- the brute-force matcher --------------------------------------------------------------------------


def glob_char_class(pattern: str, i: int, ch: str) -> tuple[bool, int] | None:
    """Match ``ch`` against the class starting at ``pattern[i] == "["``: (matched, index after ``]``),
    or ``None`` when there is no closing bracket (then ``[`` is an ordinary character)."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] == "!"
    j += negate
    members: list[tuple[str, str]] = []
    first = True
    while j < len(pattern) and (first or pattern[j] != "]"):
        first = False
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            members.append((pattern[j], pattern[j + 2]))
            j += 3
        else:
            members.append((pattern[j], pattern[j]))
            j += 1
    if j >= len(pattern):
        return None
    hit = any(lo <= ch <= hi for lo, hi in members)
    return hit != negate, j + 1


def glob(pattern: str, name: str) -> bool:
    """``*``, ``?`` and ``[...]`` within one name, by recursion over every choice."""
    if not pattern:
        return not name
    head = pattern[0]
    if head == "*":
        return any(glob(pattern[1:], name[k:]) for k in range(len(name) + 1))
    if not name:
        return False
    if head == "?":
        return glob(pattern[1:], name[1:])
    if head == "[":
        cls = glob_char_class(pattern, 0, name[0])
        if cls is not None:
            hit, after = cls
            return hit and glob(pattern[after:], name[1:])
    return head == name[0] and glob(pattern[1:], name[1:])


def matches(entry: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether ``entry`` matches exactly ``path`` (``**``: every number of whole components)."""
    if not entry:
        return not path
    if entry[0] == "**":
        return any(matches(entry[1:], path[k:]) for k in range(len(path) + 1))
    return bool(path) and glob(entry[0], path[0]) and matches(entry[1:], path[1:])


def covers(entry: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """An entry covers a path when it matches the path or one of its ancestors."""
    return any(matches(entry, path[:k]) for k in range(len(path) + 1))


def clean(raw: str) -> tuple[str, ...]:
    """Lexical cleaning: ``.`` and empty parts vanish, ``..`` drops the last part (never above ``/``)."""
    out: list[str] = []
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
        else:
            out.append(part)
    return tuple(out)


# -- properties ---------------------------------------------------------------------------------------


@SETTINGS
@given(entry=ENTRY, path=PATH)
def test_entry_covers_agrees_with_brute_force(entry: tuple[str, ...], path: tuple[str, ...]) -> None:
    assert entries.entry_covers(entry, path) == covers(entry, path), (entry, path)


@SETTINGS
@given(raw=RAW_PATH)
def test_clean_path_agrees_with_a_component_stack(raw: str) -> None:
    assert grantmatch.components(pathmatch.clean_path(raw)) == clean(raw)


@SETTINGS
@given(entry=ENTRY)
def test_written_entries_split_into_their_components(entry: tuple[str, ...]) -> None:
    text = "/" + "/".join(entry)
    assert entries.split_entry(text) == entry


@SETTINGS
@given(entry=ENTRY, at=st.integers(0, 4), left=st.sampled_from(["", "a", "*"]), right=st.sampled_from(["", "b", "?"]))
def test_a_double_star_inside_a_component_is_refused(entry: tuple[str, ...], at: int, left: str, right: str) -> None:
    part = left + "**" + right
    parts = list(entry)
    parts.insert(min(at, len(parts)), part)
    try:
        entries.split_entry("/" + "/".join(parts))
    except pathmatch.PathError:
        assert part != "**"
    else:
        assert part == "**"


@functools.cache
def policy(paths: tuple[tuple[str, ...], ...], deny: tuple[tuple[str, ...], ...]) -> grantmatch.Policy:
    rule = {"allowed": True, "paths": ["/" + "/".join(p) for p in paths]}
    if deny:
        rule["deny"] = ["/" + "/".join(d) for d in deny]
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/read": rule}}}}})
    return grants.parse_policy(text)


@settings(derandomize=True, max_examples=600, deadline=None, database=None)
@given(paths=st.lists(ENTRY, min_size=1, max_size=3).map(tuple), deny=st.lists(ENTRY, max_size=2).map(tuple),
       raw=RAW_PATH, user=st.sampled_from(["alice", "bob"]))
def test_decide_allows_exactly_what_a_grant_covers_and_no_deny_does(
        paths: tuple[tuple[str, ...], ...], deny: tuple[tuple[str, ...], ...], raw: str, user: str) -> None:
    decision = grantmatch.decide(policy(paths, deny), user, frozenset(), "files/read", raw, NOW)
    parts = clean(raw)
    granted = any(covers(p, parts) for p in paths)
    denied = any(covers(d, parts) for d in deny)
    assert decision.allowed == (user == "alice" and granted and not denied), (decision, parts)
    if user == "alice" and denied:
        assert decision.reason == grantmatch.DENIED
    assert decision.resolved_path == "/" + "/".join(parts)

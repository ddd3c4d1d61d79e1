"""``reauth_after`` in grants (issue 5; docs/REFERENCE.md §4.1, §5.2): strict schema, pure decision."""

from __future__ import annotations

import datetime
import textwrap

import pytest

from mcpd.common.grantmatch import REAUTH, decide, fresh_enough
from mcpd.policy.grants import PolicyError, parse_duration, parse_policy

NOW = datetime.datetime(2026, 6, 1, 12, 0, 0, tzinfo=datetime.UTC)


def policy(reauth: str) -> str:
    return textwrap.dedent(f"""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: true
                  paths: [/var/log]
                  reauth_after: {reauth}
        """)


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize("text,seconds", [("0", 0), ("30", 30), ("30s", 30), ("5m", 300), ("1h", 3600)])
def test_reauth_after_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    rule = parse_policy(policy(text)).users["alice"]["files/read"]
    assert rule.reauth_after == seconds


@pytest.mark.parametrize("bad", ["-1", "5 m", "5d", "soon", "1.5m", "true", "[1]"])
def test_reauth_after_malformed_is_an_error_with_file_and_line(bad: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(policy(bad), "g.yaml")
    assert info.value.errors == ["g.yaml:8: reauth_after must be a duration like 0, 30s, 5m or 1h"]


def test_reauth_required_static_token_never_satisfies() -> None:
    p = parse_policy(policy("5m"))
    d = decide(p, "alice", set(), "files/read", "/var/log/syslog", NOW, login_time=None)
    assert (d.allowed, d.reason) == (False, REAUTH)


def test_reauth_after_honoured_within_the_window() -> None:
    p = parse_policy(policy("5m"))
    d = decide(p, "alice", set(), "files/read", "/var/log/syslog", NOW, login_time=ago(299))
    assert d.allowed and d.reauth_after == 300


def test_reauth_after_expires_past_the_window() -> None:
    p = parse_policy(policy("5m"))
    d = decide(p, "alice", set(), "files/read", "/var/log/syslog", NOW, login_time=ago(301))
    assert (d.allowed, d.reason) == (False, REAUTH)


def test_reauth_after_zero_means_one_login_per_call() -> None:
    p = parse_policy(policy("0"))
    assert decide(p, "alice", set(), "files/read", "/var/log/x", NOW, login_time=ago(3600)).allowed
    used = decide(p, "alice", set(), "files/read", "/var/log/x", NOW, login_time=ago(1), login_used=True)
    assert (used.allowed, used.reason) == (False, REAUTH)


def test_reauth_does_not_turn_a_missing_grant_into_reauth() -> None:
    p = parse_policy(policy("5m"))
    d = decide(p, "alice", set(), "files/read", "/etc/shadow", NOW, login_time=None)
    assert d.reason == "no grant covers this path"


def test_reauth_deny_still_wins() -> None:
    text = policy("5m") + "          deny: [/var/log/auth.log]\n"
    p = parse_policy(text)
    d = decide(p, "alice", set(), "files/read", "/var/log/auth.log", NOW, login_time=ago(1))
    assert d.reason == "path is denied by the grant"


def test_rule_without_reauth_needs_no_login() -> None:
    assert fresh_enough(None, NOW, None, False)
    text = policy("5m").replace("          reauth_after: 5m\n", "")
    d = decide(parse_policy(text), "alice", set(), "files/read", "/var/log/x", NOW)
    assert d.allowed and d.reauth_after is None

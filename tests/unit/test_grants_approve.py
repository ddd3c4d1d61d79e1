"""The grant key ``approve: {by, for, self}`` (docs/REFERENCE.md §4.2, §4.7): parsed strictly, and
carried by the allowing decision."""

from __future__ import annotations

import datetime
import textwrap

import pytest

from mcpd.common.grantmatch import Approve, decide
from mcpd.policy.grants import PolicyError, parse_policy

NOW = datetime.datetime(2026, 12, 8, tzinfo=datetime.UTC)


def policy(approve: str) -> str:
    return textwrap.dedent("""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: true
                  paths: [/var/log]
                  approve: """) + approve + "\n"


def test_approve_parses_and_the_decision_carries_it() -> None:
    p = parse_policy(policy("{by: [bob, '%ops'], for: 1h}"))
    d = decide(p, "alice", set(), "files/read", "/var/log/syslog", NOW)
    assert d.allowed and d.approve == Approve(("bob", "%ops"), 3600.0, False)
    assert parse_policy(policy("{by: [bob], self: true}")).users["alice"]["files/read"].approve == \
        Approve(("bob",), 0.0, True)


@pytest.mark.parametrize("bad,message", [
    ("{by: []}", "approve.by must be a non-empty list"),
    ("{by: [b/c]}", "approve.by must be a non-empty list"),
    ("{by: [bob], for: soon}", "approve.for must be a duration"),
    ("{by: [bob], self: yes please}", "approve.self must be true or false"),
    ("{by: [bob], who: x}", "unknown key 'who'"),
])
def test_approve_malformed_is_an_error_with_file_and_line(bad: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(policy(bad), "g.yaml")
    assert len(info.value.errors) == 1 and info.value.errors[0].startswith("g.yaml:8: ")
    assert message in info.value.errors[0]


def test_grants_views_and_reload_summaries_show_approve() -> None:
    from mcpd.admin.grants_view import rule_lines, rule_to_dict
    from mcpd.policy.grants_reload import summarize_changes

    p = parse_policy(policy("{by: [bob, '%ops'], for: 1h}"))
    rule = p.users["alice"]["files/read"]
    assert "approve by bob, %ops for 1h (not their own)" in rule_lines(p, rule, NOW, "users.alice files/read", "  ")[0]
    assert rule_to_dict(rule)["approve"] == {"by": ["bob", "%ops"], "for": 3600, "self": False}
    q = parse_policy(policy("{by: [bob], self: true}"))
    assert summarize_changes(p, q) == ["users.alice files/read approve by bob for 0s self added",
                                       "users.alice files/read approve by bob,%ops for 3600s removed"]


def test_grants_check_warns_about_an_approver_group_that_does_not_exist() -> None:
    from mcpd.policy.grants_lint import lint_policy

    p = parse_policy(policy("{by: [bob, '%nosuchgroup', '%ops']}"))
    warnings = lint_policy(p, NOW, lambda name: True, lambda name: name == "ops")
    assert [w for _, w in warnings] == [
        "users.alice files/read: approve.by %nosuchgroup: no OS group is named nosuchgroup: nobody of it can approve"]

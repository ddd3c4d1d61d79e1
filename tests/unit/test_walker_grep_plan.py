"""The plan of a privileged files/grep (:func:`mcpd.walker.main.plan_grep`, run by the walker) and
the policy process's judgement of every planned path (:func:`mcpd.policy.grepcall.judged`): the
walker lists only files the grant covers, counts the others without naming them (never the
daemon's secrets), skips symlinks, resumes at a cursor; the policy process opens nothing a lying
walker plans outside the grant."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.common.grantmatch import policy_from_wire, rules_to_wire
from mcpd.core.grepargs import encode_cursor, parse_grep_args
from mcpd.policy.grants import parse_policy
from mcpd.policy.grepcall import judged
from mcpd.walker import main as walker


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "t"
    (t / "pub" / "deep").mkdir(parents=True)
    (t / "pub" / "a.log").write_text("a\n")
    (t / "pub" / "deep" / "b.log").write_text("b\n")
    (t / "pub" / "deep" / "c.txt").write_text("c\n")
    (t / "pub" / "denied.log").write_text("d\n")
    (t / "pub" / "users.yaml").write_text("x\n")
    (t / "pub" / "private").mkdir()
    (t / "pub" / "private" / "k.log").write_text("k\n")
    os.symlink("/etc/shadow", t / "pub" / "shadow.log")
    return t


def _rule(tree: Path) -> dict[str, Any]:
    return {"allowed": True, "paths": [str(tree / "pub")],
            "deny": [str(tree / "pub" / "denied.log"), str(tree / "pub" / "private")]}


def plan(tree: Path, **args: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/grep": _rule(tree)}}}}})
    frame = {"op": "files/grep", "args": {"pattern": "x", "path": str(tree / "pub"), "privileged": True, **args},
             "os_user": "alice", "groups": [], "follow": False, "secrets": [str(tree / "pub" / "users.yaml")],
             "rules": rules_to_wire(parse_policy(text), "alice", set(), "files/grep")}
    sent: list[dict[str, Any]] = []
    reply = walker.run(frame, send=sent.append)
    return reply, sent


def files_of(sent: list[dict[str, Any]]) -> list[str]:
    return [f for s in sent for f in s["plan"]["files"]]


def test_the_plan_holds_granted_files_in_walk_order_and_counts_the_others(tree: Path) -> None:
    reply, sent = plan(tree)
    assert reply["ok"] is True and reply["result"]["stopped"] is None
    pub = tree / "pub"
    assert files_of(sent) == [str(pub / "a.log"), str(pub / "deep" / "b.log"), str(pub / "deep" / "c.txt")]
    assert sum(s["plan"]["not_granted"] for s in sent) == 1  # denied.log: not private/ (not entered), not users.yaml
    assert [k for s in sent for k in s["plan"]["skips"]] == [[str(pub / "shadow.log"), "symlink"]]
    assert "denied.log" not in repr(sent) and "users.yaml" not in repr(sent) and "k.log" not in repr(sent)


def test_include_and_max_depth_shape_the_plan_and_the_count(tree: Path) -> None:
    _, sent = plan(tree, include="*.log", max_depth=1)
    assert files_of(sent) == [str(tree / "pub" / "a.log")]
    assert sum(s["plan"]["not_granted"] for s in sent) == 1
    _, sent = plan(tree, include="*.txt")
    assert files_of(sent) == [str(tree / "pub" / "deep" / "c.txt")]
    assert sum(s["plan"]["not_granted"] for s in sent) == 0  # denied.log would not have been searched


def test_the_plan_resumes_at_a_cursor(tree: Path) -> None:
    pub = tree / "pub"
    parsed = parse_grep_args({"pattern": "x", "path": str(pub), "privileged": True})
    after = encode_cursor(parsed, str(pub / "deep" / "b.log"), None, 1)  # that file done: the rest
    _, sent = plan(tree, cursor=after)
    assert files_of(sent) == [str(pub / "deep" / "c.txt")]
    inside = encode_cursor(parsed, str(pub / "deep" / "b.log"), 0, 1)  # that file again
    _, sent = plan(tree, cursor=inside)
    assert files_of(sent) == [str(pub / "deep" / "b.log"), str(pub / "deep" / "c.txt")]


def test_a_file_is_planned_alone_and_a_symlink_is_refused_by_the_opener(tree: Path) -> None:
    reply, sent = plan(tree, path=str(tree / "pub" / "a.log"))
    assert reply["result"]["alone"] is True and files_of(sent) == [str(tree / "pub" / "a.log")]
    reply, sent = plan(tree, path=str(tree / "pub" / "shadow.log"))
    assert reply["ok"] is False and reply["error"]["code"] == "PERMISSION_DENIED" and sent == []


def test_bad_arguments_are_invalid_argument_before_any_plan(tree: Path) -> None:
    for bad in ({"follow_symlinks": True}, {"pattern": 3}, {"cursor": "junk"}, {"nope": 1}):
        reply, sent = plan(tree, **bad)
        assert reply["error"]["code"] == "INVALID_ARGUMENT" and sent == [], bad


def test_the_policy_opens_nothing_a_lying_walker_plans_outside_the_grant(tree: Path) -> None:
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/grep": _rule(tree)}}}}})
    policy = policy_from_wire(rules_to_wire(parse_policy(text), "alice", set(), "files/grep"),
                              (str(tree / "pub" / "users.yaml"),))
    pub = str(tree / "pub")

    def ok(path: Any) -> bool:
        return judged(policy, "alice", frozenset(), pub, path, None)

    assert ok(f"{pub}/a.log") and ok(f"{pub}/deep/b.log") and ok(pub)
    assert not ok(f"{pub}/denied.log") and not ok(f"{pub}/private/k.log") and not ok(f"{pub}/users.yaml")
    assert not ok("/etc/shadow") and not ok(f"{pub}/../../etc/shadow") and not ok(f"{pub}-evil/x")
    assert not ok(f"{pub}//a.log") and not ok(f"{pub}/./a.log") and not ok("a.log") and not ok(None) and not ok(7)
    assert not judged(policy, "bob", frozenset(), pub, f"{pub}/a.log", None)  # another account's grant


def test_only_the_walks_own_skip_reasons_reach_an_answer() -> None:
    """A walker's skip reasons are the walk's (any other text from it, which a taken-over walker
    could fill with names it saw, is dropped by the policy process)."""
    from mcpd.core import grepwalk
    from mcpd.policy.grepcall import WALK_SKIPS

    assert WALK_SKIPS == set(grepwalk._SKIPS.values()) | {"error", "not_regular", "symlink", "loop", "too_deep"}

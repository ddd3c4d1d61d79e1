"""The ``redact`` setting in ``users.yaml`` and ``mcp-sudo.yaml`` (docs/REFERENCE.md §3 "Redaction",
§4.2, §5.1): parsed strictly, kept by every tool that rewrites the users file, decided by the
allowing grant, shown by ``mcpd grants test`` and ``mcpd users list``."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mcpd.admin.cli import main as mcpd_main
from mcpd.common import grantmatch, identity
from mcpd.common.redaction import DETECTORS
from mcpd.policy.grants import PolicyError, parse_policy
from mcpd.policy.grants_lint import lint_policy

NOW = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)


def _users(redact: object) -> dict[str, object]:
    return {"users": {"carol": {"os_user": "carol", "redact": redact, "tokens": []}}}


def test_users_file_redact_is_parsed_strictly() -> None:
    assert identity.parse_users(_users("secrets"))["carol"].redact == DETECTORS
    assert identity.parse_users(_users(["token", "assignment"]))["carol"].redact == ("token", "assignment")
    assert identity.parse_users({"users": {"dave": {"os_user": "dave"}}})["dave"].redact == ()
    for bad in ("everything", ["tokens"], 7):
        with pytest.raises(identity.UsersFileError, match=r"users\.carol\.redact: "):
            identity.parse_users(_users(bad))


def test_the_principal_carries_redact_and_a_login_takes_every_bound_ones() -> None:
    token, rec = identity.new_token()
    users = identity.parse_users(_users(["token"]))
    users["carol"].tokens = [rec]
    found = identity.verify(users, token)
    assert found is not None and found.redact == ("token",)
    users["carol2"] = identity.UserRecord(name="carol2", os_user="carol", redact=("private-key",))
    login = identity.login_principal(users, "carol", "0" * 12)
    assert login is not None and login.redact == ("private-key", "token")


def test_users_redact_sets_and_clears_it(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    identity.save_users(path, identity.parse_users({"users": {"carol": {"os_user": "carol", "redact": "secrets"}}}))
    assert identity.load_users(path)["carol"].redact == DETECTORS
    res = CliRunner().invoke(mcpd_main, ["users", "redact", "carol", "token", "url-password", "--file", str(path)])
    assert res.exit_code == 0 and res.stdout == "carol: redact token, url-password\n"
    listed = CliRunner().invoke(mcpd_main, ["users", "list", "--file", str(path)])
    assert "\tredact: token, url-password" in listed.stdout
    bad = CliRunner().invoke(mcpd_main, ["users", "redact", "carol", "passwords", "--file", str(path)])
    assert bad.exit_code == 2 and "unknown detector 'passwords'" in bad.stderr
    res = CliRunner().invoke(mcpd_main, ["users", "redact", "carol", "none", "--file", str(path)])
    assert res.exit_code == 0 and identity.load_users(path)["carol"].redact == ()
    assert "redact" not in path.read_text()


def test_rotate_keeps_redact(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    identity.save_users(path, identity.parse_users({"users": {"carol": {"os_user": "carol", "redact": ["token"]}}}))
    res = CliRunner().invoke(mcpd_main, ["users", "rotate", "carol", "--file", str(path)])
    assert res.exit_code == 0, res.output
    assert identity.load_users(path)["carol"].redact == ("token",)


GRANT = """users:
  alice:
    privileged:
      tools:
        files/read: {allowed: true, paths: [/srv/a], redact: [token, private-key]}
        files/list: {allowed: true, paths: [/srv]}
  bob:
    privileged:
      tools:
        files/read: {allowed: false, redact: secrets}
"""


def test_a_grant_says_redact_and_its_decision_carries_it() -> None:
    policy = parse_policy(GRANT)
    d = grantmatch.decide(policy, "alice", set(), "files/read", "/srv/a/x", NOW)
    assert d.allowed and d.redact == ("private-key", "token")
    assert grantmatch.decide(policy, "alice", set(), "files/list", "/srv/a", NOW).redact == ()
    warnings = lint_policy(policy, NOW, lambda _: True, lambda _: True)
    assert any("redact on a rule that grants nothing" in w for _, w in warnings)


@pytest.mark.parametrize(("rule", "message"), [
    ("{allowed: true, paths: [/srv], redact: all}", "unknown detector 'all'"),
    ("{allowed: true, paths: [/srv], redact: [token, 3]}", "unknown detector 3"),
])
def test_a_bad_grant_redact_is_an_error_with_its_line(rule: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(f"users:\n  alice:\n    privileged:\n      tools:\n        files/read: {rule}\n")
    assert any(e.startswith("mcp-sudo.yaml:5: ") and message in e for e in err.value.errors), err.value.errors


def test_redact_on_a_tool_that_serves_no_content_is_an_error() -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy("users:\n  alice:\n    privileged:\n      tools:\n"
                     "        files/list: {allowed: true, paths: [/srv], redact: secrets}\n")
    assert any("redact applies to files/read" in e for e in err.value.errors)


def test_grants_test_shows_the_redaction_that_applies(tmp_path: Path) -> None:
    grants = tmp_path / "mcp-sudo.yaml"
    grants.write_text(GRANT)
    users = tmp_path / "users.yaml"
    identity.save_users(users, identity.parse_users({"users": {
        "alice-bot": {"os_user": "alice", "redact": ["assignment"]}, "alice": {"os_user": "alice"}}}))
    config = tmp_path / "mcpd.yaml"
    config.write_text(yaml.safe_dump({"users_file": str(users), "grants_file": str(grants)}))
    res = CliRunner().invoke(mcpd_main, ["grants", "test", "--user", "alice", "--tool", "files/read", "--path",
                                         "/srv/a/app.conf", "--config", str(config), "--any-owner"])
    assert res.exit_code == 0, res.output
    assert "redaction (grant): private-key, token\n" in res.stdout
    assert "redaction for principal alice: private-key, token (users.yaml: none)\n" in res.stdout
    assert "redaction for principal alice-bot: private-key, token, assignment (users.yaml: assignment)\n" \
        in res.stdout


def test_redact_on_a_files_grep_rule_is_allowed() -> None:
    policy = parse_policy("users:\n  alice:\n    privileged:\n      tools:\n"
                          "        files/grep: {allowed: true, paths: [/srv], redact: [token]}\n")
    assert policy is not None

"""scripts/modgraph.py reads the tree as it is: root's line count as the budget counts it, no
run-time cycle, and the route of a privileged files/read through the five processes, found from the
request tables and the calls (a step it cannot find prints ``(not found)``)."""

from __future__ import annotations

from tests.support.codelines import folder_code_lines
from tests.support.modgraph import REPO, modgraph


def test_the_report_counts_root_as_the_budget_does_and_finds_no_cycle() -> None:
    text = "\n".join(modgraph().report(REPO, modgraph().load(REPO)))
    root = sum(folder_code_lines(REPO / "mcpd/helper", REPO).values())
    assert f"code lines as the budget counts them): {root}" in text
    assert "cycles between modules (at run time):\n  none" in text and "cycles between packages:\n  none" in text
    assert "  helper   -> " not in text  # root imports no other package


def test_a_privileged_read_passes_front_policy_root_policy_worker() -> None:
    graph = modgraph()
    lines = graph.route(graph.load(REPO), "files/read-privileged")
    text = "\n".join(lines)
    assert "(not found)" not in text, text
    assert [line.split()[0] for line in lines[1:]] == ["front", "policy", "root", "policy", "worker"], text
    for step in ("mcpd.front.mcp.dispatcher -> mcpd.front.policy_client.backend", "sends the policy process privileged_call",
                 "mcpd.policy.requests -> mcpd.policy.calls -> mcpd.policy.rootclient", "RootClient.open",
                 "mcpd.helper.monitor -> mcpd.helper.wire.opener", "_openat2", "mcpd.policy.handover",
                 "mcpd.worker.main -> mcpd.core.ops", "files_read_op"):
        assert step in text, (step, text)

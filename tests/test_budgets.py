"""Two budgets and a clock: the idea's constraints.budget is the experiments' money, the
agent's own model use has its own limit; both, and the time against the idea's limit, are
in STATE.md, the prompts' digest and `labrun status`."""

from __future__ import annotations

import json
import re
import time

import pytest

from support import DEMO_IDEA, labrun
from labrun import prompts
from labrun.phase_registry import BY_KEY
from labrun.phases.phase import toolbox
from labrun.session import Session
from labrun.state import parse_state_md
from labrun.usage import Budget, BudgetSpent, Usage

IDEA = DEMO_IDEA.read_text().replace("    budget: 0\n", "    budget: \"$50\"\n")


@pytest.fixture
def idea(tmp_path):
    path = tmp_path / "idea.yaml"
    path.write_text(IDEA)
    return path


def opened(ws, idea=None, **kw) -> Session:
    return Session.open(ws, idea, "scripted", **kw)


def current_state(ws) -> str:
    return parse_state_md((ws / "STATE.md").read_text())["Current State"]


def test_the_ideas_budget_is_the_experiments_and_the_agents_has_its_own(tmp_path, idea):
    s = opened(tmp_path / "a", idea)
    assert (s.state.budget_usd, s.state.budget_from, s.state.experiments_budget_usd) == (None, "none", 50.0)
    s.close()
    own = tmp_path / "own.yaml"
    own.write_text(IDEA.replace("    budget: \"$50\"\n", "    budget: \"$50\"\n    agent_budget: 8\n"))
    s = opened(tmp_path / "b", own)
    assert (s.state.budget_usd, s.state.budget_from) == (8.0, "constraints.agent_budget")
    s.close()
    s = opened(tmp_path / "c", own, budget_usd=3)
    assert (s.state.budget_usd, s.state.budget_from) == (3.0, "--budget-usd")
    s.close()
    s = opened(tmp_path / "b", budget_usd=12)  # a resume with --budget-usd
    assert (s.state.budget_usd, s.state.budget_from) == (12.0, "--budget-usd")
    text = current_state(tmp_path / "b")
    assert "The agent's model use: $0.00 of its budget of $12.00 (--budget-usd)" in text
    assert "The runs' spending: $0.00 reported by 0 attempts (metric `cost_usd`), of the idea's budget of $50.00" in text
    s.close()


def test_a_session_whose_budget_came_from_the_idea_is_migrated_once(tmp_path, idea):
    ws = tmp_path / "ws"
    opened(ws, idea).close()
    # As an older labrun left it: the idea's constraints.budget was the agent's limit.
    path = ws / ".labrun/state.json"
    old = json.loads(path.read_text())
    for field in ("budget_from", "experiments_budget_usd", "time_limit_s", "agent_spent_usd", "elapsed_s", "plan"):
        old.pop(field)
    old["budget_usd"] = 50.0
    path.write_text(json.dumps(old))

    s = opened(ws)
    assert (s.state.budget_usd, s.state.budget_from, s.state.experiments_budget_usd) == (None, "none", 50.0)
    assert [c.id for c in s.state.plan.criteria] == ["C1", "C2", "C3"]
    s.close()
    opened(ws).close()
    worklog = parse_state_md((ws / "STATE.md").read_text())["Worklog"]
    said = [line for line in worklog.splitlines() if "budgets split" in line]
    assert len(said) == 1, worklog
    assert ("the idea's constraints.budget ($50.00) is now the experiments' spending limit, no longer the "
            "agent's; the agent's own model use has no limit") in said[0]

    # A budget that did not come from the idea (--budget-usd 7) stays the agent's.
    other = tmp_path / "other"
    opened(other, idea, budget_usd=7).close()
    state = json.loads((other / ".labrun/state.json").read_text())
    state.pop("budget_from")
    (other / ".labrun/state.json").write_text(json.dumps(state))
    s = opened(other)
    assert (s.state.budget_usd, s.state.budget_from) == (7.0, "--budget-usd")
    assert "budgets split" not in (other / "STATE.md").read_text()
    s.close()


def test_the_agents_budget_stops_model_calls_and_says_whose_it_is():
    budget = Budget(0.5, Usage(cost_usd=0.2), "/ws", on_spend=lambda used: seen.append(used.cost_usd))
    seen: list[float] = []
    budget.check()
    budget.spend(Usage(cost_usd=0.31))
    assert seen == [0.51]
    with pytest.raises(BudgetSpent, match=r"the agent's budget of \$0.50 is spent \(\$0.51 used\)"):
        budget.check()


def test_experiments_report_their_spending_and_the_clock_runs_across_resumes(tmp_path, idea, prefect_api):
    ws = tmp_path / "ws"
    s = opened(ws, idea)
    box = toolbox(s, BY_KEY["experiments"])
    (ws / "spend.py").write_text("import json, sys\njson.dump({'cost_usd': float(sys.argv[1]), 'acc': 0.5}, open('m.json', 'w'))\n")
    for amount in ("1.25", "0.5"):
        assert "SUCCESS" in box.call("run_experiment", {"command": f"python3 spend.py {amount}", "purpose": "spend",
                                                        "metrics_file": "m.json"}).content
    assert "SUCCESS" in box.call("run_experiment", {"command": "true", "purpose": "free"}).content
    time.sleep(1.2)
    s.store.save()
    first = s.state.elapsed_s
    assert first >= 1.2
    text = current_state(ws)
    assert "The runs' spending: $1.75 reported by 2 attempts (metric `cost_usd`), of the idea's budget of $50.00" in text
    assert re.search(r"^Time: \d+ s so far; each experiment attempt may run 10 min \(the idea's time_limit\)$",
                     text, re.M), text
    assert "Attempts so far: 3 (3 succeeded, 0 failed)" in text
    digest = prompts.digest(s.state, s.limits.clock())
    assert "**Clock** (when this phase started):\n- Time: " in digest
    assert "- The runs' spending: $1.75 reported by 2 attempts" in digest
    s.close()

    closed_s = 3.0
    time.sleep(closed_s)  # the engine is not running: this does not count
    began = time.monotonic()
    s = opened(ws)
    time.sleep(0.3)
    s.store.save()
    ran_s = time.monotonic() - began
    # The clock counts to 0.1 s; what it counts is the time an engine ran, however loaded the machine.
    assert first + 0.3 - 0.1 <= s.state.elapsed_s <= first + ran_s + 0.1
    assert ran_s < closed_s, "opening a session took longer than the pause it must not count"
    s.close()
    report = json.loads(labrun("status", str(ws), "--json").stdout)["session"]["clock"]
    assert report["experiments_spent_usd"] == 1.75 and report["experiments_reporting"] == 2
    assert report["time_limit_s"] == 600 and report["agent_budget_usd"] is None
    shown = labrun("status", str(ws)).stdout
    assert "The runs' spending: $1.75 reported by 2 attempts" in shown


def test_the_time_limit_bounds_each_attempt_and_a_run_past_it_is_stopped_with_a_warning(
        tmp_path, idea, prefect_api, caplog, monkeypatch):
    from labrun.limits import Limits

    s = opened(tmp_path / "ws", idea)
    s.state.elapsed_s = 700  # a session may run longer than its attempts' limit
    text = prompts.digest(s.state, s.limits.clock())
    assert "- Time: 11 min so far; each experiment attempt may run 10 min (the idea's time_limit)" in text
    assert ("Time limit: 600 s (about 0.2 h) for each experiment run: `run_experiment` stops an attempt that "
            "runs longer") in prompts.phase_system_prompt(s, "planning")
    # 1 s, under the schema's least (60 s), to be quick; the attempt's task reads it from the
    # idea's copy in the workspace, through Limits (this process: LABRUN_TASKS_IN=here).
    monkeypatch.setattr(Limits, "time_limit_s", property(lambda self: 1))
    began = time.monotonic()
    result = toolbox(s, BY_KEY["experiments"]).call("run_experiment", {"command": "sleep 30", "purpose": "slow"})
    assert time.monotonic() - began < 20
    assert "Attempt 1: FAILED" in result.content
    assert "stopped after the idea's time_limit of 1 s, which bounds each attempt" in result.content
    assert "attempt 1 ran past the idea's time_limit of 1 s and was stopped" in caplog.text
    s.close()

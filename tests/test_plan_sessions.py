"""Plans that bind, end to end: the Anthropic backend (the real SDK) against the fake
Messages API, the real engine and tools, a stand-in model that reads what the tools answer.

- A run list of three runs: completing the experiments after one is refused, naming the
  two still open; the model runs them and the phase completes.
- Nothing can succeed (the service the runs need refuses them): after an honest effort the
  experiments close as a documented negative outcome, and the statistics and the write-up
  still run, REPORT.md saying what failed and why.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from auto_responder import EXPERIMENT, IDEA, AutoResearcher, _call, tool_results  # noqa: E402
from support import status  # noqa: E402
from test_anthropic_session import assert_usage_is_what_was_billed  # noqa: E402

from labrun.state import parse_state_md  # noqa: E402

CRITERIA_IDEA = IDEA + """  evaluation_criteria:
    - "Fitted slope within -0.5 +/- 0.05 for every seed"
    - "Results reproducible from a fixed seed"
"""
SEEDED = EXPERIMENT.replace(
    "rng = random.Random(0)",
    'seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0\n    rng = random.Random(seed)',
).replace('"results/rmse_by_k.json"', 'f"results/rmse_by_k_s{seed}.json"').replace(
    '"results/metrics.json"', 'f"results/metrics_s{seed}.json"')
RUNS = [{"id": f"R{s + 1}", "purpose": f"RMSE per k and the fitted slope from seed {s}",
         "conditions": "sigma 0.5, k = 1..64, 400 trials per k", "seeds": [s],
         "criteria": ["C1", "C2"] if s == 0 else ["C1"]} for s in range(3)]
REFUSED = "The experiments phase is not complete yet"


def finished(results: list[str]) -> dict[str, str]:
    """Run → its SUCCESS attempt's number, from the tool results the model has read."""
    return {m.group(2): m.group(1) for r in results if (m := re.match(r"Attempt (\d+): SUCCESS\nRun: (R\d)", r))}


class ThreeRuns(AutoResearcher):
    """Plans three seeds as three runs, and tries to finish after the first."""

    def planning(self, body, turn):
        say, calls = super().planning(body, turn)
        if calls[0][0] == "complete_phase":
            calls[0][1]["run_list"] = RUNS
            calls[0][1]["analysis_outputs"] = ["results/summary.json"]
        return say, calls

    def implementation(self, body, turn):
        if turn == 1:
            return "Writing the seeded simulation.", [_call(
                "str_replace_based_edit_tool", command="create", path="src/experiment.py", file_text=SEEDED)]
        return super().implementation(body, turn)

    def experiments(self, body, turn):
        results = tool_results(body)
        done = finished(results)
        slopes = {m.group(1): float(m.group(2)) for r in results
                  if (m := re.search(r"^Run: (R\d).*\n(?:.*\n)*?Metrics: slope=(-?[\d.]+)", r, flags=re.M))}
        if set(done) == {"R1"} and not any(REFUSED in r for r in results):
            return "R1 is in; that should do.", [self.finish(slopes, done)]
        todo = [r for r in RUNS if r["id"] not in done]
        if todo:
            run, seed = todo[0], todo[0]["seeds"][0]
            return f"Running {run['id']}.", [_call(
                "run_experiment", command=f"python3 src/experiment.py --seed {seed}", run_id=run["id"],
                purpose=run["purpose"], outputs=[f"results/metrics_s{seed}.json"],
                metrics_file=f"results/metrics_s{seed}.json")]
        return "All three runs are in.", [self.finish(slopes, done)]

    @staticmethod
    def finish(slopes: dict[str, float], done: dict[str, str]):
        within = all(abs(s + 0.5) <= 0.05 for s in slopes.values())
        cited = ", ".join(f"{run} #{n}" for run, n in sorted(done.items()))
        return _call("complete_phase", summary=f"Slopes {slopes}.", sections={
            "experiment_results": "\n".join(f"- {k}: slope {v}" for k, v in sorted(slopes.items()))},
            criteria=[{"id": "C1", "status": "met" if within else "unmet", "note": f"{cited}: slope {slopes}"},
                      {"id": "C2", "status": "met", "note": f"R1 #{done['R1']} from seed 0 wrote its own files "
                                                           "and its slope"}],
            claims=[{"id": "K1", "criterion": "C1", "statement": "the slope, over the runs done", "metric": "slope",
                     "attempts": [int(n) for n in done.values()], "value": round(sum(slopes.values()) / len(slopes), 6)},
                    {"id": "K2", "criterion": "C2", "statement": "R1's slope", "metric": "slope",
                     "attempts": [int(done["R1"])], "value": slopes["R1"]}])

    def documentation(self, body, turn):
        if turn == 1:
            return "Writing the report.", [
                _call("str_replace_based_edit_tool", command="create", path="REPORT.md",
                      file_text="# Report\n\nRuns R1, R2 and R3 are done, one seed each.\n\n- C1: met\n- C2: met\n"),
                _call("str_replace_based_edit_tool", command="create", path="README.md", file_text="# Readme\n")]
        return super().documentation(body, turn)

    def analysis(self, body, turn):
        if turn == 1:
            return "Collecting the three runs.", [  # a planned output: written by the attempt that computes it
                _call("str_replace_based_edit_tool", command="create", path="src/collect.py", file_text=(
                    "import json, glob\nm = {f: json.load(open(f)) for f in sorted(glob.glob('results/metrics_s*.json'))}\n"
                    "json.dump(m, open('results/summary.json', 'w'))\nprint(json.dumps({'slope': [v['slope'] for v in m.values()]}))\n")),
                _call("run_experiment", command="python3 src/collect.py", purpose="the three runs in one summary",
                      outputs=["results/summary.json"])]
        return super().analysis(body, turn)


def test_three_planned_runs_and_completing_with_one_is_refused(tmp_path, serve, cli):
    api = serve(ThreeRuns())
    (tmp_path / "idea.yaml").write_text(CRITERIA_IDEA)
    ws = tmp_path / "ws"
    result = cli("run", str(tmp_path / "idea.yaml"), "--workspace", str(ws), "--agent", "anthropic")
    assert result.returncode == 0, result.stderr

    # The model's early complete_phase came back as an error naming the two open runs.
    refusals = [r for req in api.requests for r in tool_results(req["body"]) if r.startswith(REFUSED)]
    assert refusals, "completing the experiments with one run was not refused"
    assert 'run R2 ("RMSE per k and the fitted slope from seed 1")' in refusals[0]
    assert "run R3" in refusals[0] and "run R1" not in refusals[0]

    report = status(ws)
    assert report["session"]["complete"]
    assert [(a["n"], a["run_id"], a["status"]) for a in report["attempts"]] == [
        (1, "R1", "SUCCESS"), (2, "R2", "SUCCESS"), (3, "R3", "SUCCESS"), (4, None, "SUCCESS")]
    plan = report["plan"]
    assert plan["coverage"] == {"runs": 3, "done": 3, "deviated": 0, "open": 0}
    assert [c["status"] for c in plan["criteria"]] == ["met", "met"]
    assert plan["outputs"] == [{"path": "results/summary.json", "exists": True, "deviation": None}]
    summary = json.loads((ws / "results/summary.json").read_text())
    assert sorted(summary) == [f"results/metrics_s{s}.json" for s in range(3)]
    spec = parse_state_md((ws / "STATE.md").read_text())["Research Specification"]
    assert "| R3 | RMSE per k and the fitted slope from seed 2 |" in spec and "done: attempt #3 |" in spec
    # The prompt of every phase after planning showed the run list with its progress.
    analysis_prompt = next(r["body"]["system"][0]["text"] for r in api.requests
                           if r["body"]["system"][0]["text"].startswith("# Phase 5 of 6"))
    assert "### Run list (3 of 3 done)" in analysis_prompt
    assert "- **R2** [done: attempt #2]" in analysis_prompt
    assert_usage_is_what_was_billed(ws, api, report)


SERVICE = '''"""Calls the measurement service the study needs; it refuses without credentials."""
import os
import sys

attempt = {attempt}
if not os.environ.get("MEASURE_API_TOKEN"):
    sys.exit(f"MeasureServiceError: 401 from the service: MEASURE_API_TOKEN is not set (client v{{attempt}})")
'''


class NothingWorks(AutoResearcher):
    """Plans one run against a service that refuses every call; fixes what it can three
    times, tries a negative outcome too early, then closes the phase as one."""

    def planning(self, body, turn):
        say, calls = super().planning(body, turn)
        if calls[0][0] == "complete_phase":
            calls[0][1]["analysis_outputs"] = ["results/summary.json", "figures/rmse.png"]
        return say, calls

    def implementation(self, body, turn):
        if turn == 1:
            return "Writing the client.", [_call("str_replace_based_edit_tool", command="create",
                                                  path="src/experiment.py", file_text=SERVICE.format(attempt=1))]
        if turn == 2:
            return "Checking it parses.", [_call("bash", command="python3 -m py_compile src/experiment.py")]
        return super().implementation(body, turn)

    def experiments(self, body, turn):
        results = tool_results(body)
        failed = sum(bool(re.match(r"Attempt \d+: FAILED", r)) for r in results)
        negative = {"summary": "No run could reach the service.", "sections": {
            "experiment_results": f"{failed} attempts of R1, each refused by the service (401)."},
            "negative_outcome": "The measurement service refused every call with 401: MEASURE_API_TOKEN is not "
                                "set in this environment. Three client versions (plain, retrying, other endpoint) "
                                "failed the same way."}
        if failed == 1 and not any("honest effort" in r for r in results):
            return "This cannot work without the token; closing.", [_call("complete_phase", **negative)]
        if failed < 3:
            version = failed + 1
            return f"Trying client version {version}.", [
                _call("str_replace_based_edit_tool", command="create", path="src/experiment.py",
                      file_text=SERVICE.format(attempt=version)),
                _call("run_experiment", command="python3 src/experiment.py", run_id="R1", purpose="measure",
                      outputs=["results/metrics.json"], fix_applied=f"client version {version}")]
        return "Three honest tries; closing as a negative outcome.", [_call("complete_phase", **negative)]

    def analysis(self, body, turn):
        if turn == 1:
            return "Summarising the failures.", [_call("bash", command=(
                "mkdir -p results && printf '{\"attempts\": 3, \"cause\": \"401: no token\"}' > results/summary.json"))]
        return "No figure can be drawn.", [_call(
            "complete_phase", summary="The failure analysed.", sections={"learnings": "- Every attempt: 401, no token."},
            deviations=[{"id": "figures/rmse.png", "reason": "no run produced RMSE values"},
                        {"id": "results/summary.json", "reason": "no run computed anything; it lists the failures"}])]

    def documentation(self, body, turn):
        if turn == 1:
            return "Writing up the failure.", [
                _call("str_replace_based_edit_tool", command="create", path="REPORT.md",
                      file_text="# Report\n\nNo planned result was obtained.\n\n## What failed and why\n\n"
                                "Every attempt of run R1 was refused with 401: MEASURE_API_TOKEN is not set.\n"),
                _call("str_replace_based_edit_tool", command="create", path="README.md", file_text="# Readme\n")]
        return super().documentation(body, turn)


def test_when_nothing_can_succeed_the_report_is_still_written(tmp_path, serve, cli):
    api = serve(NothingWorks())
    (tmp_path / "idea.yaml").write_text(IDEA)
    ws = tmp_path / "ws"
    # The first attempt runs the client as implementation wrote it: it fails like the rest.
    result = cli("run", str(tmp_path / "idea.yaml"), "--workspace", str(ws), "--agent", "anthropic")
    assert result.returncode == 0, result.stderr

    early = [r for req in api.requests for r in tool_results(req["body"]) if "honest effort" in r]
    assert early and "at least 3 failed attempts in this phase" in early[0] and "(1 so far)" in early[0]
    report = status(ws)
    assert report["session"]["complete"]
    assert [p["status"] for p in report["phases"]] == ["DONE"] * 6
    assert [a["status"] for a in report["attempts"]] == ["FAILED"] * 3
    assert all("MEASURE_API_TOKEN is not set" in a["error"] for a in report["attempts"])
    plan = report["plan"]
    assert plan["negative_outcome"].startswith("The measurement service refused every call")
    assert plan["runs"][0]["state"] == "open" and plan["runs"][0]["attempts"] == [1, 2, 3]
    assert plan["outputs"][1] == {"path": "figures/rmse.png", "exists": False,
                                  "deviation": "no run produced RMSE values"}
    assert "## What failed and why" in (ws / "REPORT.md").read_text()
    text = (ws / "STATE.md").read_text()
    assert "## Negative Outcome" in parse_state_md(text)["Experiment Results"]
    # The later prompts said so.
    docs_prompt = next(r["body"]["system"][0]["text"] for r in api.requests
                       if r["body"]["system"][0]["text"].startswith("# Phase 6 of 6"))
    assert "**The runs ended as a negative outcome:** The measurement service refused" in docs_prompt
    assert_usage_is_what_was_billed(ws, api, report)

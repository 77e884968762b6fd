"""The scripted agent: an offline stand-in for demos and tests, never research.

It plays the model's part with a fixed script that performs a tiny but real experiment end
to end: it writes a plan, writes code with a bug, runs an attempt that fails, fixes the bug,
runs one that succeeds, analyses the result and writes REPORT.md and README.md. Its numbers
are real (they come from the tool results it reads); its prose is canned.

Because it goes through the same turn loop, tools and journal as a real model, it is also
the fault injector for tests: `LABRUN_SCRIPTED_FAULTS` names turns at which it raises,
hangs, or hangs inside an experiment attempt, each once per workspace.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from labrun.model import ModelReply, ModelRequest, TransientModelError
from labrun.usage import Usage

HERE = Path(__file__).parent
_docs = Environment(loader=FileSystemLoader(HERE), undefined=StrictUndefined)
BUG = "len(error))"
FIX = "len(errors))"


class ScriptedFault(Exception):
    """Raised on purpose by the scripted agent's fault injection."""


def _text(name: str) -> str:
    return (HERE / name).read_text()


def _call(name: str, **inp: Any) -> tuple[str, dict]:
    return name, inp


def _last_result(messages: list[dict]) -> str:
    """The text of the newest tool result the agent has seen."""
    for m in reversed(messages):
        if m["role"] == "user" and isinstance(m["content"], list):
            for b in reversed(m["content"]):
                if b.get("type") == "tool_result":
                    return b["content"] if isinstance(b["content"], str) else json.dumps(b["content"])
    return ""


def _metrics(messages: list[dict]) -> dict:
    """The JSON object the last tool result printed (the analysis script's summary)."""
    found = re.search(r"^\{.*\}$", _last_result(messages), flags=re.M)
    return json.loads(found.group(0)) if found else {}


def _attempt_metrics(messages: list[dict]) -> str:
    found = re.search(r"^Metrics: (.*)$", _last_result(messages), flags=re.M)
    return found.group(1) if found else "none (the last run_experiment call did not run)"


def _title(system: str) -> str:
    """The idea's title, from the prompt's `**Title:** ...` line (the markup in any form)."""
    found = re.search(r"^\s*(?:\*\*)?Title(?::\*\*|\*\*:|:)\s*(.+)$", system, flags=re.M | re.I)
    return found.group(1).strip() if found else "the idea"


def _attempts(system: str) -> list[tuple[int, str]]:
    """(number, status) of each experiment attempt, from the STATE digest in the prompt."""
    found = re.findall(r"^- #(\d+) \**(FAILED|SUCCESS|INTERRUPTED|RUNNING)\**", system, flags=re.M)
    return [(int(n), status) for n, status in found]


# Each phase is a list of steps; step i answers the agent's (i+1)-th turn in that phase.
Step = Callable[[ModelRequest], list[tuple[str, dict]]]

SCRIPT: dict[str, list[Step]] = {
    "planning": [
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="planning.md",
                         file_text=_docs.get_template("planning.md.j2").render(title=_title(r.system)))],
        lambda r: [_call("complete_phase", summary="Plan written to planning.md.", sections={
            "research_specification": "Question: does the RMSE of a k-sample mean fall as 1/sqrt(k)?\n"
            "Hypothesis: log-log slope -0.5 ± 0.05 for Gaussian and uniform noise.\n"
            "Method: Monte Carlo, k = 1..256, 1000 trials per k, fixed seed; see planning.md."})],
    ],
    "setup": [
        lambda r: [_call("bash", command="python3 --version && mkdir -p src results && ls")],
        lambda r: [_call("complete_phase", summary="Standard-library Python only; folders made.", sections={
            "files_and_resources": "- `planning.md`: the plan\n- `src/`: code\n- `results/`: outputs\n"
            "- No external data or packages: the data are simulated.",
            "workflow": "1. `python3 src/experiment.py --seed 0` → results/metrics.json, results/rmse_by_k.csv\n"
            "2. `python3 src/analyze.py` → results/analysis.md, results/rmse_vs_k.svg"})],
    ],
    "implementation": [
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="src/experiment.py",
                         file_text=_text("experiment.py")),
                   _call("str_replace_based_edit_tool", command="create", path="src/analyze.py",
                         file_text=_text("analyze.py"))],
        lambda r: [_call("complete_phase", summary="Simulation and analysis code written.", sections={
            "experiment_design": "- Baseline: k = 1 and theory sigma/sqrt(k)\n"
            "- Method: mean of k draws, 1000 trials, Gaussian and uniform noise\n"
            "- Metrics: RMSE per k, fitted log-log slope, largest relative gap to theory"})],
    ],
    "experiments": [
        lambda r: [_call("run_experiment", command="python3 src/experiment.py --seed 0",
                         purpose="RMSE per k and the log-log slope, both noises",
                         outputs=["results/metrics.json", "results/rmse_by_k.csv"],
                         metrics_file="results/metrics.json")],
        lambda r: [_call("str_replace_based_edit_tool", command="str_replace", path="src/experiment.py",
                         old_str=BUG, new_str=FIX)],
        lambda r: [_call("run_experiment", command="python3 src/experiment.py --seed 0",
                         purpose="RMSE per k and the log-log slope, both noises",
                         outputs=["results/metrics.json", "results/rmse_by_k.csv"],
                         metrics_file="results/metrics.json",
                         fix_applied="rmse_for divided by len(error), an undefined name; now len(errors)")],
        lambda r: [_call("complete_phase", summary="The last attempt succeeded.", sections={
            "experiment_results": "Metrics of the last attempt: " + _attempt_metrics(r.messages)})],
    ],
    "analysis": [
        lambda r: [_call("bash", command="python3 src/analyze.py")],
        lambda r: [_call("complete_phase", summary="Slopes compared with theory.", sections={
            "learnings": "- Fitted slopes: gaussian {slope_gaussian}, uniform {slope_uniform} "
            "(theory -0.5); within ±0.05: {ok}\n- Largest gap to sigma/sqrt(k): gaussian "
            "{max_rel_gap_gaussian:.1%}, uniform {max_rel_gap_uniform:.1%}\n"
            "- A NameError cost one attempt; attempts record it.".format(
                ok=all(_metrics(r.messages)["slopes_within_tolerance"].values()), **_metrics(r.messages))})],
    ],
    "documentation": [
        lambda r: [_call("bash", command="python3 src/analyze.py")],
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="REPORT.md",
                         file_text=_docs.get_template("report.md.j2").render(
                             title=_title(r.system), metrics=_metrics(r.messages), attempts=_attempts(r.system),
                             supported=all(_metrics(r.messages)["slopes_within_tolerance"].values()))),
                   _call("str_replace_based_edit_tool", command="create", path="README.md",
                         file_text=_docs.get_template("readme.md.j2").render(title=_title(r.system)))],
        lambda r: [_call("complete_phase", summary="REPORT.md and README.md written.")],
    ],
}


def _step(messages: list[dict]) -> int:
    """Which step comes next: a turn whose tool call a crash cut off is done again, as an
    agent would after checking the workspace."""
    done = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        answer = messages[i + 1]["content"] if i + 1 < len(messages) else []
        cut_off = any(b.get("type") == "tool_result" and b.get("is_error") and "cut off" in str(b.get("content"))
                      for b in answer)
        done += not cut_off
    return done


def phase_of(system: str) -> str:
    """The phase key, from the system prompt's first line: `# Phase N of M: key`."""
    found = re.match(r"# Phase \d+ of \d+: (\w+)", system)
    if not found:
        raise ScriptedFault("the system prompt's first line does not name its phase")
    return found.group(1)


class ScriptedModel:
    """Plays the model's part from SCRIPT. Zero cost; tokens are estimated (4 chars each)."""

    name = "scripted"

    def __init__(self, workspace: str | Path | None = None, latency_s: float | None = None):
        self.settings = {"model": "scripted", "script": 1}
        self.latency_s = float(os.environ.get("LABRUN_SCRIPTED_LATENCY_S", "0")) if latency_s is None else latency_s
        self.faults_dir = Path(workspace) / ".labrun" / "faults" if workspace else None
        self.faults = dict(
            (where, kind) for kind, _, where in
            (f.partition("@") for f in os.environ.get("LABRUN_SCRIPTED_FAULTS", "").split(",") if f)
        )

    def complete(self, request: ModelRequest) -> ModelReply:
        phase = phase_of(request.system)
        turn = sum(1 for m in request.messages if m["role"] == "assistant") + 1
        self._inject(phase, turn)
        if self.latency_s:
            time.sleep(self.latency_s)
        steps = SCRIPT[phase]
        calls = steps[min(_step(request.messages), len(steps) - 1)](request)
        content: list[dict] = [{"type": "text", "text": f"[scripted agent] {phase}, step {turn}."}]
        for i, (name, inp) in enumerate(calls):
            if self._fault_for(phase, turn) == "hang-attempt" and name == "run_experiment":
                inp = {**inp, "command": f"mkdir -p .labrun/faults && touch .labrun/faults/{phase}-{turn}.reached && sleep 600 && {inp['command']}"}
            content.append({"type": "tool_use", "id": f"toolu_{phase}_{turn}_{i}", "name": name, "input": inp})
        prompt_chars = len(request.system) + len(json.dumps(request.messages))
        usage = Usage(input_tokens=prompt_chars // 4, output_tokens=len(json.dumps(content)) // 4)
        self._bill(phase, turn, usage)
        return ModelReply(content=content, stop_reason="tool_use", model="scripted", usage=usage)

    def _bill(self, phase: str, turn: int, usage: Usage) -> None:
        """Keep the stand-in provider's own bill, so tests can check labrun's totals against it."""
        if self.faults_dir is None:
            return
        self.faults_dir.mkdir(parents=True, exist_ok=True)
        with open(self.faults_dir / "billed.jsonl", "a") as f:
            f.write(json.dumps({"phase": phase, "turn": turn, **usage.model_dump()}) + "\n")

    # -- fault injection (tests) -----------------------------------------------------------

    def _fault_for(self, phase: str, turn: int) -> str | None:
        return self.faults.get(f"{phase}:{turn}")

    def _inject(self, phase: str, turn: int) -> None:
        kind = self._fault_for(phase, turn)
        if kind is None or self.faults_dir is None or kind == "hang-attempt":
            return
        marker = self.faults_dir / f"{phase}-{turn}.reached"
        if marker.exists():
            return  # each fault fires once per workspace
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        if kind == "raise":
            raise ScriptedFault(f"injected failure at {phase} turn {turn}")
        if kind == "transient":
            raise TransientModelError(f"injected transient error at {phase} turn {turn}", retry_after=0.1)
        if kind == "hang":
            time.sleep(3600)

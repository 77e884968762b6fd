"""A competent stand-in for a model behind the fake Messages API (`fake_messages_api.py`).

`AutoResearcher()` is a callable `f(body) -> reply` for `FakeMessagesAPI(default=...)`. It
reads the phase from the system prompt's first line (`# Phase N of M: key`) and the turn
from the conversation (assistant messages so far, plus one; a turn whose calls an
interruption cut off is done again), and answers with the tool
calls that do that phase's work through labrun's real tools: it writes a plan, makes
folders, writes and smoke-tests a small simulation, runs it with `run_experiment`, reads
its metrics, and writes the report, ending each phase with `complete_phase` and the
sections the phase needs. Like a model, it reads tool results: an experiment cut off by an
interruption is run again, and its reported numbers come from the run's output.

Faults are injected per (phase, turn): `faults={("setup", 2): [{"status": 429, ...}]}`
answers the first request of setup turn 2 with a 429, the next one normally. Usage is left
to the fake server (`cache_accounting=True`).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from fake_messages_api import web_fetch, web_search, web_search_citation

HEADING = re.compile(r"# Phase (\d+) of (\d+): (\w+)")

IDEA = """\
idea:
  title: "Averaging noisy measurements: does RMSE fall as 1/sqrt(k)?"
  domain: data_science
  hypothesis: |
    The RMSE of the mean of k independent noisy measurements falls as 1/sqrt(k):
    the log-log slope of RMSE against k is -0.5 within 0.05.
  methodology:
    approach: "Monte Carlo simulation with a fitted power law"
  constraints:
    compute: cpu_only
    time_limit: 600
    budget: 5
"""
"""The idea the responder's work fits (a small simulation, standard library only)."""

EXPERIMENT = '''"""Monte Carlo check: the RMSE of the mean of k noisy measurements against sigma/sqrt(k)."""
import json
import math
import random
import sys

SIGMA, TRIALS = 0.5, 400
KS = [1, 2, 4, 8, 16, 32, 64]


def rmse(k, rng):
    errors = [sum(rng.gauss(0, SIGMA) for _ in range(k)) / k for _ in range(TRIALS)]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def main():
    smoke = "--smoke" in sys.argv
    rng = random.Random(0)
    ks = KS[:2] if smoke else KS
    rows = [{"k": k, "rmse": rmse(k, rng), "theory": SIGMA / math.sqrt(k)} for k in ks]
    xs = [math.log(r["k"]) for r in rows]
    ys = [math.log(r["rmse"]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    gap = max(abs(r["rmse"] - r["theory"]) / r["theory"] for r in rows)
    metrics = {"slope": round(slope, 4), "max_rel_gap": round(gap, 4), "n_k": len(rows)}
    if smoke:
        print("smoke test ok", json.dumps(metrics))
        return
    with open("results/rmse_by_k.json", "w") as f:
        json.dump(rows, f, indent=1)
    with open("results/metrics.json", "w") as f:
        json.dump(metrics, f)
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
'''

COMMAND = "python3 src/experiment.py"
PLAN = """\
## 1. Motivation and related work
Averaging is the standard way to reduce noise; theory says the RMSE of a mean falls as 1/sqrt(k).

## 2. Hypotheses and variables
The log-log slope of RMSE against k is -0.5 within 0.05; k varies, the RMSE is measured.

## 3. Alternative explanations
Correlated draws or a bug would bend the slope; a fixed seed makes a rerun comparable.

## 4. Design: data, baselines, method, ablations
Monte Carlo with sigma 0.5, k = 1..64, 400 trials per k, seed 0; the baseline is sigma/sqrt(k).

## 5. Metrics and statistical test
The least-squares slope of log RMSE on log k, and the largest relative gap to theory.

## 6. Sample size and power
400 trials per k keep the sampling error of each RMSE near a few percent.

## 7. Run list
R1: RMSE per k and the fitted slope, seed 0, no criteria of the idea to serve.

## 8. Budget and cuts
Seconds of CPU and no money; nothing needs to be cut.

## 9. Risks and fallbacks
A bug in the simulation would show in the attempt's error and be fixed before the next.

## 10. Changes to the idea's method
None: the simulation follows the idea's approach as written.
"""
"""planning.md's sections, as the planning prompt's outline asks."""
SOURCE = "https://example.org/papers/averaging-noise.pdf"
SOURCE_TITLE = "Averaging noisy measurements"
SOURCE_TEXT = "The RMSE of the mean of k independent draws with standard deviation sigma is sigma/sqrt(k)."
PAPER_COMPILE = "latexmk -pdf -interaction=nonstopmode -halt-on-error -file-line-error -cd paper/main.tex"
PAPER_LOOK = ("cat results/metrics.json; echo; cat literature_review.md 2>/dev/null; grep input paper/main.tex; "
              "command -v latexmk pdflatex || echo NO TEX")
RUN = {"id": "R1", "purpose": "RMSE per k and the fitted log-log slope", "conditions": "sigma 0.5, "
       "k = 1..64, 400 trials per k", "seeds": [0], "criteria": []}


def phase_and_turn(body: dict[str, Any]) -> tuple[str, int]:
    system = body.get("system") or ""
    text = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
    found = HEADING.match(text)
    if not found:
        raise ValueError("the system prompt's first line names no phase")
    turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant") + 1
    return found.group(3), turn


def tool_results(body: dict[str, Any]) -> list[str]:
    """The text of every tool result in the conversation, oldest first."""
    found = []
    for m in body.get("messages", []):
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    c = b.get("content")
                    found.append(c if isinstance(c, str) else json.dumps(c))
    return found


def cut_off_turns(body: dict[str, Any]) -> int:
    """Turns whose every tool call an interruption cut off: like a model, the responder does
    such a turn again."""
    count = 0
    messages = body.get("messages", [])
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or i + 1 >= len(messages):
            continue
        answers = [b for b in messages[i + 1].get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_result"]
        count += bool(answers) and all(b.get("is_error") and "cut off" in str(b.get("content")) for b in answers)
    return count


def _title(body: dict[str, Any]) -> str:
    system = body["system"] if isinstance(body["system"], str) else body["system"][0]["text"]
    found = re.search(r"^\*\*Title:\*\*\s*(.+)$", system, flags=re.M)
    return found.group(1).strip() if found else "the idea"


def _call(name: str, **inp: Any) -> tuple[str, dict[str, Any]]:
    return name, inp


class AutoResearcher:
    def __init__(self, faults: dict[tuple[str, int], list[dict]] | None = None,
                 slow_experiment_s: float = 0, fetch_error: str | None = None):
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.slow_experiment_s = slow_experiment_s
        self.fetch_error = fetch_error
        """A web_fetch error code (`url_not_accessible`, ...) the resources phase meets."""
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        phase, turn = phase_and_turn(body)
        with self._lock:
            queue = self.faults.get((phase, turn))
            if queue:
                return queue.pop(0)
        answer = getattr(self, phase)(body, turn - cut_off_turns(body))
        if isinstance(answer, dict):
            return answer  # a reply of the API's own tools, as it comes
        say, calls = answer
        content: list[dict[str, Any]] = [{"type": "text", "text": say}]
        content += [{"type": "tool_use", "id": f"toolu_{phase[:4]}{turn:02d}{i}", "name": name, "input": inp}
                    for i, (name, inp) in enumerate(calls)]
        return {"content": content}

    # -- the optional phases ---------------------------------------------------------------

    def resources(self, body, turn):
        """Turn 1 searches the web, and the API pauses its tool loop; turn 2 (the paused
        turn going on) fetches the paper found and writes the two files; turn 3 completes."""
        if turn == 1:
            return {"content": [{"type": "text", "text": "Searching the literature first."},
                                *web_search("averaging noisy measurements rmse", [(SOURCE, SOURCE_TITLE, SOURCE_TEXT)])],
                    "stop_reason": "pause_turn"}
        if turn == 2:
            fetched = self.fetch_error is None
            review = (f"# Literature review\n\n- {SOURCE_TITLE}. {SOURCE} — "
                      + ("fetched and read: the RMSE of a mean of k draws is sigma/sqrt(k).\n" if fetched
                         else f"found by search; fetching it failed ({self.fetch_error}).\n"))
            catalogue = (f"# Resources\n\n| source | licence |\n|---|---|\n| {SOURCE} | not stated |\n\n"
                         "No datasets: the measurements are simulated.\n")
            write = [{"type": "tool_use", "id": f"toolu_reso02{i}", "name": "str_replace_based_edit_tool",
                      "input": {"command": "create", "path": path, "file_text": text}}
                     for i, (path, text) in enumerate((("literature_review.md", review), ("resources.md", catalogue)))]
            return {"content": [*web_fetch(SOURCE, SOURCE_TEXT, error=self.fetch_error),
                                {"type": "text", "text": "The source says the RMSE falls as 1/sqrt(k).",
                                 "citations": [web_search_citation(SOURCE, SOURCE_TITLE, SOURCE_TEXT[:30])]},
                                *write]}
        summary = f"- {SOURCE_TITLE} ({SOURCE}): RMSE of a k-sample mean is sigma/sqrt(k)."
        if self.fetch_error:
            summary += f"\nNo source could be fetched: web_fetch answered {self.fetch_error} for {SOURCE}."
        return "Recording the sources.", [_call("complete_phase", summary="Literature gathered.",
                                                 sections={"literature": summary})]

    def paper(self, body, turn):
        """Turn 1 looks at what the paper is made from; turn 2 writes it; turn 3 compiles it
        when TeX is here (else completes), turn 4 completes."""
        if turn == 1:
            return "Looking at the results, the sources and the paper's skeleton.", [_call("bash", command=PAPER_LOOK)]
        seen = "\n".join(tool_results(body))
        tex = "NO TEX" not in seen
        if turn == 2:
            metrics = _last_json([seen])
            sections = re.findall(r"input\{sections/(\w+)\}", seen)
            cite = "\\cite{source}" if SOURCE in seen else ""
            text = {name: f"\\section{{{name.replace('_', ' ').capitalize()}}}\nThe fitted slope is "
                          f"${metrics.get('slope')}$, against $-0.5$ in theory {cite}.\n" for name in sections}
            text["abstract"] = f"A simulation of averaging gives a log-log slope of ${metrics.get('slope')}$.\n"
            bib = f"@misc{{source,\n  title = {{{SOURCE_TITLE}}},\n  url = {{{SOURCE}}}\n}}\n" if cite else ""
            calls = [_call("str_replace_based_edit_tool", command="create", path=f"paper/sections/{name}.tex",
                           file_text=text[name]) for name in sections]
            calls.append(_call("str_replace_based_edit_tool", command="create", path="paper/references.bib",
                               file_text=bib))
            return "Writing the paper.", calls
        compiled = any(re.match(r"Attempt \d+: SUCCESS", r) for r in tool_results(body))
        if turn == 3 and tex and not compiled:
            return "Compiling.", [_call("run_experiment", command=PAPER_COMPILE, purpose="compile the paper",
                                        outputs=["paper/main.pdf"])]
        state = "compiled to paper/main.pdf" if tex else "not compiled: no TeX is installed here"
        return "Done.", [_call("complete_phase", summary=f"Paper {state}.",
                               sections={"paper": f"- paper/main.tex, {state}"})]

    # -- the six phases: (what it says, the tool calls) for a turn -------------------------

    def planning(self, body, turn):
        if turn == 1:
            plan = f"# Plan: {_title(body)}\n\n{PLAN}"
            return "I will write the plan first.", [
                _call("str_replace_based_edit_tool", command="create", path="planning.md", file_text=plan)]
        return "The plan is written; completing the phase.", [_call(
            "complete_phase", summary="Plan written to planning.md.", sections={
                "research_specification": "Question: does RMSE of a k-sample mean fall as 1/sqrt(k)?\n"
                "Hypothesis: log-log slope -0.5 +/- 0.05.\nMethod: Monte Carlo, k = 1..64, 400 trials, "
                "seed 0; see planning.md."}, run_list=[RUN], analysis_outputs=["results/rmse_by_k.json"])]

    def setup(self, body, turn):
        if turn == 1:
            return "Checking Python and making the folders.", [
                _call("bash", command="python3 --version && mkdir -p src results && python3 --version | sed 's/^/# /; s/$/: the standard library only, no packages to install/' > requirements.txt && ls")]
        return "The environment is ready.", [_call(
            "complete_phase", summary="Standard-library Python; folders made.", sections={
                "files_and_resources": "- planning.md: the plan\n- src/: code\n- results/: outputs\n"
                "- No external data: the measurements are simulated.",
                "workflow": f"1. `{COMMAND}` -> results/metrics.json, results/rmse_by_k.json"})]

    def implementation(self, body, turn):
        if turn == 1:
            return "Writing the simulation.", [
                _call("str_replace_based_edit_tool", command="create", path="src/experiment.py",
                      file_text=EXPERIMENT)]
        if turn == 2:
            return "A quick smoke test before the real run.", [
                _call("bash", command=f"{COMMAND} --smoke")]
        return "The smoke test passed.", [_call(
            "complete_phase", summary="Simulation written and smoke-tested.", sections={
                "experiment_design": "- Baseline: theory sigma/sqrt(k)\n- Method: mean of k draws, "
                "400 trials per k\n- Metrics: fitted log-log slope, largest relative gap to theory"})]

    def experiments(self, body, turn):
        results = tool_results(body)
        succeeded = [r for r in results if re.match(r"Attempt \d+: SUCCESS", r)]
        if succeeded:
            metrics = re.search(r"^Metrics: (.*)$", succeeded[-1], flags=re.M).group(1)
            attempt = re.match(r"Attempt (\d+)", succeeded[-1]).group(1)
            slope = float(re.search(r"\bslope=(\S+?)(,|$)", metrics).group(1))
            # an attempt an interruption hid from it, which the refusal names: the same run from seed 0
            also = {int(n) for r in results for told in re.findall(r"attempts ([#\d, ]+) also measured slope", r)
                    for n in re.findall(r"#(\d+)", told)}
            return "The run succeeded; recording the results.", [_call(
                "complete_phase", summary=f"Attempt {attempt} succeeded: {metrics}.", sections={
                    "experiment_results": f"Attempt {attempt} (seed 0): {metrics}"},
                claims=[{"id": "K1", "statement": "The fitted log-log slope of RMSE against k", "metric": "slope",
                         "attempts": sorted({int(attempt), *also}), "value": slope}])]
        cut_off = any("cut off" in r for r in results)
        command = COMMAND
        if self.slow_experiment_s and not cut_off:
            command = f"sleep {self.slow_experiment_s:g} && {COMMAND}"
        say = "The last run was cut off; running it again." if cut_off else "Running the experiment."
        return say, [_call("run_experiment", command=command, purpose="RMSE per k and the log-log slope", run_id="R1",
                           outputs=["results/metrics.json", "results/rmse_by_k.json"],
                           metrics_file="results/metrics.json")]

    def analysis(self, body, turn):
        if turn == 1:
            return "Reading the metrics.", [_call("bash", command="cat results/metrics.json")]
        metrics = _last_json(tool_results(body))
        return "Comparing with theory.", [_call(
            "complete_phase", summary="Slope compared with theory.", sections={
                "learnings": f"- Fitted slope {metrics.get('slope')} (theory -0.5)\n"
                f"- Largest gap to sigma/sqrt(k): {metrics.get('max_rel_gap')}"})]

    def documentation(self, body, turn):
        if turn == 1:
            title = _title(body)
            return "Writing the report and the README.", [
                _call("str_replace_based_edit_tool", command="create", path="REPORT.md",
                      file_text=f"# {title}\n\nRun R1 is done; see results/metrics.json for the numbers.\n"),
                _call("str_replace_based_edit_tool", command="create", path="README.md",
                      file_text=f"# {title}\n\nRun `{COMMAND}`.\n")]
        return "Done.", [_call("complete_phase", summary="REPORT.md and README.md written.")]


def _last_json(results: list[str]) -> dict[str, Any]:
    for r in reversed(results):
        found = re.search(r"^\{.*\}$", r, flags=re.M)
        if found:
            return json.loads(found.group(0))
    return {}


TURNS = {"planning": 2, "setup": 2, "implementation": 3, "experiments": 2, "analysis": 2,
         "documentation": 2}
"""Turns each phase takes when nothing goes wrong."""
EXTRA_TURNS = {"resources": 3, "paper": 4}
"""Turns of the optional phases (the paper's: 3 when no TeX is installed)."""

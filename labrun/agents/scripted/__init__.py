"""The scripted agent: an offline stand-in for demos and tests, never research.

It plays the model's part with a fixed script that performs a tiny but real experiment end
to end: it writes a plan, writes code with a bug, runs an attempt that fails, fixes the bug,
runs one that succeeds, analyses the result and writes REPORT.md and README.md. Its numbers
are real (they come from the tool results it reads); its prose is canned.

That experiment is its own demo idea's (`examples/demo_noise_averaging.yaml`, known by its
title). On any other idea it runs the same simulation to exercise the pipeline, and says so:
its run list serves the idea's own criteria, its verdicts are all "unmet: not evaluated by
the offline stand-in", and REPORT.md opens by saying that no research was done.

Because it goes through the same turn loop, tools and journal as a real model, it is also
the fault injector for tests: `LABRUN_SCRIPTED_FAULTS` names turns at which it raises,
hangs, or hangs or lingers inside an experiment attempt (`ATTEMPT_FAULTS`), each once per workspace,
or makes the engine's rerun of an attempt hang (`hang-rerun`, while `RERUN_HANGS` is in the environment).
`background-attempt` is no fault but a way of working: that turn's attempt lingers as
`slow-attempt`'s does and runs in the background, and the agent follows it with
`experiment_output` until it ends (`_following`), then goes on with the script.
"""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from labrun.crashpoints import crashpoint
from labrun.model import ModelReply, ModelRequest, TransientModelError
from labrun.plan import seeds_asked
from labrun.settings import settings
from labrun.usage import Usage
from labrun.workspace import Workspace

HERE = Path(__file__).parent
_docs = Environment(loader=FileSystemLoader(HERE), undefined=StrictUndefined)
BUG = "len(error))"
FIX = "len(errors))"
LITERATURE_MARKER = "No source could be fetched:"
PAPER_COMPILE = "latexmk -pdf -interaction=nonstopmode -halt-on-error -file-line-error -cd paper/main.tex"
# What the paper is written from, printed in one look: metrics, the table, the source the
# resources phase fetched, the sections and bibliography style of main.tex, and whether TeX
# is here.
PAPER_LOOK = """python3 - <<'EOF'
import json, pathlib, re, shutil
print("METRICS " + json.dumps(json.load(open("results/metrics.json"))))
print("ROWS\\n" + open("results/rmse_by_k.csv").read().strip() + "\\nEND ROWS")
review = pathlib.Path("literature_review.md")
for url in re.findall(r"^- (https?://\\S+) — fetched", review.read_text() if review.exists() else "", re.M)[:1]:
    print("SOURCE " + url)
main = open("paper/main.tex").read()
for name in re.findall(r"\\\\input\\{sections/(\\w+)\\}", main):
    print("SECTION " + name)
for style in re.findall(r"\\\\bibliographystyle\\{(\\w+)\\}", main):
    print("BIBSTYLE " + style)
print("TEX " + (shutil.which("latexmk") if shutil.which("latexmk") and shutil.which("pdflatex") else "NONE"))
EOF"""


RERUN_HANGS = "SCRIPTED_RERUN_HANGS"
"""Set in the environment, the engine's rerun of an attempt asked with a `hang-rerun` fault sleeps."""
DEMO_TITLE = "Averaging noisy measurements: does RMSE fall as 1/sqrt(k)?"
NOT_EVALUATED = "not evaluated by the offline stand-in"


class ScriptedFault(Exception):
    """Raised on purpose by the scripted agent's fault injection."""


def _text(name: str) -> str:
    return (HERE / name).read_text()


def _call(name: str, **inp: Any) -> tuple[str, dict]:
    return name, inp


def _last_result(messages: list[dict]) -> str:
    """The text of the newest tool result the agent has seen (a call that an interruption
    cut off has none: it is skipped)."""
    for m in reversed(messages):
        if m["role"] == "user" and isinstance(m["content"], list):
            for b in reversed(m["content"]):
                if b.get("type") == "tool_result" and not b.get("is_error"):
                    return b["content"] if isinstance(b["content"], str) else json.dumps(b["content"])
    return ""


def _metrics(messages: list[dict]) -> dict:
    """The JSON object the last tool result printed (the analysis script's summary)."""
    found = re.search(r"^\{.*\}$", _last_result(messages), flags=re.M)
    return json.loads(found.group(0)) if found else {}


def _attempt_metrics(messages: list[dict]) -> str:
    found = re.search(r"^Metrics: (.*)$", _last_result(messages), flags=re.M)
    return found.group(1) if found else "none (the last run_experiment call did not run)"


def _results(messages: list[dict]) -> list[str]:
    """The text of every tool result the agent has seen, oldest first."""
    return [b["content"] if isinstance(b["content"], str) else json.dumps(b["content"])
            for m in messages if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]


def _idea_url(system: str) -> str | None:
    """The first address the idea itself gives (its background's references)."""
    idea = system.partition("## The research idea")[2]
    found = re.search(r"https?://[^\s;,)]+", idea)
    return found.group(0) if found else None


def _source(system: str) -> tuple[str, bool]:
    """What the resources phase fetches: the idea's first reference, else an arXiv search
    for its title (True: a search)."""
    url = _idea_url(system)
    if url is not None:
        return url, False
    words = "+".join(re.findall(r"[A-Za-z0-9]+", _title(system))[:8])
    return f"https://export.arxiv.org/api/query?search_query=ti:{words}&max_results=5", True


def _fetch_outcome(r: ModelRequest) -> dict:
    """What the resources phase's download gave: the address, and whether it came."""
    url, search = _source(r.system)
    path = "papers/arxiv-search.xml" if search else "papers/source-1.pdf"
    result = next((t for t in _results(r.messages) if path in t or "[exit code:" in t), "[exit code: none]")
    failed = "[exit code:" in result
    size = re.search(rf"^(\d+) {re.escape(path)}", result, flags=re.M)
    return {"title": _title(r.system), "url": url, "search": search, "fetched": not failed, "path": path,
            "size": size.group(1) if size else "?", "error": result.strip().splitlines()[0] if failed else ""}


def _resources_section(r: ModelRequest) -> str:
    outcome = _fetch_outcome(r)
    what = "an arXiv search for the idea's title" if outcome["search"] else "the idea's reference"
    if outcome["fetched"]:
        return (f"- Fetched {what}, {outcome['url']}, to {outcome['path']} (not read).\n"
                "- No datasets: the measurements are simulated. No code to reuse.")
    return f"- Nothing gathered.\n{LITERATURE_MARKER} the fetch of {what} {outcome['url']} failed ({outcome['error']})."


def _fetch(r: ModelRequest) -> list[tuple[str, dict]]:
    outcome = _fetch_outcome(r)
    return [_call("bash", command=f"mkdir -p papers datasets code && curl -fsSL -m 20 -o {outcome['path']} "
                                  f"'{outcome['url']}' && wc -c {outcome['path']}")]


def _paper_context(r: ModelRequest) -> dict:
    """What the paper's text is made from: step 1's printout of the results and sources."""
    seen = "\n".join(_results(r.messages))
    metrics = json.loads(re.search(r"^METRICS (.*)$", seen, flags=re.M).group(1))
    rows = list(csv.DictReader(seen.partition("ROWS\n")[2].partition("\nEND ROWS")[0].splitlines()))
    url = next(iter(re.findall(r"^SOURCE (https?://\S+)$", seen, flags=re.M)), None)
    return {"title": _title(r.system), "metrics": metrics, "rows": rows, "url": url,
            "cite": "source1" if url else None, "tex": "TEX NONE" not in seen,
            "sections": re.findall(r"^SECTION (\w+)$", seen, flags=re.M),
            "bib_style": next(iter(re.findall(r"^BIBSTYLE (\w+)$", seen, flags=re.M)), "plainnat"),
            "supported": all(metrics["slopes_within_tolerance"].values()) if "slopes_within_tolerance" in metrics
            else all(abs(metrics[k] + 0.5) <= 0.05 for k in ("slope_gaussian", "slope_uniform"))}


def _write_paper(r: ModelRequest) -> list[tuple[str, dict]]:
    c = _paper_context(r)
    paper = _docs.get_template("paper.tex.j2")
    calls = []
    for name in c["sections"]:
        block = paper.blocks.get(name, paper.blocks["other"])
        broken = c["tex"] and "results" in c["sections"]  # an error for the first compile to find
        text = "".join(block(paper.new_context({**c, "name": name, "broken": broken}))).strip() + "\n"
        calls.append(_call("str_replace_based_edit_tool", command="create", path=f"paper/sections/{name}.tex",
                           file_text=text))
    bib = ("@misc{source1,\n  title = {The reference the idea names},\n"
           "  note = {Fetched by labrun's scripted agent, not read},\n"
           "  url = {" + c["url"] + "}\n}\n") if c["url"] else ""
    calls.append(_call("str_replace_based_edit_tool", command="create", path="paper/references.bib", file_text=bib))
    if not c["url"]:  # nothing to cite: BibTeX would stop on an empty bibliography
        calls.append(_call("str_replace_based_edit_tool", command="str_replace", path="paper/main.tex",
                           old_str=f"\\bibliographystyle{{{c['bib_style']}}}\n\\bibliography{{references}}\n",
                           new_str=""))
    return calls


def _compile_or_finish(r: ModelRequest) -> list[tuple[str, dict]]:
    if _paper_context(r)["tex"]:
        return [_call("run_experiment", command=PAPER_COMPILE, purpose="compile the paper",
                      outputs=["paper/main.pdf"])]
    return [_finish_paper(r)]


def _finish_paper(r: ModelRequest) -> tuple[str, dict]:
    c = _paper_context(r)
    compiled = ("compiled to paper/main.pdf with latexmk" if c["tex"]
                else "not compiled: no TeX is installed here (no latexmk and pdflatex on the PATH)")
    return _call("complete_phase", summary=f"Paper written in paper/, {compiled}.", sections={
        "paper": f"- Title: {c['title']}\n- Main file: paper/main.tex; {compiled}\n"
                 "- Written by the scripted agent (an offline stand-in): it restates the simulation's numbers."})


def _attempts_of_r1(messages: list[dict]) -> str:
    found = []
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], list):
            for b in m["content"]:
                text = b.get("content") if b.get("type") == "tool_result" else None
                head = re.match(r"Attempt (\d+): (\w+)", text) if isinstance(text, str) else None
                if head and head.group(2) != "RUNNING":  # a background attempt is told once it ended
                    found.append(f"#{head.group(1)} {head.group(2)}")
    return ", ".join(found)


def _r1_metrics(r: ModelRequest) -> tuple[list[int], dict[str, float]] | None:
    """The successful attempts of R1 in this phase and the mean of each metric over them (a
    claim cites every one: a resumed or rerun phase may have run R1 more than once)."""
    runs = []
    for text in _results(r.messages):
        head = re.match(r"Attempt (\d+): SUCCESS", text)
        found = re.search(r"^Metrics: (.*)$", text, flags=re.M)
        if head and found and re.search(r"^Run: R1\b", text, flags=re.M):
            pairs = dict(pair.split("=", 1) for pair in found.group(1).split(", ") if "=" in pair)
            try:
                runs.append((int(head.group(1)), {k: float(v) for k, v in pairs.items()}))
            except ValueError:
                continue
    if not runs:
        return None
    names = set.intersection(*(set(m) for _, m in runs))
    # an attempt an interruption hid from it, which a refusal names: the same command, seed 0
    hidden = {int(n) for text in _results(r.messages) for told in re.findall(r"attempts ([#\d, ]+) also measured", text)
              for n in re.findall(r"#(\d+)", told)}
    return sorted({n for n, _ in runs} | hidden), {k: round(sum(m[k] for _, m in runs) / len(runs), 6) for k in names}


CHECKS = [{"id": "C1", "metric": "max_abs_slope_error", "comparison": "<=", "threshold": 0.05},
          {"id": "C2", "metric": "max_rel_gap", "comparison": "<=", "threshold": 0.10}]
"""The demo's criteria that one number decides, for the engine to judge (planning's criterion_checks)."""


def _verdicts(r: ModelRequest) -> list[dict]:
    """The demo idea's three criteria judged from R1's last attempt and its metrics, as the
    planned checks judge them; on another idea, every criterion unmet: none was tested."""
    if not _is_demo(r.system):
        return [{"id": c, "status": "unmet", "note": NOT_EVALUATED} for c in _criteria_ids(r.system)]
    found = _r1_metrics(r)
    if found is None or "max_abs_slope_error" not in found[1]:
        return [{"id": c, "status": "unmet", "note": "R1 gave no metrics"} for c in ("C1", "C2", "C3")]
    ns, m = found
    n = ns[-1]
    return [
        {"id": "C1", "status": "met" if m["max_abs_slope_error"] <= 0.05 else "unmet",
         "note": f"K1: R1, attempt #{n}: the slopes are {m['slope_gaussian']} and {m['slope_uniform']}, "
                 f"at most {m['max_abs_slope_error']} from -0.5"},
        {"id": "C2", "status": "met" if m["max_rel_gap"] <= 0.10 else "unmet",
         "note": f"K2: R1, attempt #{n}: the largest relative gap to sigma/sqrt(k) is {m['max_rel_gap']}"},
        {"id": "C3", "status": "met",
         "note": f"K3: R1, attempt #{n}: run twice from seed 0, it wrote the same table both times (`cmp` found "
                 "no difference, else the attempt would have failed); the engine reruns it too"},
    ]


def _claims(r: ModelRequest) -> list[dict]:
    """The key results, each with the record it comes from: on the demo one per criterion, on
    another idea the stand-in's own slope (it bears on none of the idea's criteria)."""
    found = _r1_metrics(r)
    if found is None:
        return []
    ns, m = found
    slope = {"id": "K3" if _is_demo(r.system) else "K1", "metric": "slope_gaussian", "attempts": ns,
             "value": m["slope_gaussian"], "statement": "The fitted log-log slope for Gaussian noise"
             + (", the same when run again from seed 0" if _is_demo(r.system) else
                " in the stand-in's own simulation (it does not test this idea)")}
    if not _is_demo(r.system):
        return [slope]
    return [{"id": "K1", "criterion": "C1", "metric": "max_abs_slope_error", "attempts": ns,
             "value": m["max_abs_slope_error"], "statement": "Both fitted slopes lie this close to -0.5 at most"},
            {"id": "K2", "criterion": "C2", "metric": "max_rel_gap", "attempts": ns, "value": m["max_rel_gap"],
             "statement": "The largest relative gap between the measured RMSE and sigma/sqrt(k), over k and noise"},
            {**slope, "criterion": "C3"}]


def _judged(system: str) -> list[tuple[str, str, str]]:
    """The criteria verdicts the digest shows: (id and text, verdict, note)."""
    return re.findall(r"^- (C\d+: .+?) — \*\*(met|unmet)\*\*: (.+)$", system, flags=re.M)


def _code_references(system: str) -> list[str]:
    """The repositories the setup prompt asks to clone (`code_references.md.j2`'s list)."""
    listed = system.partition("The idea names code to build on.")[2].partition("\n## ")[0]
    return re.findall(r"^- `([^`]+)`", listed, flags=re.M)


def _is_demo(system: str) -> bool:
    return _title(system) == DEMO_TITLE


def _criteria_ids(system: str) -> list[str]:
    """The idea's evaluation criteria, as the prompt numbers them (C1, C2, …)."""
    return list(dict.fromkeys(re.findall(r"^- (C\d+): ", system, flags=re.M)))


def _seeds(system: str) -> list[int]:
    """Seed 0, or as many seeds as the idea asks for (`3 seeds`, `three runs with different seeds`)."""
    return list(range(max(1, seeds_asked(system.partition("## The research idea")[2] or system))))


def _run(system: str) -> dict:
    """The one planned run: the demo's, or on another idea the same simulation, saying what it is."""
    if _is_demo(system):
        return RUN
    return {**RUN, "purpose": "exercise labrun's pipeline offline with the stand-in's own averaging simulation; "
            "it does not test this idea", "seeds": _seeds(system), "criteria": _criteria_ids(system)}


def _attempt(system: str) -> dict:
    """R1's run_experiment call: seed 0 twice (the reproduction check), and each further seed the plan names."""
    planned = re.search(r"^- \*\*R1\*\* .*; seeds ([\d, ]+); serves", system, flags=re.M)
    more = [s for s in dict.fromkeys(int(n) for n in re.findall(r"\d+", planned.group(1) if planned else "")) if s]
    return {**ATTEMPT, "command": COMMAND + "".join(f" && python3 src/experiment.py --seed {s} --out results/seed-{s}"
                                                   for s in more),
            "outputs": [*ATTEMPT["outputs"], *(f"results/seed-{s}/metrics.json" for s in more)]}


def _title(system: str) -> str:
    """The idea's title, from the prompt's `**Title:** ...` line (the markup in any form)."""
    found = re.search(r"^\s*(?:\*\*)?Title(?::\*\*|\*\*:|:)\s*(.+)$", system, flags=re.M | re.I)
    return found.group(1).strip() if found else "the idea"


SPEC_ELSEWHERE = ("No research on this idea is planned: labrun's scripted agent, an offline stand-in, runs "
                  "its own averaging simulation to exercise the pipeline and judges none of the idea's criteria.\n")
RUN = {"id": "R1", "purpose": "RMSE per k and the log-log slope for both noises, run twice from "
       "seed 0 to check that the table reproduces", "conditions": "mean of k draws around a true value of 1.0, "
       "k = 1..256, 1000 trials per k, Gaussian and uniform noise of sigma 0.5; the slope passes within -0.5 ± 0.05", "seeds": [0],
       "criteria": ["C1", "C2", "C3"]}
SLOW_ATTEMPT_STARTS = "attempt-starts.txt"
SLOW_ATTEMPT_S = 4
ANALYSIS_OUTPUTS = ("results/analysis.md", "results/rmse_vs_k.svg")
COMMAND = ("python3 src/experiment.py --seed 0 && python3 src/experiment.py --seed 0 --out results/rerun"
           " && cmp results/rmse_by_k.csv results/rerun/rmse_by_k.csv")
ATTEMPT = {"command": COMMAND, "run_id": "R1", "purpose": "RMSE per k and the log-log slope, both noises, twice",
           "outputs": ["results/metrics.json", "results/rmse_by_k.csv", "results/rerun/rmse_by_k.csv"],
           "metrics_file": "results/metrics.json"}


def _attempts(system: str) -> list[tuple[int, str]]:
    """(number, status) of each attempt of run R1 (its simulation, not the analysis's), from
    the STATE digest in the prompt."""
    found = re.findall(r"^- #(\d+) \**(FAILED|SUCCESS|INTERRUPTED|RUNNING)\**[^`\n]*`(?:[^`\n]*&& )?python3 src/experiment\.py",
                       system, flags=re.M)
    return [(int(n), status) for n, status in found]


# Each phase is a list of steps; step i answers the agent's (i+1)-th turn in that phase.
Step = Callable[[ModelRequest], list[tuple[str, dict]]]

SCRIPT: dict[str, list[Step]] = {
    "planning": [
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="planning.md",
                         file_text=_docs.get_template("planning.md.j2").render(
                             title=_title(r.system), demo=_is_demo(r.system), run=_run(r.system)))],
        lambda r: [_call("complete_phase", summary="Plan written to planning.md.", sections={
            "research_specification": ("" if _is_demo(r.system) else SPEC_ELSEWHERE)
            + "Question: does the RMSE of a k-sample mean fall as 1/sqrt(k)?\n"
            "Hypothesis: log-log slope -0.5 ± 0.05 for Gaussian and uniform noise.\n"
            "Method: Monte Carlo, k = 1..256, 1000 trials per k, fixed seed; see planning.md."},
            run_list=[_run(r.system)], analysis_outputs=list(ANALYSIS_OUTPUTS),
            **({"criterion_checks": CHECKS} if _is_demo(r.system) else {}))],
    ],
    "setup": [
        lambda r: [_call("bash", command="python3 --version && mkdir -p src results && python3 --version | sed 's/^/# /; s/$/: the standard library only, no packages to install/' > requirements.txt && ls")],
        lambda r: [_call("complete_phase", summary="Standard-library Python only; folders made.", sections={
            "files_and_resources": "- `planning.md`: the plan\n- `src/`: code\n- `results/`: outputs\n"
            "- No external data or packages: the data are simulated." + "".join(
                f"\n- Code reference {repo}: not cloned; the scripted agent works offline and simulates its data"
                for repo in _code_references(r.system)),
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
        lambda r: [_call("run_experiment", **_attempt(r.system))],
        lambda r: [_call("str_replace_based_edit_tool", command="str_replace", path="src/experiment.py",
                         old_str=BUG, new_str=FIX)],
        lambda r: [_call("run_experiment", **_attempt(r.system),
                         fix_applied="rmse_for divided by len(error), an undefined name; now len(errors)")],
        lambda r: [_call("complete_phase", summary="Run R1 succeeded.", criteria=_verdicts(r), claims=_claims(r),
                         sections={
            "experiment_results": "| run | attempts | metrics |\n|---|---|---|\n"
            f"| R1 | {_attempts_of_r1(r.messages)} | {_attempt_metrics(r.messages)} |\n\n"
            "The second run from seed 0 wrote the same table byte for byte (`cmp` found no difference)."})],
    ],
    "analysis": [
        lambda r: [_call("run_experiment", command="python3 src/analyze.py", purpose="slopes against theory, "
                         "gaps per k, and the log-log plot", outputs=list(ANALYSIS_OUTPUTS))],
        lambda r: [_call("complete_phase", summary="Slopes compared with theory.", sections={
            "learnings": "- Fitted slopes: gaussian {slope_gaussian}, uniform {slope_uniform} "
            "(theory -0.5); within ±0.05: {ok}\n- Largest gap to sigma/sqrt(k): gaussian "
            "{max_rel_gap_gaussian:.1%}, uniform {max_rel_gap_uniform:.1%}\n"
            "- A NameError cost one attempt; attempts record it.".format(
                ok=all(_metrics(r.messages)["slopes_within_tolerance"].values()), **_metrics(r.messages))})],
    ],
    "resources": [
        _fetch,
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="literature_review.md",
                         file_text=_docs.get_template("literature_review.md.j2").render(**_fetch_outcome(r))),
                   _call("str_replace_based_edit_tool", command="create", path="resources.md",
                         file_text=_docs.get_template("resources.md.j2").render(**_fetch_outcome(r)))],
        lambda r: [_call("complete_phase", summary="Sources recorded in literature_review.md and resources.md.",
                         sections={"literature": _resources_section(r)})],
    ],
    "documentation": [
        lambda r: [_call("bash", command="python3 src/analyze.py")],
        lambda r: [_call("str_replace_based_edit_tool", command="create", path="REPORT.md",
                         file_text=_docs.get_template("report.md.j2").render(
                             title=_title(r.system), demo=_is_demo(r.system),
                             metrics=_metrics(r.messages), attempts=_attempts(r.system),
                             supported=all(_metrics(r.messages)["slopes_within_tolerance"].values()),
                             criteria=_judged(r.system))),
                   _call("str_replace_based_edit_tool", command="create", path="README.md",
                         file_text=_docs.get_template("readme.md.j2").render(title=_title(r.system)))],
        lambda r: [_call("complete_phase", summary="REPORT.md and README.md written.")],
    ],
    "paper": [
        lambda r: [_call("bash", command=PAPER_LOOK)],
        _write_paper,
        _compile_or_finish,
        lambda r: [_call("str_replace_based_edit_tool", command="str_replace", path="paper/sections/results.tex",
                         old_str="\\slopetable\n", new_str="")],
        lambda r: [_call("run_experiment", command=PAPER_COMPILE, purpose="compile the paper",
                         outputs=["paper/main.pdf"],
                         fix_applied="results.tex used \\slopetable, a macro defined nowhere; removed it")],
        lambda r: [_finish_paper(r)],
    ],
}


def _step(messages: list[dict]) -> int:
    """Which step comes next: a turn whose tool call a crash cut off, or whose attempt was
    INTERRUPTED, is done again, as an agent would after checking the workspace. A turn that
    only followed a background attempt is no step; one that found it INTERRUPTED makes the
    step that started it be done again."""
    done = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        answer = messages[i + 1]["content"] if i + 1 < len(messages) else []
        calls = [b["name"] for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"] \
            if isinstance(m["content"], list) else []
        if calls and set(calls) == {"experiment_output"}:
            done -= any(b.get("type") == "tool_result" and re.match(r"Attempt \d+: INTERRUPTED", str(b.get("content")))
                        for b in answer)
            continue
        cut_off = any(b.get("type") == "tool_result" and ((b.get("is_error") and "cut off" in str(b.get("content")))
                                                          or re.match(r"Attempt \d+: INTERRUPTED", str(b.get("content"))))
                      for b in answer)
        done += not cut_off
    return done


def _following(messages: list[dict]) -> int | None:
    """The background attempt this phase's agent still follows: the newest one whose last word
    in the tool results (a report's first line, or the notice that it ended) is RUNNING."""
    last: dict[int, str] = {}
    for text in _results(messages):
        if head := re.match(r"Attempt (\d+): (\w+)", text):
            last[int(head.group(1))] = head.group(2)
        for n, status in re.findall(r"\[attempt (\d+), run in the background, ended: (\w+)", text):
            last[int(n)] = status
    running = [n for n, status in last.items() if status == "RUNNING"]
    return running[-1] if running else None


def phase_of(system: str) -> str:
    """The phase key, from the system prompt's first line: `# Phase N of M: key`."""
    found = re.match(r"# Phase \d+ of \d+: (\w+)", system)
    if not found:
        raise ScriptedFault("the system prompt's first line does not name its phase")
    return found.group(1)


def make(model: str | None, workspace: str | Path | None) -> ScriptedModel:
    """The registry's factory: the scripted agent plays no model, so `model` is not used."""
    return ScriptedModel(workspace)


ATTEMPT_FAULTS = {"hang-attempt": "sleep 600",
                  "slow-attempt": f"echo started >> {SLOW_ATTEMPT_STARTS} && sleep {SLOW_ATTEMPT_S}"}
"""Faults inside an attempt, put before its command: one that hangs, and one that runs a few
seconds longer, noting each start of its command in a file of the workspace's."""
BACKGROUND = "background-attempt"
"""That turn's attempt is `slow-attempt`'s, run in the background and followed."""
FOLLOW_WAIT_S = 1
"""What the agent's `experiment_output` calls wait: short, so that it follows the attempt over
several turns (each one a moment for a test to kill the engine in)."""


class ScriptedModel:
    """Plays the model's part from SCRIPT. Zero cost; tokens are estimated (4 chars each)."""

    name = "scripted"

    def __init__(self, workspace: str | Path | None = None, latency_s: float | None = None):
        self.latency_s = settings().scripted_latency_s if latency_s is None else latency_s
        self.faults_dir = Workspace(workspace).faults if workspace else None
        self.faults = dict(
            (where, kind) for kind, _, where in
            (f.partition("@") for f in settings().scripted_faults.split(",") if f)
        )

    def complete(self, request: ModelRequest) -> ModelReply:
        phase = phase_of(request.system)
        turn = sum(1 for m in request.messages if m["role"] == "assistant") + 1
        if self.latency_s:  # before a fault too: a provider's error comes after some time
            time.sleep(self.latency_s)
        self._inject(phase, turn)
        steps = SCRIPT[phase]
        following = _following(request.messages)
        if following is not None:
            calls = [_call("experiment_output", attempt=following, wait_s=FOLLOW_WAIT_S)]
        else:
            calls = steps[min(_step(request.messages), len(steps) - 1)](request)
        content: list[dict] = [{"type": "text", "text": f"[scripted agent] {phase}, step {turn}."}]
        for i, (name, inp) in enumerate(calls):
            fault = self._fault_for(phase, turn)
            if (fault in ATTEMPT_FAULTS or fault == BACKGROUND) and name == "run_experiment" and self.faults_dir:
                # The engine marks the fault reached (the command cannot write .labrun/).
                self.faults_dir.mkdir(parents=True, exist_ok=True)
                (self.faults_dir / f"{phase}-{turn}.reached").touch()
                lingers = ATTEMPT_FAULTS.get(fault, ATTEMPT_FAULTS["slow-attempt"])
                inp = {**inp, "command": f"{lingers} && {inp['command']}", **({"run_in_background": True}
                                                                              if fault == BACKGROUND else {})}
            elif fault == "hang-rerun" and name == "run_experiment":
                # Only the engine's rerun sleeps (its copy of the workspace has no state.json
                # in .labrun/), and only while RERUN_HANGS is set: the rerun a resume does finishes.
                inp = {**inp, "command": f'{{ [ -e .labrun/state.json ] || [ -z "${{{RERUN_HANGS}:-}}" ] || sleep 600; }} '
                                         f"&& {inp['command']}"}
            content.append({"type": "tool_use", "id": f"toolu_{phase}_{turn}_{i}", "name": name, "input": inp})
        prompt_chars = len(request.system) + len(json.dumps(request.messages))
        usage = Usage(input_tokens=prompt_chars // 4, output_tokens=len(json.dumps(content)) // 4)
        crashpoint("model-call")  # inside the call, before the stand-in provider bills it
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
        if kind is None or self.faults_dir is None or kind in (*ATTEMPT_FAULTS, "hang-rerun", BACKGROUND):
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

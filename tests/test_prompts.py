"""The prompts: each phase sees its own instructions and no other phase's (docs/design.md, "The phase registry")."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import yaml

from support import NEURICO_IDEAS, needs_shared
from labrun import prompts
from labrun.phase_registry import BY_KEY, PHASES, Files, PlannedRunsDone, SuccessfulAttempt

KEYS = [p.key for p in PHASES]


def files_of(phase) -> list[str]:
    return [f for r in phase.done_when if isinstance(r, Files) for f in r.paths]
TEMPLATES = Path(prompts.__file__).resolve().parents[1] / "templates"
IDEAS = NEURICO_IDEAS
IDEA_FILES = [
    "ai_agent_tool_use.yaml",
    "math_example.yaml",
    "ml_regularization_test.yaml",
    "titanic_survival_prediction.yaml",
    "ai_chain_of_thought_evaluation.yaml",
]
DOMAINS = sorted(p.name for p in (TEMPLATES / "domains").iterdir() if p.is_dir())

# An idea whose own text uses no phase key, so any key found in a prompt came from a template.
NEUTRAL_IDEA = {
    "title": "Effect of widget size on gadget throughput",
    "domain": "general",
    "hypothesis": "Larger widgets raise gadget throughput by at least ten percent.",
    "background": {"description": "Widgets vary in size.", "papers": [
        {"url": "https://example.org/w", "description": "Widgets, a survey"}]},
    "methodology": {"approach": "Controlled comparison", "steps": ["Measure", "Compare"],
                    "baselines": ["Small widgets"], "metrics": ["Throughput"]},
    "constraints": {"compute": "cpu_only", "time_limit": 3600, "memory": "4GB",
                    "budget": 50, "dependencies": ["numpy"]},
    "expected_outputs": [{"type": "metrics", "format": "json", "fields": ["throughput"]}],
    "evaluation_criteria": ["Throughput measured over 3 runs"],
    "metadata": {"author": "tester", "notes": "Keep it small."},
}


CLOCK = {"elapsed_s": 1500, "time_limit_s": 3600, "agent_spent_usd": 1.5, "agent_budget_usd": 10,
         "agent_budget_from": "--budget-usd", "experiments_spent_usd": 2.0, "experiments_reporting": 1,
         "experiments_budget_usd": 50, "attempts": 3, "succeeded": 1, "failed": 1}


def load_idea(name: str) -> dict:
    return yaml.safe_load((IDEAS / name).read_text())["idea"]


def other_keys_in(text: str, key: str) -> set[str]:
    """Phase keys other than `key` that occur in `text` as words, in any case."""
    return {k for k in KEYS if k != key and re.search(rf"\b{k}\b", text, re.IGNORECASE)}


def template_lines(path: Path, *, block: str | None = None) -> list[str]:
    """The plain-text lines of a template (no Jinja), list markers stripped, long enough
    to be distinctive."""
    text = re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.S)
    if block:
        text = text.split(f"{{% block {block} %}}", 1)[1].split("{% endblock %}", 1)[0]
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:-|\d+\.)\s+", "", line).strip()
        if len(line) >= 30 and "{{" not in line and "{%" not in line and "{#" not in line:
            lines.append(line)
    return lines


def distinctive_lines(key: str) -> list[str]:
    """Lines of phase `key`'s instructions found in no other phase's template."""
    others = {
        line
        for k in KEYS if k != key
        for line in template_lines(TEMPLATES / "phases" / f"{k}.md.j2", block="instructions")
    }
    mine = template_lines(TEMPLATES / "phases" / f"{key}.md.j2", block="instructions")
    return [line for line in mine if line not in others]


def completion_rule(prompt: str) -> str:
    match = re.search(r"\*\*Completion rule:\*\*(.+?)(?:\n\n|\Z)", prompt, re.S)
    assert match, "the prompt states no completion rule"
    return " ".join(match.group(1).split())


def neutral_state() -> NS:
    return NS(
        title="Widget study",
        sections={
            "research_specification": "Question: do larger widgets help?",
            "files_and_resources": "- data/widgets.csv (120 rows)",
            "learnings": "Small widgets were never slower.",
        },
        attempts=[
            NS(n=1, phase="experiments", status="FAILED", command="python src/run.py --size 3",
               purpose="measure large widgets", exit_code=1,
               error="ZeroDivisionError: division by zero", fix_applied=None,
               metrics={}, outputs=["results/large/metrics.json"]),
            NS(n=2, phase="experiments", status="SUCCESS", command="python src/run.py --size 3",
               purpose="measure large widgets", exit_code=0, error=None,
               fix_applied="guard against empty batches in src/run.py",
               metrics={"throughput": 41.5}, outputs=["results/large/metrics.json"]),
            NS(n=3, phase="experiments", status="INTERRUPTED", command="python src/run.py --size 1",
               purpose="measure small widgets", exit_code=None, error=None, fix_applied=None,
               metrics={}, outputs=[]),
        ],
        phases={k: NS(status="DONE" if n < 4 else "pending")
                for n, k in enumerate(KEYS, 1)},
    )


# -- the helpers themselves must be able to fail ------------------------------------------

def test_key_check_flags_other_phase_keys():
    assert other_keys_in("Now start the Analysis of results", "planning") == {"analysis"}
    assert other_keys_in("see planning.md", "setup") == {"planning"}
    assert other_keys_in("experimental work, set up the code", "planning") == set()


def test_every_phase_has_distinctive_instructions():
    for key in KEYS:
        assert len(distinctive_lines(key)) >= 10, key


# -- the system prompt ----------------------------------------------------------------------

@needs_shared()
@pytest.mark.parametrize("idea_file", IDEA_FILES)
@pytest.mark.parametrize("key", KEYS)
def test_system_prompt_holds_its_phase_only(key, idea_file):
    idea = load_idea(idea_file)
    domain = idea["domain"]
    prompt = prompts.system_prompt(key, idea, domain, prompts.digest(neutral_state()))
    first = prompt.splitlines()[0]
    assert first == f"# Phase {KEYS.index(key) + 1} of 6: {key}"
    assert other_keys_in(first, key) == set()

    for line in distinctive_lines(key):
        assert line in prompt, f"{key}: own instruction missing: {line!r}"
    for other in KEYS:
        if other == key:
            continue
        for line in distinctive_lines(other):
            assert line not in prompt, f"{key} prompt holds {other}'s instruction: {line!r}"

    used = prompts.guidance_domain(domain)
    for line in template_lines(TEMPLATES / "domains" / used / f"{key}.md.j2"):
        assert line in prompt, f"{key}: domain guidance missing: {line!r}"
    for other in KEYS:
        if other != key:
            for line in template_lines(TEMPLATES / "domains" / used / f"{other}.md.j2"):
                assert line not in prompt, f"{key} prompt holds {other}'s {used} guidance"

    assert idea["title"] in prompt
    assert " ".join(idea["hypothesis"].split()[:8]) in " ".join(prompt.split())
    assert "{{" not in prompt and "{%" not in prompt


@pytest.mark.parametrize("key", KEYS)
def test_completion_rule_matches_the_phase_table(key):
    phase = BY_KEY[key]
    rule = completion_rule(prompts.system_prompt(key, NEUTRAL_IDEA, "general", ""))
    for section in phase.sections:
        assert f"`{section}`" in rule
    for name in files_of(phase):
        assert f"`{name}`" in rule
    needs_success = any(isinstance(r, (SuccessfulAttempt, PlannedRunsDone)) for r in phase.done_when)
    assert ("succeeded" in rule) == needs_success
    if needs_success:
        assert "`run_experiment`" in rule
    all_sections = {s for p in PHASES for s in p.sections}
    for section in all_sections - set(phase.sections):
        assert section not in rule, f"{key}'s rule names {section}"


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("key", KEYS)
def test_no_other_phase_key_anywhere_in_template_text(key, domain):
    """With an idea and a digest that use no phase key, nothing in the rendered prompt may
    name another phase: not in headings, backticks, or plain words."""
    prompt = prompts.system_prompt(key, dict(NEUTRAL_IDEA, domain=domain), domain,
                                   prompts.digest(neutral_state(), CLOCK))
    # The digest may point to the files that finished phases handed on, by name and phase.
    handed_on = re.sub(r"^\*\*Handed on by earlier phases.*$", "", prompt, flags=re.M)
    assert other_keys_in(handed_on, key) == set()
    for text in (prompts.kickoff(key), prompts.nudge(key, ""),
                 prompts.resume_note(key, ["run_experiment"])):
        assert other_keys_in(text, key) == set()
        assert key in text


@needs_shared()
def test_idea_rendering():
    prompt = prompts.system_prompt("planning", NEUTRAL_IDEA, "general", "")
    assert "Budget: $50 (USD)" in prompt
    assert "3600 s" in prompt
    assert "Widgets, a survey" in prompt
    assert "Keep it small." in prompt
    wrapped = prompts.system_prompt("planning", {"idea": NEUTRAL_IDEA}, "general", "")
    assert wrapped == prompt


@needs_shared()
def test_neurico_idea_rendering():
    cot = prompts.system_prompt("planning", load_idea("ai_chain_of_thought_evaluation.yaml"),
                                "artificial_intelligence", "")
    assert "Budget: $50 (USD)" in cot
    minimal = prompts.system_prompt("setup", load_idea("titanic_survival_prediction.yaml"),
                                    "machine_learning", "")
    assert "**Constraints:**" not in minimal
    assert "Nothing has been recorded yet" in minimal


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase"):
        prompts.system_prompt("review", NEUTRAL_IDEA, "general", "")


# -- domains --------------------------------------------------------------------------------

def test_unknown_domain_gets_the_general_guidance_alone():
    assert prompts.guidance_domain("machine_learning") == "machine_learning"
    assert prompts.guidance_domain("mathematics_lean") == "mathematics_lean"
    for bad in ("quantum_basketweaving", "", None, "../phases", "general/../nlp", "general"):
        assert prompts.guidance_domain(bad) == "general"
    prompt = prompts.system_prompt("analysis", NEUTRAL_IDEA, "quantum_basketweaving", "")
    assert 'no specific guidance for the domain "quantum_basketweaving"' in prompt
    assert "## Guidance for this domain" not in prompt
    general = template_lines(TEMPLATES / "guidance" / "analysis.md.j2")
    assert general and all(line in prompt for line in general)
    ml = prompts.system_prompt("analysis", NEUTRAL_IDEA, "machine_learning", "")
    assert "no specific guidance" not in ml and "## Guidance for this domain: machine_learning" in ml
    assert all(line in ml for line in general), "a domain must add to the general guidance"


@needs_shared()
def test_mathematics_is_proof_oriented():
    prompt = prompts.system_prompt("experiments", load_idea("math_example.yaml"),
                                   "mathematics", "")
    assert "computational checks" in prompt and "counterexample" in prompt


def test_a_domain_without_a_file_for_a_phase_adds_nothing_to_it(template_copy):
    nlp_setup = template_lines(template_copy / "domains" / "nlp" / "setup.md.j2")
    (template_copy / "domains" / "nlp" / "setup.md.j2").unlink()
    assert prompts.guidance_domain("nlp") == "nlp"
    setup = prompts.system_prompt("setup", NEUTRAL_IDEA, "nlp", "")
    for line in template_lines(template_copy / "guidance" / "setup.md.j2"):
        assert line in setup
    assert not any(line in setup for line in nlp_setup)
    assert "## Guidance for this domain" not in setup and "no specific guidance" not in setup
    assert "--- domains/nlp/" not in prompts.template_sources("setup", "nlp")
    plan = prompts.system_prompt("planning", NEUTRAL_IDEA, "nlp", "")
    for line in template_lines(template_copy / "domains" / "nlp" / "planning.md.j2"):
        assert line in plan


# -- template_sources -----------------------------------------------------------------------

def test_template_edit_changes_template_sources(template_copy):
    before = prompts.template_sources("analysis", "machine_learning")
    for name in ("system.md.j2", "preamble.md.j2", "phases/analysis.md.j2", "guidance/analysis.md.j2",
                 "domains/machine_learning/analysis.md.j2", "kickoff.md.j2",
                 "resume_note.md.j2", "nudge.md.j2", "digest.md.j2"):
        assert f"--- {name}\n" in before

    # Another phase's template, or another domain's guidance, does not shape this phase.
    (template_copy / "phases" / "planning.md.j2").write_text("# changed\n")
    (template_copy / "domains" / "nlp" / "analysis.md.j2").write_text("- changed\n")
    assert prompts.template_sources("analysis", "machine_learning") == before

    path = template_copy / "phases" / "analysis.md.j2"
    path.write_text(path.read_text().replace("not in mental arithmetic", "never in your head"))
    after = prompts.template_sources("analysis", "machine_learning")
    assert after != before
    assert "never in your head" in prompts.system_prompt(
        "analysis", NEUTRAL_IDEA, "machine_learning", "")

    general = template_copy / "guidance" / "analysis.md.j2"
    general.write_text(general.read_text().replace("hand-picked examples", "chosen examples"))
    assert prompts.template_sources("analysis", "machine_learning") != after
    after = prompts.template_sources("analysis", "machine_learning")

    domain_file = template_copy / "domains" / "machine_learning" / "analysis.md.j2"
    domain_file.write_text(domain_file.read_text() + "- one more hint\n")
    assert prompts.template_sources("analysis", "machine_learning") != after

    assert prompts.template_sources("analysis", "unknown_domain") == \
        prompts.template_sources("analysis", "general")


# -- the digest ----------------------------------------------------------------------------

def test_digest_shows_failed_attempts_with_error_and_fix():
    text = prompts.digest(neutral_state())
    assert "Widget study" in text
    assert re.search(r"#1 \*\*FAILED\*\*.*`python src/run\.py --size 3`", text)
    assert "ZeroDivisionError: division by zero" in text
    assert "fix applied: guard against empty batches in src/run.py" in text
    assert "throughput=41.5" in text
    assert "#3 INTERRUPTED" in text
    assert "Do not repeat a FAILED attempt unchanged" in text
    # sections in STATE.md order; absent ones omitted
    order = [text.index(h) for h in ("### Research Specification", "### Files and Resources",
                                     "### Experiment Attempts", "### Learnings")]
    assert order == sorted(order)
    assert "### Workflow" not in text and "### Experiment Design" not in text
    assert "### Experiment Results" not in text
    # the digest names phases by number, never by key (files handed on keep their names)
    assert "**Handed on by earlier phases (read them):** `planning.md` (phase 1)" in text
    assert other_keys_in(re.sub(r"^\*\*Handed on.*$", "", text, flags=re.M), "") == set()
    assert "phase 4" in text


def test_digest_of_a_fresh_session_is_short():
    state = NS(title="Fresh", sections={}, attempts=[], phases={})
    text = prompts.digest(state)
    assert "Fresh" in text
    assert "###" not in text and "FAILED" not in text


def test_digest_clips_long_sections():
    state = neutral_state()
    state.sections["workflow"] = "step\n" * 5000
    text = prompts.digest(state)
    assert "truncated; the full text is in STATE.md" in text
    assert len(text) < 8000


# -- the short messages ---------------------------------------------------------------------

@pytest.mark.parametrize("key", KEYS)
def test_kickoff_names_tools_and_rule(key):
    text = prompts.kickoff(key)
    phase = BY_KEY[key]
    assert f"phase {KEYS.index(key) + 1} of 6 ({key})" in text
    for tool in ("bash", "str_replace_based_edit_tool", "run_experiment", "complete_phase"):
        assert f"`{tool}`" in text
    for item in (*phase.sections, *files_of(phase)):
        assert f"`{item}`" in text


def test_resume_note_lists_interrupted_calls():
    text = prompts.resume_note("experiments", ["run_experiment", "bash"])
    assert "interrupted" in text and "resumed" in text
    assert "- `run_experiment`" in text and "- `bash`" in text
    assert "NOT re-run" in text
    assert "check the state of the workspace" in text
    assert "continue where you" in " ".join(text.split())
    quiet = prompts.resume_note("experiments", [])
    assert "NOT re-run" not in quiet and "No tool call was cut off" in quiet


def test_nudge_says_what_is_missing():
    text = prompts.nudge("planning", "section `research_specification` not given")
    assert "Still missing: section `research_specification` not given" in text
    assert "`complete_phase`" in text
    assert "Still missing" not in prompts.nudge("planning", "")

"""Research guidance in layers: each topic of the guidance list has a named block in the
phase where the agent acts on it; every domain keeps every general block or replaces it by
name; domain guidance comes after the general guidance; `labrun check` shows the layers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labrun import prompts
from labrun.idea import load_idea
from labrun.phase_registry import PHASES
from support import labrun

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "templates"
SHARED = Path(os.environ.get("LABRUN_SHARED") or REPO.parent / "shared")
TOPIC_LIST = SHARED / "research-guidance-topics.md"
KEYS = [p.key for p in PHASES]
DOMAINS = sorted(p.name for p in (TEMPLATES / "domains").iterdir() if p.is_dir())
NEW_AND_DEEPENED = ["artificial_intelligence", "battery", "computer_vision", "data_science", "finance",
                    "machine_learning", "mathematics", "mathematics_lean", "nlp", "particle_physics",
                    "reinforcement_learning"]
IDEA = {"title": "Effect of widget size on gadget throughput", "domain": "general",
        "hypothesis": "Larger widgets raise gadget throughput by at least ten percent."}

# Every topic of research-guidance-topics.md: (the words it opens with there, the phase, the
# general block that covers it, terms that block must use for the topic). The block is the
# mark: a domain keeps it or replaces it by name, never loses it.
TOPICS = [
    ("Ground the motivation in the literature", "planning", "literature", ["cite", "gap", "matters"]),
    ("Break the hypothesis into parts", "planning", "hypotheses",
     ["independent variable", "dependent variable", "controls", "count against"]),
    ("Alternative explanations", "planning", "alternatives", ["confound", "rules it out"]),
    ("Baselines: a trivial one and a credible one", "planning", "baselines",
     ["trivial", "credible", "tuning budget"]),
    ("The metrics and the statistical test", "planning", "metrics_and_test",
     ["primary metric", "statistical test", "before any result"]),
    ("Sample size and power", "planning", "power", ["power", "detect", "seeds"]),
    ("Ablations as planned runs", "planning", "ablations", ["ablation", "run list", "component"]),
    ("A run list that maps every evaluation criterion", "planning", "run_list",
     ["evaluation criterion", "wall time", "money", "seeds"]),
    ("Judge the idea's suggested method", "planning", "judge_method", ["improve", "reason"]),
    ("An isolated environment (uv)", "setup", "environment", ["uv venv", "requirements.txt", "exact versions"]),
    ("Hardware found and recorded", "setup", "hardware", ["GPU", "CPU", "RAM", "nvidia-smi"]),
    ("Data obtained, checked", "setup", "data_checks",
     ["missing values", "duplicates", "overlap between splits", "balance", "examples read by eye"]),
    ("Code references cloned and recorded", "setup", "code_references", ["code_references", "git clone", "commit"]),
    ("Credentials the experiments need", "setup", "credentials", ["by name", "missing", "never print"]),
    ("Baselines first, then the method, then evaluation", "implementation", "build_order",
     ["baselines first", "one evaluation function"]),
    ("Seeds set everywhere", "implementation", "seeds_and_config", ["seed", "config.json", "beside its metrics"]),
    ("Fail loudly", "implementation", "fail_loudly", ["assert", "NaN", "range"]),
    ("Sanity checks before real runs", "implementation", "sanity_checks",
     ["small batch", "shuffled labels", "chance"]),
    ("Raw per-item outputs saved", "implementation", "raw_outputs", ["per-item", "not only aggregates"]),
    ("For LLM studies", "implementation", "llm_calls",
     ["never simulate", "current model versions", "date", "cache", "back-off", "estimate the cost"]),
    ("A pilot first, then the planned runs", "experiments", "pilot_first", ["pilot", "run list", "priority"]),
    ("Several seeds per condition", "experiments", "repeats", ["seeds", "temperature above 0"]),
    ("Robustness and sensitivity", "experiments", "robustness",
     ["hyperparameter", "seeds", "split", "out-of-distribution"]),
    ("For LLM evaluations", "experiments", "llm_evaluations",
     ["more than one model family", "more than one benchmark", "contamination", "prompt leakage"]),
    ("GPU use", "experiments", "gpu", ["batch size", "memory", "mixed precision"]),
    ("Time and money watched", "experiments", "budget_watch", ["elapsed time", "money", "cut deliberately"]),
    ("Every run's outputs kept", "experiments", "keep_outputs", ["failed", "disappointing"]),
    ("Effect sizes with confidence intervals", "analysis", "effect_sizes", ["confidence interval", "cohen"]),
    ("Paired tests where the design is paired", "analysis", "paired_tests",
     ["paired", "holm", "benjamini", "several comparisons"]),
    ("The assumptions of each test checked", "analysis", "assumptions",
     ["assumes", "normal", "independent", "welch"]),
    ("Practical significance separate from statistical", "analysis", "practical_significance",
     ['"not significant" does not mean "no effect"', "smallest difference"]),
    ("Error analysis", "analysis", "error_analysis", ["failures", "categories", "count"]),
    ("Figures that stand alone", "analysis", "figures", ["units", "legend", "error bars", "distributions"]),
    ("What the data show kept apart", "analysis", "findings_apart", ["finding", "explanation"]),
    ("A validation pass", "documentation", "validation_pass",
     ["rerun one key result", "exists", "results file", "placeholder"]),
    ("REPORT.md covers", "documentation", "report_contents",
     ["question", "related work", "method", "uncertainty", "results", "limitations and threats to validity",
      "conclusions and next steps", "reproduction", "references"]),
    ("README.md", "documentation", "readme", ["rerun", "environment and hardware"]),
    ("A negative or null result reported as plainly", "documentation", "negative_results",
     ["null", "negative", "failed attempts"]),
]


def topic_list() -> list[tuple[str, str]]:
    """(phase key, topic text) for every top-level item of the shared guidance list, with its
    continuation lines and sub-items folded in."""
    items: list[tuple[str, str]] = []
    phase = None
    for line in TOPIC_LIST.read_text().splitlines():
        heading = re.match(r"^## (\w+)\s*$", line)
        if heading:
            phase = heading.group(1).lower() if heading.group(1).lower() in KEYS else None
        elif phase and line.startswith("- "):
            items.append((phase, line[2:].strip()))
        elif phase and line.startswith("  ") and items:
            items[-1] = (phase, items[-1][1] + " " + line.strip())
    return items


def values(key: str, domain: str) -> dict:
    return {**prompts._phase_vars(key, KEYS), "idea": IDEA, "idea_domain": domain,
            "domain": prompts.guidance_domain(domain)}


def block_text(template: str, block: str, key: str, domain: str) -> str:
    """One block of one template, rendered on its own, straight from Jinja."""
    tpl = prompts.env.get_template(template)
    return prompts._tidy("".join(tpl.blocks[block](tpl.new_context(values(key, domain))))).strip()


def lost_blocks(prompt: str, key: str, domain: str) -> list[str]:
    """General blocks of phase `key` that are in neither form in `prompt`: not as written, and
    not as a replacement that the domain declares (`replace_<name>`)."""
    layout = prompts.layers(key, domain)
    lost = []
    for name in layout.blocks:
        if name in layout.replaced:
            expected = block_text(layout.domain_file, prompts.REPLACE + name, key, domain)
        else:
            expected = block_text(layout.general, name, key, domain)
        if not expected or expected not in prompt:
            lost.append(name)
    return lost


# -- the topics -----------------------------------------------------------------------------

@pytest.mark.skipif(not TOPIC_LIST.is_file(), reason=f"the guidance list is not at {TOPIC_LIST}: "
                    "set LABRUN_SHARED to the shared folder that holds research-guidance-topics.md")
def test_the_table_holds_every_topic_of_the_guidance_list_in_its_phase():
    listed = topic_list()
    assert len(listed) >= 35, "the list's format changed: topic_list() found too few items"
    for phase, text in listed:
        rows = [row for row in TOPICS if text.startswith(row[0])]
        assert len(rows) == 1, f"topic without exactly one row in TOPICS: {phase}: {text[:70]!r}"
        assert rows[0][1] == phase, f"{text[:50]!r} is a {phase} topic, the table puts it in {rows[0][1]}"
    assert len(listed) == len(TOPICS), "TOPICS has rows for topics the list no longer has"


@pytest.mark.parametrize("opening,key,block,terms", TOPICS, ids=[f"{t[1]}.{t[2]}" for t in TOPICS])
def test_each_topic_is_a_general_block_of_its_phase_that_speaks_to_it(opening, key, block, terms):
    layout = prompts.layers(key, "general")
    assert block in layout.blocks, f"guidance/{key}.md.j2 has no block {block!r} for {opening!r}"
    text = block_text(layout.general, block, key, "general")
    assert len(text) >= 150, f"{key}.{block} is too thin to guide anyone: {text!r}"
    words = " ".join(text.split()).lower()
    for term in terms:
        assert term.lower() in words, f"{key}.{block} ({opening}) does not say {term!r}"
    for other in KEYS:
        if other != key:
            assert block not in prompts.layers(other, "general").blocks, f"{block} also in {other}"


def test_every_general_block_serves_the_list_or_is_known_extra():
    """Blocks beyond the list are allowed, but named here so that none is a stray."""
    extra = {("planning", "budget_fit"), ("planning", "risks")}
    covered = {(key, block) for _, key, block, _ in TOPICS}
    for key in KEYS:
        for block in prompts.layers(key, "general").blocks:
            assert (key, block) in covered | extra, f"{key}.{block} is in neither TOPICS nor the extras"


# -- layering -------------------------------------------------------------------------------

@pytest.mark.parametrize("domain", [*DOMAINS, "general", "quantum_basketweaving"])
@pytest.mark.parametrize("key", KEYS)
def test_a_domain_adds_to_the_general_guidance_and_replaces_only_by_name(key, domain):
    prompt = prompts.system_prompt(key, dict(IDEA, domain=domain), domain, "")
    layout = prompts.layers(key, domain)
    assert lost_blocks(prompt, key, domain) == []

    general_start = prompt.index("## Research guidance for this phase")
    assert prompt.index("**Completion rule:**") < general_start, "the phase's instructions come first"
    ends = []
    for name in layout.blocks:
        template, block = ((layout.domain_file, prompts.REPLACE + name) if name in layout.replaced
                           else (layout.general, name))
        text = block_text(template, block, key, domain)
        assert prompt.index(text) > general_start
        ends.append(prompt.index(text) + len(text))
        if name in layout.replaced:
            assert len(text) >= 80, f"{layout.domain_file}: the replacement of {name} says too little"
            assert block_text(layout.general, name, key, domain) not in prompt
    assert ends == sorted(ends), "the general blocks keep their order"

    if layout.added:
        domain_start = prompt.index(f"## Guidance for this domain: {layout.domain}")
        assert domain_start > max(ends), "the domain's guidance follows the general guidance"
        for name in layout.added:
            text = block_text(layout.domain_file, name, key, domain)
            assert text and prompt.index(text) > domain_start
    else:
        assert "## Guidance for this domain" not in prompt
    assert prompt.index("## The research idea") > max(ends)


def test_lost_blocks_sees_a_block_that_is_gone():
    prompt = prompts.system_prompt("analysis", IDEA, "nlp", "")
    text = block_text("guidance/analysis.md.j2", "assumptions", "analysis", "nlp")
    assert lost_blocks(prompt.replace(text, ""), "analysis", "nlp") == ["assumptions"]
    lean = prompts.system_prompt("analysis", IDEA, "mathematics_lean", "")
    replacement = block_text("domains/mathematics_lean/analysis.md.j2", "replace_assumptions",
                             "analysis", "mathematics_lean")
    assert lost_blocks(lean.replace(replacement, ""), "analysis", "mathematics_lean") == ["assumptions"]


def test_a_domain_cannot_drop_a_general_block_without_saying_so(template_copy):
    domain = template_copy / "domains" / "nlp" / "analysis.md.j2"
    domain.write_text("{% block assumptions %}{% endblock %}\n")
    with pytest.raises(ValueError, match="replace_assumptions"):
        prompts.system_prompt("analysis", IDEA, "nlp", "")
    domain.write_text("{% block replace_assumption %}Typo in the name.{% endblock %}\n")
    with pytest.raises(ValueError, match="replaces no block"):
        prompts.layers("analysis", "nlp")
    domain.write_text("{% block replace_assumptions %}Assumptions: checked the nlp way, say how."
                      "{% endblock %}\n{% block nlp_extra %}One more point.{% endblock %}\n")
    layout = prompts.layers("analysis", "nlp")
    assert layout.replaced == ("assumptions",) and layout.added == ("nlp_extra",)
    prompt = prompts.system_prompt("analysis", IDEA, "nlp", "")
    assert "checked the nlp way" in prompt and "One more point." in prompt
    assert block_text("guidance/analysis.md.j2", "assumptions", "analysis", "nlp") not in prompt


@pytest.mark.parametrize("domain", NEW_AND_DEEPENED)
def test_every_domain_has_guidance_of_its_own_for_every_phase(domain):
    assert domain in DOMAINS
    for key in KEYS:
        layout = prompts.layers(key, domain)
        assert layout.domain_file, f"{domain} has no guidance for {key}"
        assert layout.added or layout.replaced, f"domains/{domain}/{key}.md.j2 adds nothing"
        source = (TEMPLATES / layout.domain_file).read_text()
        assert re.sub(r"\{#.*?#\}|\{%.*?%\}", "", source, flags=re.S).strip(), layout.domain_file


def test_no_template_has_text_outside_its_blocks():
    """Text outside blocks would never reach a prompt: the layering renders blocks only."""
    for path in [*(TEMPLATES / "guidance").glob("*.md.j2"), *(TEMPLATES / "domains").glob("*/*.md.j2")]:
        source = re.sub(r"\{#.*?#\}", "", path.read_text(), flags=re.S)
        outside = re.sub(r"\{%-? block (\w+) -?%\}.*?\{%-? endblock -?%\}", "", source, flags=re.S)
        assert not outside.strip(), f"{path}: text outside blocks: {outside.strip()[:60]!r}"


# -- the Lean domain ------------------------------------------------------------------------

def test_lean_is_set_up_with_elan_and_lake_and_a_sorry_fails_the_build_check():
    setup = prompts.system_prompt("setup", IDEA, "mathematics_lean", "")
    toolchain = block_text("domains/mathematics_lean/setup.md.j2", "lean_toolchain", "setup", "mathematics_lean")
    assert toolchain in setup
    for term in ("elan-init.sh", "new proofs math", "lake exe cache get", "ELAN_HOME"):
        assert term in " ".join(toolchain.split()), term
    checker = block_text("domains/mathematics_lean/implementation.md.j2", "replace_sanity_checks",
                         "implementation", "mathematics_lean")
    assert "lake build" in checker and "sorry" in checker and "exits non-zero" in " ".join(checker.split())
    experiments = prompts.system_prompt("experiments", IDEA, "mathematics_lean", "")
    run = block_text("domains/mathematics_lean/experiments.md.j2", "build_is_the_run", "experiments",
                     "mathematics_lean")
    assert run in experiments and "`sorry`" in run and "fails" in run
    assert "run_experiment" in run


# -- every NeuriCo idea, and `labrun check` --------------------------------------------------

NEURICO = sorted(p for p in (SHARED / "neurico-ideas").glob("*.yaml") if p.name != "schema.yaml")


@pytest.mark.skipif(not NEURICO, reason=f"NeuriCo's ideas are not at {SHARED / 'neurico-ideas'}: "
                    "set LABRUN_SHARED to the shared folder that holds neurico-ideas/")
@pytest.mark.parametrize("path", NEURICO, ids=[p.stem for p in NEURICO])
def test_every_neurico_idea_loads_and_renders_in_its_own_domain(path):
    idea = load_idea(path)
    assert idea.guidance_domain == idea.domain == prompts.guidance_domain(idea.domain)
    for number, phase in enumerate(PHASES, 1):
        prompt = prompts.system_prompt(phase.key, idea.as_prompt_dict(), idea.guidance_domain, "")
        assert prompt.splitlines()[0] == f"# Phase {number} of 6: {phase.key}"
        assert lost_blocks(prompt, phase.key, idea.guidance_domain) == []
        layout = prompts.layers(phase.key, idea.guidance_domain)
        assert layout.domain_file and layout.domain == idea.domain
        assert (f"## Guidance for this domain: {idea.domain}" in prompt) == bool(layout.added)
        assert idea.title in prompt and "{{" not in prompt


def test_check_shows_each_phases_layers_without_importing_prefect(tmp_path):
    idea = tmp_path / "lean.yaml"
    idea.write_text("idea:\n  title: Gauss sum in Lean, checked\n  domain: mathematics_lean\n"
                    "  hypothesis: The sum of 0..n equals n(n+1)/2 for every natural n.\n")
    code = ("import sys; from labrun.cli import main; code = main(['check', sys.argv[1]]); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'prefect'], 'prefect imported'; "
            "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, str(idea)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "guidance: mathematics_lean" in lines[0]
    for number, phase in enumerate(PHASES, 1):
        layout = prompts.layers(phase.key, "mathematics_lean")
        line = next(x for x in lines if re.match(rf"\s+{number} {phase.key}\b", x))
        assert f"general: {len(layout.blocks)} blocks" in line
        for name in (*layout.added, *layout.replaced):
            assert name in line
        assert ("replaces" in line) == bool(layout.replaced)
    plain = tmp_path / "plain.yaml"
    plain.write_text(idea.read_text().replace("mathematics_lean", "systems"))
    result = labrun("check", str(plain), timeout=60)
    assert result.stdout.count("no domain guidance") == len(PHASES), result.stdout + result.stderr

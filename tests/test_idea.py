"""Idea files: NeuriCo's own examples load unchanged; bad files give one precise line."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from support import NEURICO_IDEAS, needs_shared
from labrun.idea import GENERAL_DOMAIN, KNOWN_DOMAINS, Idea, IdeaError, load_idea, parse_idea

REPO = Path(__file__).resolve().parents[1]
NEURICO_FILES = sorted(p for p in NEURICO_IDEAS.glob("*.yaml") if p.name != "schema.yaml")
OUR_EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

GOOD = """\
idea:
  title: "A title of a decent length"
  domain: machine_learning
  hypothesis: "A hypothesis long enough to pass"
"""


def write(tmp_path: Path, text: str | bytes, name: str = "idea.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def error_of(path: Path) -> IdeaError:
    with pytest.raises(IdeaError) as caught:
        load_idea(path)
    return caught.value


def no_none(value) -> bool:
    if isinstance(value, dict):
        return all(v is not None and no_none(v) for v in value.values())
    if isinstance(value, list):
        return all(v is not None and no_none(v) for v in value)
    return True


# ── real files ───────────────────────────────────────────────────────────────────────────


@needs_shared()
def test_neurico_examples_are_there():
    # Guards the parametrized test below against passing on an empty glob.
    names = {p.name for p in NEURICO_FILES}
    assert {"ai_chain_of_thought_evaluation.yaml", "titanic_survival_prediction.yaml"} <= names
    assert len(NEURICO_FILES) >= 6


@needs_shared()
@pytest.mark.parametrize("path", NEURICO_FILES, ids=lambda p: p.name)
def test_neurico_example_loads_unchanged(path: Path):
    idea = load_idea(path)
    assert 10 <= len(idea.title) <= 200
    assert idea.domain in KNOWN_DOMAINS
    assert idea.guidance_domain == idea.domain
    assert idea.warnings == []
    assert idea.content_hash == hashlib.sha256(path.read_bytes()).hexdigest()
    assert idea.path == str(path)
    prompt = idea.as_prompt_dict()
    assert prompt["title"] == idea.title and no_none(prompt)
    json.dumps(prompt)  # plain data only


@pytest.mark.parametrize("path", OUR_EXAMPLES, ids=lambda p: p.name)
def test_our_examples_load_cleanly(path: Path):
    idea = load_idea(path)
    assert idea.warnings == []
    assert idea.guidance_domain != GENERAL_DOMAIN


@needs_shared()
def test_neurico_strays_from_its_schema_and_is_accepted():
    cot = load_idea(NEURICO_IDEAS / "ai_chain_of_thought_evaluation.yaml")
    assert cot.budget_usd == 50.0  # written "$50", on which NeuriCo itself crashes
    assert cot.constraints.time_limit == 7200
    assert "Important considerations" in cot.metadata.notes

    agent = load_idea(NEURICO_IDEAS / "ai_agent_tool_use.yaml")
    assert agent.budget_usd == 150.0
    assert [o.type for o in agent.expected_outputs] == [
        "benchmark", "metrics", "data", "visualization", "error_analysis"
    ]

    lean = load_idea(NEURICO_IDEAS / "gauss_sum_lean.yaml")
    assert lean.expected_outputs[0].type == "proof"
    assert lean.as_prompt_dict()["metadata"]["paper_style"] == "ams"  # extra keys are kept
    assert lean.slug == "formal-proof-of-gausss-summation-formula-axiom"


@needs_shared()
def test_minimal_idea_gets_schema_defaults():
    idea = load_idea(NEURICO_IDEAS / "titanic_survival_prediction.yaml")
    assert idea.title == "Titanic Survival Prediction"
    assert idea.hypothesis.startswith("Passenger demographic")
    assert not idea.hypothesis.endswith("\n")  # block scalars are stripped
    assert idea.constraints.time_limit == 3600
    assert idea.budget_usd is None and idea.background is None
    assert idea.as_prompt_dict() == {
        "title": "Titanic Survival Prediction",
        "domain": "machine_learning",
        "hypothesis": idea.hypothesis,
        "constraints": {"time_limit": 3600},
    }


def test_demo_idea_is_offline_and_free():
    idea = load_idea(REPO / "examples" / "demo_noise_averaging.yaml")
    assert idea.constraints.compute == "cpu_only"
    assert idea.constraints.time_limit == 600
    assert idea.budget_usd == 0.0
    assert idea.constraints.dependencies == []
    assert "1/sqrt(k)" in idea.hypothesis


# ── budget ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "written, usd",
    [
        ("50", 50.0),
        ("12.5", 12.5),
        ("0", 0.0),
        ('"50"', 50.0),
        ('"$50"', 50.0),
        ('"$1,200.50"', 1200.5),
        ('"50 USD"', 50.0),
        ('"50usd"', 50.0),
        ('"US$ 7.25"', 7.25),
        ('" $ 3 "', 3.0),
    ],
)
def test_budget_forms(tmp_path: Path, written: str, usd: float):
    idea = load_idea(write(tmp_path, GOOD + f"  constraints:\n    budget: {written}\n"))
    assert idea.budget_usd == usd
    assert isinstance(idea.budget_usd, float)
    assert idea.as_prompt_dict()["constraints"]["budget"] == usd


@pytest.mark.parametrize(
    "written, problem",
    [
        ('"50 EUR"', """must be an amount in USD such as 50 or "$50" (got '50 EUR')"""),
        ('"fifty"', """must be an amount in USD such as 50 or "$50" (got 'fifty')"""),
        ('"$1,20"', """must be an amount in USD such as 50 or "$50" (got '$1,20')"""),
        ("yes", 'must be an amount in USD such as 50 or "$50" (got true)'),
        ("-5", "must be at least 0 (got -5)"),
        ("[50]", "must be a number (got a list)"),
    ],
)
def test_bad_budget(tmp_path: Path, written: str, problem: str):
    path = write(tmp_path, GOOD + f"  constraints:\n    budget: {written}\n")
    assert str(error_of(path)) == f"{path}:6: idea.constraints.budget: {problem}"


# ── bad input: one line, with file, line and field ───────────────────────────────────────


@pytest.mark.parametrize(
    "text, expected",
    [
        # (file text, the message after "<path>")
        (GOOD.replace('"A hypothesis long enough to pass"', "too short"),
         ":4: idea.hypothesis: must be at least 20 characters (got 9)"),
        (GOOD.replace('"A title of a decent length"', "Short"),
         ":2: idea.title: must be at least 10 characters (got 5)"),
        (GOOD.replace('"A title of a decent length"', "x" * 201),
         ":2: idea.title: must be at most 200 characters (got 201)"),
        ("idea:\n  domain: nlp\n  hypothesis: 'A hypothesis long enough to pass'\n",
         ":1: idea.title: field required"),
        ("title: 'A title of a decent length'\n",
         ":1: idea: field required (an idea file's fields go under 'idea:')"),
        ("idea:\n", ":1: idea: must be a mapping (got null)"),
        (GOOD.replace('"A title of a decent length"', "[a, b]"),
         ":2: idea.title: must be a string (got a list)"),
        (GOOD + "  constraints:\n    time_limit: 30\n",
         ":6: idea.constraints.time_limit: must be at least 60 (got 30)"),
        (GOOD + "  constraints:\n    time_limit: 100000\n",
         ":6: idea.constraints.time_limit: must be at most 86400 (got 100000)"),
        (GOOD + "  constraints:\n    time_limit: true\n",
         ":6: idea.constraints.time_limit: must be an integer (got true)"),
        (GOOD + "  constraints:\n    memory: 8 GB\n",
         ":6: idea.constraints.memory: must be a size such as 8GB or 512MB (got '8 GB')"),
        (GOOD + "  constraints:\n    compute: gpu\n",
         ":6: idea.constraints.compute: must be one of 'cpu_only', 'gpu_required', 'multi_gpu', "
         "'tpu' or 'any' (got 'gpu')"),
        (GOOD + "  evaluation_criteria: []\n",
         ":5: idea.evaluation_criteria: must have at least 1 item(s) (got 0)"),
        (GOOD + "  methodology:\n    steps: just do it\n",
         ":6: idea.methodology.steps: must be a list (got 'just do it')"),
        (GOOD + "  background:\n    papers:\n      - url: https://arxiv.org/abs/1\n"
                "        description: ok\n      - description: no link\n",
         ":9: idea.background.papers[1]: a paper needs a 'url' or a 'path'"),
        (GOOD + "  expected_outputs:\n    - type: metrics\n      format: json\n"
                "    - type: report\n",
         ":8: idea.expected_outputs[1].format: field required"),
        (GOOD + "  metadata:\n    priority: asap\n",
         ":6: idea.metadata.priority: must be one of 'low', 'medium', 'high' or 'urgent' "
         "(got 'asap')"),
        ("idea:\n  title: a: b\n", ":2: invalid YAML: mapping values are not allowed here"),
        ("idea:\n  title: 'open\n",
         ":3: invalid YAML: while scanning a quoted scalar, found unexpected end of stream"),
        ("idea:\n\ttitle: x\n",
         ":2: invalid YAML: while scanning for the next token, found character '\\t' that cannot "
         "start any token"),
        (GOOD + "---\nidea: {}\n",
         ":5: invalid YAML: expected a single document in the stream, but found another document"),
        ("- a\n- b\n", ":1: top level must be a mapping with an 'idea:' key (got a list)"),
        ("just words\n", ":1: top level must be a mapping with an 'idea:' key (got 'just words')"),
        ("", ": file is empty: expected a mapping with an 'idea:' key"),
        ("# only a comment\n\n", ": file is empty: expected a mapping with an 'idea:' key"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", ": binary file, not YAML text"),
        (b"idea:\n  title: 'caf\xe9 au lait'\n", ":2: not UTF-8 text (byte 0xe9)"),
        ("idea:\n  title: 'bell \x07'\n",
         ":2: invalid YAML: unacceptable character #x0007: special characters are not allowed"),
    ],
)
def test_bad_input_gives_one_precise_line(tmp_path: Path, text: str | bytes, expected: str):
    path = write(tmp_path, text)
    error = error_of(path)
    assert str(error) == f"{path}{expected}"
    assert "\n" not in str(error)
    # Nothing chained: a caller that prints the exception shows no pydantic or YAML traceback.
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_missing_file_and_directory(tmp_path: Path):
    assert str(error_of(tmp_path / "nope.yaml")) == f"{tmp_path / 'nope.yaml'}: file not found"
    assert str(error_of(tmp_path)) == f"{tmp_path}: is a directory, not an idea file"


def test_path_is_shown_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ideas").mkdir()
    write(tmp_path / "ideas", GOOD.replace('"A title of a decent length"', "Short"), "x.yaml")
    assert str(error_of(Path("ideas/x.yaml"))).startswith("ideas/x.yaml:2: idea.title: ")


def test_multiple_errors_report_the_first_in_file_order(tmp_path: Path):
    path = write(
        tmp_path,
        "idea:\n  title: Short\n  domain: nlp\n  hypothesis: brief\n"
        "  constraints:\n    time_limit: 5\n",
    )
    error = error_of(path)
    assert str(error) == f"{path}:2: idea.title: must be at least 10 characters (got 5) (+2 more)"
    assert error.problems == [
        f"{path}:2: idea.title: must be at least 10 characters (got 5)",
        f"{path}:4: idea.hypothesis: must be at least 20 characters (got 5)",
        f"{path}:6: idea.constraints.time_limit: must be at least 60 (got 5)",
    ]


# ── domains, warnings, identity ──────────────────────────────────────────────────────────


def test_unknown_domain_warns_and_falls_back(tmp_path: Path):
    idea = load_idea(write(tmp_path, GOOD.replace("machine_learning", "astrology")))
    assert idea.domain == "astrology"
    assert idea.guidance_domain == GENERAL_DOMAIN == "general"
    assert idea.warnings == ["unknown domain 'astrology': using general guidance"]


@pytest.mark.parametrize("written, domain", [
    ("Machine Learning", "machine_learning"),
    ("computer-vision", "computer_vision"),
    ("general", "general"),
])
def test_domain_spellings(tmp_path: Path, written: str, domain: str):
    idea = load_idea(write(tmp_path, GOOD.replace("machine_learning", written)))
    assert idea.guidance_domain == domain
    assert idea.warnings == []


def test_neurico_domains_are_known():
    for domain in ("artificial_intelligence", "mathematics_lean", "nlp", "scientific_computing"):
        assert domain in KNOWN_DOMAINS


def test_misplaced_and_duplicate_keys_warn(tmp_path: Path):
    text = GOOD + "  domain: nlp\nconstraints:\n  budget: 5\n"
    idea = load_idea(write(tmp_path, text))
    assert idea.domain == "nlp"  # YAML's rule: the last one wins
    assert idea.budget_usd is None
    assert idea.warnings == [
        "unknown top-level key 'constraints' ignored: idea fields go under 'idea:'",
        "line 5: duplicate key 'idea.domain': only the last one is used",
    ]


MISSPELT = GOOD + """\
  hypotesis: "the same, misspelt, beside the right one"
  constraint:
    network: false
  evaluation_criterion: ["C1 holds"]
  metadata:
    reveiw_after: [planning]
"""


def test_misspelt_keys_warn_naming_the_likely_key(tmp_path: Path):
    idea = load_idea(write(tmp_path, MISSPELT))
    assert idea.constraints.network is None  # what the misspelt key meant did not happen
    assert idea.warnings == [
        "line 5: unknown key 'idea.hypotesis' (did you mean 'hypothesis'?): kept for the agent, unused by labrun",
        "line 6: unknown key 'idea.constraint' (did you mean 'constraints'?): kept for the agent, unused by labrun",
        "line 8: unknown key 'idea.evaluation_criterion' (did you mean 'evaluation_criteria'?): kept for the "
        "agent, unused by labrun",
        "line 10: unknown key 'idea.metadata.reveiw_after' (did you mean 'review_after'?): kept for the agent, "
        "unused by labrun",
    ]


def test_check_warns_of_unknown_keys_and_strict_refuses_them(tmp_path: Path):
    from support import labrun

    path = write(tmp_path, MISSPELT)
    checked = labrun("check", str(path), timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "unknown key 'idea.constraint' (did you mean 'constraints'?)" in checked.stderr
    strict = labrun("check", str(path), "--strict", timeout=60)
    assert strict.returncode == 2, strict.stderr
    assert f"{path}: not valid with --strict: 4 warning(s) about the file" in strict.stderr
    assert labrun("check", str(write(tmp_path, GOOD, "good.yaml")), "--strict", timeout=60).returncode == 0
    # A run says them too, before anything starts (here it stops at once: its workspace is a file).
    afile = tmp_path / "a-file"
    afile.write_text("")
    ran = labrun("run", str(path), "--workspace", str(afile), "--agent", "scripted", timeout=60)
    assert "unknown key 'idea.metadata.reveiw_after' (did you mean 'review_after'?)" in ran.stderr, ran.stderr


def test_gpu_asked_for_on_a_machine_without_one_warns(tmp_path: Path):
    from labrun.machine import compute_warnings

    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidiactl").touch()  # the driver's control node is no GPU
    idea = load_idea(write(tmp_path, GOOD + "  constraints:\n    compute: gpu_required\n"))
    assert compute_warnings(idea, devices) == [
        "constraints.compute: gpu_required, but this machine has no GPUs; the experiments will run on what is here"]
    (devices / "nvidia0").touch()
    assert compute_warnings(idea, devices) == []
    multi = load_idea(write(tmp_path, GOOD + "  constraints:\n    compute: multi_gpu\n", "multi.yaml"))
    assert compute_warnings(multi, devices) == [
        "constraints.compute: multi_gpu, but this machine has 1 GPU; the experiments will run on what is here"]
    assert compute_warnings(load_idea(write(tmp_path, GOOD, "any.yaml")), tmp_path / "none") == []


def test_check_and_run_warn_of_a_gpu_this_machine_lacks(tmp_path: Path):
    from labrun.machine import gpu_count
    from support import labrun

    if gpu_count():
        pytest.skip("this machine has a GPU: there is nothing to warn of")
    path = write(tmp_path, GOOD + "  constraints:\n    compute: gpu_required\n")
    checked = labrun("check", str(path), timeout=60)
    assert checked.returncode == 0 and "this machine has no GPUs" in checked.stderr, checked.stderr
    assert labrun("check", str(path), "--strict", timeout=60).returncode == 0  # the machine's, not the file's
    afile = tmp_path / "a-file"
    afile.write_text("")
    ran = labrun("run", str(path), "--workspace", str(afile), "--agent", "scripted", timeout=60)
    assert "this machine has no GPUs" in ran.stderr, ran.stderr


def test_extra_keys_are_kept(tmp_path: Path):
    text = GOOD + "  novelty: high\n  metadata:\n    notes: keep me\n    created_at: 2024-05-01\n"
    prompt = load_idea(write(tmp_path, text)).as_prompt_dict()
    assert prompt["novelty"] == "high"
    assert prompt["metadata"] == {"notes": "keep me", "created_at": "2024-05-01"}


def test_content_hash_tells_same_idea(tmp_path: Path):
    a = load_idea(write(tmp_path, GOOD, "a.yaml"))
    b = load_idea(write(tmp_path, GOOD, "b.yaml"))
    c = load_idea(write(tmp_path, GOOD + "# a comment changes the content\n", "c.yaml"))
    assert a.content_hash == b.content_hash == hashlib.sha256(GOOD.encode()).hexdigest()
    assert c.content_hash != a.content_hash


@pytest.mark.parametrize("title, slug", [
    ("A title of a decent length", "a-title-of-a-decent-length"),
    ("Café/RAG: 2x faster?! (v2)", "cafe-rag-2x-faster-v2"),
    ("Impact of L2 Regularization on Small Dataset Generalization",
     "impact-of-l2-regularization-on-small-dataset"),
    ("Ωμέγα αλφα βήτα γάμμα", "idea"),
])
def test_slug(title: str, slug: str):
    idea = parse_idea(GOOD.replace("A title of a decent length", title).encode())
    assert idea.slug == slug
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", idea.slug) and len(idea.slug) <= 48


def test_parse_idea_names_the_source():
    with pytest.raises(IdeaError) as caught:
        parse_idea(b"idea: [1]\n", "upload")
    assert str(caught.value) == "upload:1: idea: must be a mapping (got a list)"
    assert isinstance(parse_idea(GOOD.encode()), Idea)

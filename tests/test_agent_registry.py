"""The agent backends' registry: a new backend is one module and one entry, and every part of
labrun that knows a fact of a backend (its name, model, cost, check, tools, transcripts) asks
the registry for it."""

from __future__ import annotations

import ast
import json

import pytest

import tiny_backend
from support import DEMO_IDEA, REPO
from labrun import toollog
from labrun.agents import registry
from labrun.agents.backends import check_agent, make_agent, require_priced
from labrun.cli import parsing  # noqa: F401  (its variables listed before the tiny entry is registered, and kept so)
from labrun.status import session_status


@pytest.fixture
def tiny(monkeypatch):
    """tests/tiny_backend.py's entry in the registry, for this test only."""
    monkeypatch.setitem(registry.BACKENDS, "tiny", tiny_backend.ENTRY)
    return tiny_backend.ENTRY


def test_a_new_backend_runs_a_session_through_labrun_run(tmp_path, prefect_api, cli, tiny, monkeypatch):
    """`labrun run --agent tiny` checks the entry's credentials, refuses a budget it cannot
    price, then runs every phase on the entry's factory and default model."""
    from labrun.cli.parsing import parser

    assert parser().parse_args(["run", str(DEMO_IDEA), "--workspace", "w", "--agent", "tiny"]).agent == "tiny"
    monkeypatch.delenv("TINY_KEY", raising=False)
    ws = tmp_path / "ws"
    refused = cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "tiny")
    assert refused.returncode != 0 and tiny_backend.MISSING in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (ws / ".labrun" / "state.json").exists()

    monkeypatch.setenv("TINY_KEY", "k")
    unpriced = cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "tiny", "--budget-usd", "1")
    assert unpriced.returncode != 0 and "no price is known for model 'tiny-1'" in unpriced.stderr, unpriced.stderr

    done = cli("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "tiny")
    assert done.returncode == 0, done.stderr
    report = session_status(ws)
    assert report["session"]["complete"] and report["session"]["agent"] == "tiny"
    for journal in (ws / ".labrun" / "phases").rglob("conversation-*.jsonl"):
        said = [b["text"] for line in journal.read_text().splitlines() if (r := json.loads(line))["kind"] == "reply"
                for b in r["content"] if b["type"] == "text"]
        assert said and all(s.startswith("[tiny-1] ") for s in said), (journal, said)
    state_md = (ws / "STATE.md").read_text()
    assert "agent `tiny`" in state_md and "not research" not in state_md  # not a stand-in
    from labrun.paper import author_line
    from labrun.state import load_state, render_state_md
    from labrun.workspace import Workspace

    state = load_state(Workspace(ws))[0].model_copy(update={"agent": "scripted"})  # the stand-in
    assert "not research" in render_state_md(state, str(ws)) and "not research" in author_line("scripted")
    assert "not research" not in author_line("tiny")


def test_a_backend_reads_its_own_transcripts_for_the_rules(tmp_path, monkeypatch):
    """What a phase fetched, as the rules ask it (`toollog`), includes the fetches a backend's
    own transcripts show, read by that backend: with its entry gone they are not read."""
    (tmp_path / "tiny-run-001.jsonl").write_text(
        json.dumps({"url": "https://example.org/a", "ok": True}) + "\n"
        + json.dumps({"url": "https://example.org/b", "ok": False}) + "\n")
    assert toollog.fetched(tmp_path) == set()
    monkeypatch.setitem(registry.BACKENDS, "tiny", tiny_backend.ENTRY)
    assert toollog.fetched(tmp_path) == {"example.org/a"} and toollog.failed(tmp_path) == {"example.org/b"}


def test_each_entry_is_whole_and_reading_it_imports_no_backend():
    """Every path an entry names resolves; reading the registry imported none of them."""
    import subprocess
    import sys

    code = ("import sys; from labrun.agents import registry; from labrun.cli.parsing import parser; parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('labrun.agents.', 'anthropic', 'prefect'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(loaded) == ["labrun.agents.registry"]
    for b in registry.BACKENDS.values():
        for path in (b.factory, b.check, b.tool_runs):
            assert path is None or callable(registry.load(path)), (b.name, path)
        assert b.cost in ("priced", "billed", "free")
        assert not b.priced or b.default_model, f"{b.name}: a backend labrun prices needs a default model"


def test_an_unknown_agent_is_one_line_naming_the_known_ones():
    for call in (lambda: check_agent("codx"), lambda: make_agent("codx"), lambda: require_priced("codx", None, 1.0)):
        with pytest.raises(registry.AgentUnavailable) as refused:
            call()
        assert str(refused.value).startswith("unknown agent 'codx'") and "codex" in str(refused.value)


def test_no_module_but_a_backends_own_names_a_backend():
    """Outside labrun/agents/ and the registry, a backend's name appears in no code: each
    fact of a backend is its entry's (labrun.settings' defaults are the CLIs' executables)."""
    named = []
    for folder in ("labrun", "flows", "phases"):
        for path in (REPO / folder).rglob("*.py"):
            if "agents" in path.relative_to(REPO).parts or path.name == "settings.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in registry.BACKENDS:
                    named.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    templates = [p.name for p in (REPO / "templates").rglob("*.j2")
                 if any(f'"{n}"' in p.read_text() for n in registry.BACKENDS)]
    assert named == [] and templates == []

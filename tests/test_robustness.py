"""Bad input never becomes a traceback or a lost record: fuzzed idea files, fuzzed tool
inputs from the model, damaged journal files; and secrets planted everywhere stay out."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis.utils.conventions import not_set
from hypothesis import strategies as st

from support import DEMO_IDEA, labrun
from labrun.idea import IdeaError, load_idea
from labrun.journal import Conversation, JournalCorrupt, Record
from labrun.session import Session
from labrun.phases.phase import toolbox
from labrun.phase_registry import BY_KEY

# Fixed examples in CI (a green main stays green); fresh ones on every local run.
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=bool(os.environ.get("CI")), database=None if os.environ.get("CI") else not_set)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_as_an_idea_give_an_idea_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("idea") / "idea.yaml"
    path.write_bytes(data)
    try:
        load_idea(path)
    except IdeaError as e:
        assert str(path) in str(e) and "\n" not in str(e)


@FUZZ
@given(json_values)
def test_any_yaml_structure_under_idea_gives_an_idea_or_one_line(tmp_path_factory, value):
    base = yaml.safe_load(DEMO_IDEA.read_text())
    key = sorted(base["idea"])[abs(hash(json.dumps(value, default=str))) % len(base["idea"])]
    base["idea"][key] = value
    path = tmp_path_factory.mktemp("idea") / "idea.yaml"
    path.write_text(yaml.safe_dump(base))
    try:
        load_idea(path)
    except IdeaError as e:
        assert str(path) in str(e) and "\n" not in str(e)


@pytest.fixture(scope="module")
def fuzzed_session(tmp_path_factory):
    """One session for every example Hypothesis draws (`session` is one per test)."""
    s = Session.open(tmp_path_factory.mktemp("fuzz") / "ws", DEMO_IDEA, "scripted")
    yield s
    s.close()


@FUZZ
@given(
    st.sampled_from(["bash", "str_replace_based_edit_tool", "run_experiment", "complete_phase", "nope"]),
    st.dictionaries(
        st.sampled_from(["command", "path", "file_text", "old_str", "new_str", "insert_line", "insert_text",
                         "view_range", "restart", "purpose", "outputs", "metrics_file", "fix_applied",
                         "summary", "sections", "junk"]),
        json_values, max_size=6),
)
def test_any_tool_input_from_the_model_gives_a_result(fuzzed_session, prefect_api, name, raw):
    # Commands are drawn from harmless ones: the fuzzing is of the input's shape.
    if isinstance(raw.get("command"), str):
        raw["command"] = "view" if name == "str_replace_based_edit_tool" else "echo fuzz"
    before = len(fuzzed_session.state.attempts)
    result = toolbox(fuzzed_session, BY_KEY["experiments"]).call(name, raw)
    assert isinstance(result.content, str) and result.content
    after = fuzzed_session.state.attempts
    assert len(after) - before in (0, 1)
    assert all(a.status != "RUNNING" for a in after)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_api):
    ws = tmp_path_factory.mktemp("done") / "ws"
    result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted")
    assert result.returncode == 0, result.stderr
    return ws


@FUZZ
@given(st.data())
def test_a_damaged_journal_is_read_safely_or_reported_with_its_file(finished, tmp_path_factory, data):
    source = finished / ".labrun/phases/experiments/conversation-001.jsonl"
    raw = bytearray(source.read_bytes())
    how = data.draw(st.sampled_from(["truncate", "flip", "garbage-line"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 5))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    else:
        raw += data.draw(st.binary(min_size=1, max_size=50)) + b"\n"
    path = tmp_path_factory.mktemp("journal") / "conversation-001.jsonl"
    path.write_bytes(bytes(raw))
    try:
        convo = Conversation(path, repair=False)
    except JournalCorrupt as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    assert all(isinstance(r, Record) for r in convo.records)
    if how == "truncate":  # every record written whole before the cut is kept, in order
        original = Conversation(source, repair=False).records
        assert convo.records == original[: len(convo.records)]
        assert len(convo.records) >= raw.count(b"\n")
        repaired = Conversation(path)  # repair mode: the file ends a line, ready for appends
        repaired.add_user_text("after the cut")
        assert Conversation(path).records[-1].texts() == ["after the cut"]


def test_a_corrupted_journal_is_reported_and_the_record_kept(finished, tmp_path):
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(finished, ws)
    journal = ws / ".labrun/phases/setup/conversation-001.jsonl"
    lines = journal.read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]
    journal.write_text("\n".join(lines) + "\n")
    state_before = (ws / ".labrun/state.json").read_text()
    result = labrun("status", str(ws))
    assert result.returncode == 2
    assert f"{journal}:2: corrupted journal record" in result.stderr.replace("\n", "")
    assert "Traceback" not in result.stderr
    assert (ws / ".labrun/state.json").read_text() == state_before
    # state.json alone would be recovered from its previous copy (tests/test_cli_errors.py).
    for damaged in (ws / ".labrun/state.json", ws / ".labrun/state.json.prev"):
        damaged.write_text("{not json")
    broken = labrun("status", str(ws))
    assert broken.returncode == 2 and "state.json: it does not parse" in broken.stderr
    assert "no readable previous copy" in broken.stderr
    assert "Traceback" not in broken.stderr


def test_secrets_planted_everywhere_never_come_out(tmp_path, prefect_api):
    from prefect.client.orchestration import get_client

    key = "sk-ant-api03-PLANTEDsecretPLANTEDsecret0123456789"
    token = "ghp_PLANTEDtokenPLANTEDtoken012345678901"
    env_only = "plain-value-of-a-password-9f8e7d"
    idea = yaml.safe_load(DEMO_IDEA.read_text())
    idea["idea"]["hypothesis"] += f" (api key {key}, token {token}, password {env_only})"
    idea["idea"]["title"] = f"Averaging noise with key {key}"
    idea_file = tmp_path / "idea.yaml"
    idea_file.write_text(yaml.safe_dump(idea))
    ws = tmp_path / "ws"
    env = {"ANTHROPIC_API_KEY": key, "GITHUB_TOKEN": token, "DB_PASSWORD": env_only}
    result = labrun("run", str(idea_file), "--workspace", str(ws), "--agent", "scripted", env=env)
    assert result.returncode == 0, result.stderr
    for planted in (key, token, env_only):
        assert planted not in result.stdout + result.stderr
        for path in [ws / "STATE.md", *ws.joinpath(".labrun").rglob("*")]:
            if path.is_file() and path.name != "idea.yaml":
                assert planted not in path.read_text(errors="replace"), path
    assert "[REDACTED]" in (ws / "STATE.md").read_text()
    with get_client(sync_client=True) as client:
        logs = client.read_logs()
        artifacts = client.read_artifacts()
    text = " ".join(l.message for l in logs) + " ".join(json.dumps(a.data, default=str) for a in artifacts)
    for planted in (key, token, env_only):
        assert planted not in text

"""The agent's tools against a real session: confinement, timeouts, attempts, completion."""

from __future__ import annotations

import time

import pytest

from auto_responder import PLAN
from support import running, wait_for
from labrun import tools
from labrun.phases.phase import toolbox
from labrun.tools import ToolBox
from labrun.phase_registry import BY_KEY


def box(session, phase="experiments") -> ToolBox:
    return toolbox(session, BY_KEY[phase])


def test_paths_outside_the_workspace_are_refused_symlinks_included(session, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret plans")
    root = session.ws.root
    (root / "link").symlink_to(outside)
    (root / "dir").symlink_to(tmp_path)
    (root / ".env").write_text("TOKEN=hidden")
    # The weak target: the names as the file system resolves them reach the secret.
    assert all("secret" in (root / p).read_text() for p in ["../outside.txt", str(outside), "link", "dir/outside.txt"])
    b = box(session)
    for path, why in [("../outside.txt", "goes up with '..'"), (str(outside), "absolute path outside the workspace"),
                      ("/etc/passwd", "absolute path outside the workspace"), ("link", "a link"),
                      ("dir/outside.txt", "a link"), (".env", "hidden path"), (f"{root}/link", "a link")]:
        result = b.call("str_replace_based_edit_tool", {"command": "view", "path": path})
        assert result.is_error and why in result.content and "secret" not in result.content, (path, result.content)
        assert len(result.content.splitlines()) == 1, result.content
    for path in ["link", "dir/outside.txt"]:
        write = b.call("str_replace_based_edit_tool", {"command": "create", "path": path, "file_text": "x"})
        assert write.is_error and "a link" in write.content
    assert outside.read_text() == "secret plans" and (root / "link").is_symlink()
    state = b.call("str_replace_based_edit_tool", {"command": "create", "path": "STATE.md", "file_text": "x"})
    assert state.is_error and "engine owns" in state.content


def test_editor_create_view_replace_insert(session):
    b = box(session)
    assert not b.call("str_replace_based_edit_tool", {"command": "create", "path": "a/b.py", "file_text": "x = 1\ny = 2\n"}).is_error
    view = b.call("str_replace_based_edit_tool", {"command": "view", "path": "a/b.py"})
    assert "     1\tx = 1" in view.content
    twice = b.call("str_replace_based_edit_tool", {"command": "create", "path": "a/c.py", "file_text": "z\nz\n"})
    assert not twice.is_error
    ambiguous = b.call("str_replace_based_edit_tool", {"command": "str_replace", "path": "a/c.py", "old_str": "z", "new_str": "w"})
    assert ambiguous.is_error and "2 times" in ambiguous.content
    b.call("str_replace_based_edit_tool", {"command": "str_replace", "path": "a/b.py", "old_str": "y = 2", "new_str": "y = 3"})
    b.call("str_replace_based_edit_tool", {"command": "insert", "path": "a/b.py", "insert_line": 1, "insert_text": "# between"})
    assert (session.ws.root / "a/b.py").read_text() == "x = 1\n# between\ny = 3\n"
    bad = b.call("str_replace_based_edit_tool", {"command": "rename", "path": "a/b.py"})
    assert bad.is_error and "Invalid input" in bad.content


def test_bash_timeout_kills_the_whole_process_group(session, monkeypatch):
    monkeypatch.setattr(tools, "BASH_TIMEOUT_S", 1)
    start = time.monotonic()
    result = box(session).call("bash", {"command": "sleep 300.0417 & sleep 300.0418"})
    assert time.monotonic() - start < 10
    assert "timeout" in result.content
    wait_for(lambda: not running("sleep 300.041"), timeout=5, what="the command's processes to die")


def test_bash_output_is_cut_from_the_middle_and_secrets_never_shown(session, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789abcdef")
    result = box(session).call("bash", {"command": "seq 1 200000; echo KEY=${ANTHROPIC_API_KEY:-unset}; echo sk-ant-test-0123456789abcdef"})
    assert "cut from the middle" in result.content
    assert result.content.startswith("1\n2\n") and "200000" in result.content
    assert "KEY=unset" in result.content  # the agent's environment has no API keys
    assert "sk-ant-test-0123456789abcdef" not in result.content


def test_attempts_fail_for_each_reason_and_failed_commands_are_not_repeated(session, prefect_api):
    b = box(session)
    src = session.ws.root / "run.py"
    src.write_text("raise SystemExit(3)\n")
    first = b.call("run_experiment", {"command": "python3 run.py", "purpose": "exit code"})
    assert "Attempt 1: FAILED" in first.content and "exit code 3" in first.content
    no_fix = b.call("run_experiment", {"command": "python3 other.py", "purpose": "x"})
    assert no_fix.is_error and "fix_applied" in no_fix.content
    repeat = b.call("run_experiment", {"command": "python3 run.py", "purpose": "again", "fix_applied": "nothing"})
    assert repeat.is_error and "Refused, not run" in repeat.content and "attempt 1" in repeat.content
    assert len(session.state.attempts) == 1  # refused calls are not attempts

    src.write_text("import json, math\njson.dump({'loss': math.nan}, open('m.json', 'w'))\n")
    nan = b.call("run_experiment", {"command": "python3 run.py", "purpose": "nan", "fix_applied": "write metrics",
                                    "metrics_file": "m.json"})
    assert "Attempt 2: FAILED" in nan.content and "metric loss is nan" in nan.content
    src.write_text("print('hello')\n")
    missing = b.call("run_experiment", {"command": "python3 run.py", "purpose": "outputs", "fix_applied": "print",
                                        "outputs": ["fig.png"]})
    assert "Attempt 3: FAILED" in missing.content and "fig.png is missing" in missing.content
    src.write_text("import traceback\ntry:\n  1/0\nexcept Exception:\n  traceback.print_exc()\n")
    tb = b.call("run_experiment", {"command": "python3 run.py", "purpose": "tb", "fix_applied": "catch"})
    assert "Attempt 4: FAILED" in tb.content and "ZeroDivisionError" in tb.content
    src.write_text("import json\njson.dump({'acc': 0.9, 'nested': {'f1': 0.8}}, open('m.json', 'w'))\n")
    ok = b.call("run_experiment", {"command": "python3 run.py", "purpose": "ok", "fix_applied": "no error",
                                   "metrics_file": "m.json", "outputs": ["m.json"]})
    assert "Attempt 5: SUCCESS" in ok.content
    last = session.state.attempts[-1]
    assert last.metrics == {"acc": 0.9, "nested.f1": 0.8} and last.outputs == ["m.json"]
    logs = sorted((session.ws.root / ".labrun/attempts").glob("attempt-*.log"))
    assert [p.name for p in logs] == [f"attempt-00{i}.log" for i in range(1, 6)]
    text = (session.ws.root / "STATE.md").read_text()
    assert text.count("### Attempt") == 5 and "- Fix Applied: no error" in text
    assert "run_experiment refused" in text


def test_complete_phase_says_what_is_missing(session, prefect_api):
    b = box(session, "planning")
    result = b.call("complete_phase", {"summary": "done"})
    assert result.is_error
    assert "file planning.md" in result.content and "section research_specification" in result.content
    (session.ws.root / "planning.md").write_text("# plan\n\n" + PLAN)
    ok = b.call("complete_phase", {"summary": "done", "sections": {"research_specification": "Does k cut RMSE?"},
                                   "run_list": [{"id": "R1", "purpose": "p", "conditions": "c",
                                                 "criteria": ["C1", "C2", "C3"]}],
                                   "analysis_outputs": ["results/summary.json"]})
    assert not ok.is_error and b.completed == "done"
    assert session.state.sections["research_specification"] == "Does k cut RMSE?"
    exp = box(session, "experiments").call("complete_phase", {"summary": "x", "sections": {"experiment_results": "r"}})
    assert exp.is_error and "SUCCESS" in exp.content


def test_an_attempt_that_floods_its_output_is_stopped_with_a_clear_error(session, prefect_api, monkeypatch):
    from labrun.phases import attempts

    monkeypatch.setattr(attempts, "MAX_OUTPUT_BYTES", 200_000)
    result = box(session).call("run_experiment", {"command": "yes flood", "purpose": "flood"})
    assert "Attempt 1: FAILED" in result.content
    assert "wrote more than 200000 bytes of output" in result.content


RUN = ("import json, pathlib\n"
       "cfg = json.loads(pathlib.Path('config.json').read_text())\n"
       "pathlib.Path('generated.py').write_text('x = 1\\n')  # the run writes sources of its own\n"
       "pathlib.Path('notes.txt').write_text('ran\\n')\n"
       "pathlib.Path('out').mkdir(exist_ok=True)\n"
       "pathlib.Path('out/m.json').write_text('{}')\n"
       "raise SystemExit(0 if cfg['lr'] < 1 else 2)\n")


def test_a_failed_command_is_refused_while_only_its_own_writes_changed(session, prefect_api):
    """What the failed run wrote itself (.py and .txt files included), its declared outputs
    and its logs are no change; the same command is refused."""
    b, root = box(session), session.ws.root
    (root / "run.py").write_text(RUN)
    (root / "config.json").write_text('{"lr": 5}')
    run = {"command": "python3 run.py", "purpose": "lr", "outputs": ["out/m.json"]}
    assert "Attempt 1: FAILED" in b.call("run_experiment", run).content
    assert (root / "generated.py").is_file() and (root / "notes.txt").is_file()
    again = b.call("run_experiment", {**run, "fix_applied": "tried again"})
    assert again.is_error and "Refused, not run" in again.content and "attempt 1" in again.content
    (root / "out/m.json").unlink()  # a declared output, gone: still no change
    (root / "notes.txt").write_text("edited\n")  # the run's own file: no change either
    assert "Refused, not run" in b.call("run_experiment", {**run, "fix_applied": "again"}).content
    assert len(session.state.attempts) == 1


@pytest.mark.parametrize("changed", ["config.json", "data/train.csv", "NOTES.md", "weights.bin"])
def test_any_other_changed_file_allows_the_same_command_again(session, prefect_api, changed):
    b, root = box(session), session.ws.root
    (root / "run.py").write_text(RUN)
    (root / "config.json").write_text('{"lr": 5}')
    (root / "data").mkdir()
    for name in ("data/train.csv", "NOTES.md", "weights.bin"):
        (root / name).write_text("v1\n")
    run = {"command": "python3 run.py", "purpose": "lr"}
    assert "Attempt 1: FAILED" in b.call("run_experiment", run).content
    (root / changed).write_text('{"lr": 0.1}' if changed == "config.json" else "v2\n")
    retry = b.call("run_experiment", {**run, "fix_applied": f"changed {changed}"})
    assert not retry.is_error and "Attempt 2:" in retry.content
    assert ("Attempt 2: SUCCESS" in retry.content) == (changed == "config.json")


def test_the_editor_lists_the_workspace_however_it_is_named(session):
    b = box(session)
    (session.ws.root / "notes.md").write_text("x\n")
    for path in (".", "./", str(session.ws.root), f"{session.ws.root}/"):
        listed = b.call("str_replace_based_edit_tool", {"command": "view", "path": path})
        assert not listed.is_error and "notes.md" in listed.content and ".labrun" not in listed.content, path

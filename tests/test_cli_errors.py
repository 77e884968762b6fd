"""What a new user meets: one line that says what is wrong (a workspace that is a file, a
read-only workspace, a damaged state.json) and never a traceback; help that names every
default; and a run that prints nothing of Prefect's own."""

from __future__ import annotations

import json

import pytest

from support import DEMO_IDEA, REPO, labrun, tmpfs
from labrun.flows.session import research_session
from labrun.status import session_status


def one_line(result) -> str:
    text = result.stderr.strip()
    assert "Traceback" not in text and text.count("\n") == 0, text
    return text


def test_a_workspace_that_is_a_file_is_refused_in_one_line(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    for args in (("run", str(DEMO_IDEA), "--workspace", str(afile)), ("resume", str(afile)),
                 ("status", str(afile)), ("demo", str(afile))):
        result = labrun(*args, env={"LABRUN_SCRIPTED_FAULTS": ""})
        assert result.returncode == 2, (args, result.stderr)
        assert f"{afile}: is a file" in one_line(result)
    assert afile.read_text() == "mine\n"


@pytest.fixture
def read_only_folder(tmp_path):
    """A read-only filesystem (root may write any folder whatever its mode bits)."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        yield mount


def test_a_read_only_workspace_is_refused_before_anything_starts(read_only_folder):
    for ws in (read_only_folder, read_only_folder / "new"):
        result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                        env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})  # nothing may talk to it
        assert result.returncode == 2, result.stderr
        line = one_line(result)
        assert f"{ws}: cannot write to" in line and "Read-only file system" in line, line
        assert "resume" not in line and "Prefect" not in result.stdout + result.stderr


@pytest.mark.parametrize("damage", [b"", b'{"session_id": "abc", "tit', b"\xff\xfe{}\n"],
                         ids=["empty", "truncated", "not-utf-8"])
def test_a_damaged_state_json_is_recovered_from_its_previous_copy(damage, tmp_path, prefect_api, monkeypatch):
    ws = tmp_path / "ws"
    monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", "raise@implementation:2")
    assert research_session(str(DEMO_IDEA), str(ws), "scripted", return_state=True).is_failed()
    state_file = ws / ".labrun" / "state.json"
    state_file.write_bytes(damage)

    status = labrun("status", str(ws), "--json")
    assert status.returncode == 0, status.stderr
    assert "state.json was damaged" in status.stderr and "recovered the previous good copy" in status.stderr
    assert json.loads(status.stdout)["phases"][0]["status"] == "DONE"
    assert state_file.read_bytes() == damage  # a reading command writes nothing

    resumed = labrun("resume", str(ws), env={"LABRUN_SCRIPTED_FAULTS": ""})
    assert resumed.returncode == 0, resumed.stderr
    assert "recovered the previous good copy" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert session_status(ws)["session"]["complete"]
    assert "recovered the previous good copy" in (ws / "STATE.md").read_text()


def test_a_state_json_damaged_with_its_copy_is_one_line(tmp_path, prefect_api, monkeypatch):
    ws = tmp_path / "ws"
    monkeypatch.setenv("LABRUN_SCRIPTED_FAULTS", "raise@setup:1")
    research_session(str(DEMO_IDEA), str(ws), "scripted", return_state=True)
    for name in ("state.json", "state.json.prev"):
        (ws / ".labrun" / name).write_text("{")
    for args in (("status", str(ws)), ("resume", str(ws)), ("run", str(DEMO_IDEA), "--workspace", str(ws))):
        result = labrun(*args)
        assert result.returncode == 2, (args, result.stderr)
        line = one_line(result)
        assert "state.json: it does not parse" in line and "no readable previous copy" in line, line


def test_help_names_every_default_and_the_environment():
    run = " ".join(labrun("run", "--help").stdout.split())
    assert "anthropic for a new session" in run and "claude-opus-5-5" in run
    assert "ANTHROPIC_API_KEY" in run and "PREFECT_API_URL" in run and "LABRUN_MIN_FREE_MB" in run
    server = " ".join(labrun("server", "--help").stdout.split())
    assert "(default: 4200)" in server and "(default: 90)" in server
    # Each command names the variables it reads, and no others.
    assert "environment:" not in labrun("status", "--help").stdout
    queue = labrun("queue", "--help").stdout
    assert "PREFECT_API_URL" in queue and "ANTHROPIC_API_KEY" not in queue
    from labrun.cli.parsing import VARIABLES

    source = "\n".join(p.read_text() for folder in ("labrun", "flows", "phases")
                       for p in (REPO / folder).rglob("*.py") if p.name not in ("parsing.py", "registry.py"))
    assert [name for name in VARIABLES if name not in source and name != "PREFECT_HOME"] == []
    rerun = " ".join(labrun("rerun", "--help").stdout.split())
    assert "planning, setup, implementation, experiments, analysis, documentation" in rerun
    from labrun.cli.parsing import parser

    for command in parser()._subparsers._group_actions[0].choices.values():
        for action in command._actions:
            assert action.help, (command.prog, action.dest)
    assert labrun("--version").stdout.strip() == "labrun 0.1.0"


def test_a_notify_url_that_is_not_a_webhook_is_refused_before_a_server_starts():
    result = labrun("server", "--notify", "hooks.example.org/T0", "--port", "1")
    assert result.returncode == 2
    assert one_line(result) == "labrun: --notify: give the webhook's http:// or https:// URL"

"""labrun's LABRUN_* settings (labrun.settings): read at each use (the retry delays at import,
which Prefect fixes), so a variable set in the environment is seen without a re-import; an
empty value means the default where it always did; a value that does not parse stops the
command line in one line naming the variable; and docs/running.md's table is the one the
settings generate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import DEMO_IDEA, REPO, labrun
from labrun import settings as settings_module
from labrun import snapshot, windows
from labrun.agents.anthropic import model_name
from labrun.agents.registry import BACKENDS
from labrun.settings import BadSetting, Settings, settings, table
from labrun.workspace import Workspace


def test_the_docs_table_is_the_one_the_settings_generate():
    doc = (REPO / "docs/running.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `LABRUN_")]
    assert rows == [line for line in table().splitlines() if line.startswith("| `LABRUN_")], \
        "docs/running.md's Environment variables: paste `python -m labrun.settings`"
    assert table() in doc
    printed = subprocess.run([sys.executable, "-m", "labrun.settings"], capture_output=True, text=True, check=True)
    assert printed.stdout == table()


def test_every_field_says_what_it_does_and_the_help_uses_it():
    from labrun.cli.parsing import VARIABLES

    for name, field in Settings.model_fields.items():
        assert field.description and "\n" not in field.description, name
    assert VARIABLES["LABRUN_MIN_FREE_MB"] == Settings.model_fields["min_free_mb"].description
    assert BACKENDS["anthropic"].default_model in VARIABLES["LABRUN_MODEL"]


def test_a_variable_set_in_the_environment_is_seen_without_a_reimport(monkeypatch, tmp_path):
    ws = Workspace(tmp_path)
    monkeypatch.setenv("LABRUN_MIN_FREE_MB", "0")
    assert settings().min_free_mb == 0 and not ws.nearly_full()
    monkeypatch.setenv("LABRUN_MIN_FREE_MB", str(10**12))
    assert ws.nearly_full()
    monkeypatch.setenv("LABRUN_HASH_MAX_MB", "1")
    assert snapshot.big_file_bytes() == 1 << 20
    monkeypatch.setenv("LABRUN_KEEP_MAX_MB", "0.5")
    assert snapshot.kept_file_bytes() == 1 << 19
    monkeypatch.setenv("LABRUN_MIN_WINDOW_WAIT_S", "0")
    assert windows.min_wait_s() == 0
    monkeypatch.delenv("LABRUN_MIN_WINDOW_WAIT_S")
    assert windows.min_wait_s() == 60


def test_an_empty_value_means_the_default_where_it_did(monkeypatch):
    for name in ("LABRUN_PHASE_TIMEOUT_S", "LABRUN_MIN_WINDOW_WAIT_S", "LABRUN_MODEL", "LABRUN_CRASH_AT",
                 "LABRUN_PASS_ENV", "LABRUN_CLI_PIDNS", "LABRUN_CONTEXT_MANAGEMENT", "LABRUN_MODEL_API_LIMIT"):
        monkeypatch.setenv(name, "")
    s = settings()
    assert s.phase_timeout_s == 21600  # six hours
    assert s.min_window_wait_s == 60 and windows.min_wait_s() == 60
    assert s.model is None and model_name() == BACKENDS["anthropic"].default_model
    assert s.crash_at == "" and s.pass_env == ""
    assert s.cli_pidns and s.context_management and not s.model_api_limit
    # where an empty value was passed on as it is, it still is (the read site judges it)
    monkeypatch.setenv("LABRUN_CLAUDE_PERMISSIONS", "")
    monkeypatch.setenv("LABRUN_GEMINI_MAX_ATTEMPTS", "")
    assert settings().claude_permissions == "" and settings().gemini_max_attempts == ""
    # a number that never had an empty meaning is a bad value, as it was (a ValueError then)
    monkeypatch.setenv("LABRUN_CLI_GRACE_S", "")
    with pytest.raises(BadSetting, match="LABRUN_CLI_GRACE_S=''"):
        settings()


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("No", False), ("FALSE", False),
                                       ("on", True), ("1", True), ("yes", True)])
def test_switches_are_off_only_when_said(monkeypatch, value, on):
    monkeypatch.setenv("LABRUN_CLI_PIDNS", value)
    monkeypatch.setenv("LABRUN_CONTEXT_MANAGEMENT", value)
    monkeypatch.setenv("LABRUN_MODEL_API_LIMIT", value)
    s = settings()
    assert s.cli_pidns is on and s.context_management is on
    assert s.model_api_limit is (value == "on")  # exactly `on`, as prefect.yaml sets it


def test_settings_are_built_again_only_when_a_labrun_variable_changed(monkeypatch):
    monkeypatch.setenv("LABRUN_SCRIPTED_LATENCY_S", "0.25")
    first = settings()
    assert first is settings() and first.scripted_latency_s == 0.25
    monkeypatch.setenv("UNRELATED_TO_LABRUN", "x")
    assert settings() is first
    monkeypatch.setenv("LABRUN_SCRIPTED_LATENCY_S", "0.5")
    assert settings().scripted_latency_s == 0.5
    assert settings_module.variable("scripted_latency_s") == "LABRUN_SCRIPTED_LATENCY_S"


def test_a_bad_value_is_one_line_naming_the_variable_and_nothing_is_written(tmp_path):
    ws = tmp_path / "ws"
    result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                    env={"LABRUN_MIN_FREE_MB": "abc"})
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "Traceback" not in line and line.count("\n") == 0, line
    assert "LABRUN_MIN_FREE_MB='abc'" in line, line
    assert not ws.exists()

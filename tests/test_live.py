"""A running attempt seen while it runs (labrun.live): STATE.md, `labrun status` and its
`--json`, the terminal of `labrun run` and the UI's artifacts each show its elapsed time, its
GPUs and the last lines of its log, read from a real command under the real supervisor; the
log's secrets redacted, its escape sequences escaped at the terminal, a link at its path not
followed."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
from rich.console import Console

from support import labrun, wait_for
from labrun import artifacts
from labrun.cli.display import Doing
from labrun.commands import start_supervised
from labrun.live import live, running
from labrun.session import Session
from labrun.state import parse_state_md
from labrun.tools import RunExperimentInput

SECRET = "tok-4242424242-livesecret"
LOG = (r"printf 'step 1\nstep 2\nkey %s\n\033]0;pwned\007title\nprogress 10%%\rprogress 90%%\n"
       r"\033[31mlast line\n' " f"{SECRET}; sleep 60")
WAITING = "waiting for 1 GPU (2 in use)"


@pytest.fixture
def attempt(tmp_path, monkeypatch):
    """A session whose attempt 1 runs a real command under the real supervisor, holding GPUs
    0 and 1, once its log holds all it prints; attempt 2 waits for a GPU."""
    from support import DEMO_IDEA

    monkeypatch.setenv("LAB_SERVICE_TOKEN", SECRET)  # a secret of the environment: redacted everywhere
    session = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    records = session.records
    records.new("experiments", RunExperimentInput(command=LOG, purpose="p"), {})
    records.update(1, gpus=["0", "1"])
    records.new("experiments", RunExperimentInput(command="python3 train.py", purpose="q"), {})
    session.ws.write_json(records.run_path(2), {"waiting": WAITING})
    folder = session.ws.files.open(session.ws.attempts, os.O_RDONLY | os.O_DIRECTORY)
    try:
        supervised = start_supervised(LOG, session.ws.root, session.ws.attempt_log(1), folder,
                                      records.supervisor_path(1).name, records.supervised(1).read,
                                      timeout_s=120, max_output_bytes=1 << 20)
    finally:
        os.close(folder)
    try:
        wait_for(lambda: b"last line" in session.ws.attempt_log(1).read_bytes(), 30, "the command's output")
        yield session, supervised
    finally:
        supervised.stop()
        session.close()


def test_the_live_view_has_the_elapsed_time_the_gpus_and_the_logs_last_lines_redacted(attempt):
    session, _ = attempt
    one, two = running(session.ws, session.state.attempts)
    assert one.stage == "running" and one.gpus == ["0", "1"]
    assert one.started is not None and 0 <= one.elapsed_s < 60
    later = live(session.ws, session.state.attempts[0], now=one.started + 125)
    assert later.elapsed_s == 125
    # the last five lines, as a terminal left them (the progress line drawn over), redacted
    assert one.tail == ["step 2", "key [REDACTED]", "\\x1b]0;pwned\\x07title", "progress 90%", "\\x1b[31mlast line"]
    assert two.stage == "waiting" and two.waiting == WAITING and two.elapsed_s is None and two.tail == []


def test_state_md_is_rendered_again_while_an_attempt_runs(attempt):
    session, _ = attempt
    shows_the_tail = lambda: "      \\x1b[31mlast line" in session.ws.state_md.read_text()  # noqa: E731
    assert not shows_the_tail()  # the last save came before the command started
    session.store.follow_attempts(interval_s=0.1)
    wait_for(shows_the_tail, 10, "STATE.md rendered again")
    text = session.ws.state_md.read_text()
    attempts = parse_state_md(text)["Experiment Attempts"]
    assert re.search(r"- Now: running \d+ s · GPUs 0, 1 · started \d{4}-\d\d-\d\d [\d:]+ UTC", attempts)
    assert "      progress 90%\n      \\x1b[31mlast line\n" in attempts  # indented: no line of it opens a section
    assert f"- Now: {WAITING}" in attempts
    assert SECRET not in text and "[REDACTED]" in text and "\x1b" not in text  # safe to `cat`

    session.records.update(1, status="SUCCESS")
    session.records.update(2, status="FAILED")
    assert "- Now:" not in session.ws.state_md.read_text()  # recorded: nothing runs


def test_labrun_status_shows_each_running_attempt_escaped(attempt):
    session, _ = attempt
    report = json.loads(labrun("status", str(session.ws.root), "--json").stdout)
    one, two = report["running"]
    assert (one["n"], one["stage"], one["gpus"]) == (1, "running", ["0", "1"]) and one["elapsed_s"] > 0
    assert one["tail"][-1] == "\\x1b[31mlast line" and one["line"].startswith("running ")
    assert (two["n"], two["waiting"], two["line"]) == (2, WAITING, WAITING)
    assert report["attempts"][0]["gpus"] == ["0", "1"]

    shown = labrun("status", str(session.ws.root)).stdout
    assert re.search(r"attempt 1 \(experiments\): running \d+ s · GPUs 0, 1 · printf", shown)
    assert "│ \\x1b[31mlast line" in shown and "│ \\x1b]0;pwned\\x07title" in shown
    assert "\x1b" not in shown and SECRET not in shown and "key [REDACTED]" in shown
    assert f"attempt 2 (experiments): {WAITING}" in shown


def test_the_terminal_of_a_run_has_a_line_per_running_attempt(attempt):
    session, _ = attempt
    doing = Doing(str(session.ws.root))
    doing.text = "phase 4 of 6 · experiments · the model's turn 3"
    screen = io.StringIO()
    Console(file=screen, width=200, force_terminal=True, color_system=None).print(doing)
    lines = screen.getvalue().splitlines()
    assert lines[0] == "phase 4 of 6 · experiments · the model's turn 3"
    assert re.fullmatch(r"attempt 1: running \d+ s · GPUs 0, 1 · \\x1b\[31mlast line", lines[1].rstrip())
    assert lines[2].rstrip() == f"attempt 2: {WAITING}"


def test_the_uis_artifacts_show_the_running_attempts(attempt):
    session, _ = attempt
    publisher = artifacts.SessionArtifacts(session)
    views = publisher.views()
    assert publisher.running
    now = views["attempts"]["running now"]
    assert re.fullmatch(r"running \d+ s · GPUs 0, 1 · \\x1b\[31mlast line", now[0]) and now[1] == WAITING
    assert "progress 90%" in views["state"] and SECRET not in repr(views)


def test_a_link_at_the_logs_path_is_not_followed(attempt, tmp_path):
    session, _ = attempt
    outside = tmp_path / "outside.txt"
    outside.write_text("what the link points at\n")
    log = session.ws.attempt_log(2)
    log.symlink_to(outside)
    view = live(session.ws, session.state.attempts[1])
    assert view.tail == [] and view.waiting == WAITING


def test_an_attempt_whose_supervisor_is_gone_says_so(attempt):
    session, supervised = attempt
    supervised.stop()  # the supervisor killed first: it reports no end
    wait_for(lambda: live(session.ws, session.state.attempts[0]).stage == "gone", 10, "the supervisor gone")
    assert live(session.ws, session.state.attempts[0]).elapsed_s is None



def test_a_long_logs_tail_shows_no_part_of_a_secret_it_cut_and_the_last_drawing_of_a_progress_bar(tmp_path, monkeypatch):
    from labrun.live import TAIL_BYTES, tail
    from labrun.workspace import Workspace

    monkeypatch.setenv("LAB_SERVICE_TOKEN", SECRET)
    ws = Workspace(tmp_path)
    drawn = "".join(f"\rtraining {i}%" for i in range(1, 101)) + "\n"  # a progress bar, then its newline
    rest = "." * (TAIL_BYTES - len(SECRET) + 5 - 1 - len(drawn)) + drawn
    assert len(SECRET[5:] + "\n" + rest) == TAIL_BYTES  # what is read starts inside the secret
    ws.root.joinpath("cut.log").write_text("x" * 100 + "\n" + SECRET + "\n" + rest)
    assert tail(ws, "cut.log") == ["training 100%"]
    bar = "".join(f"\rtraining {i}%" for i in range(1, 2000))  # a progress bar longer than what is read
    ws.root.joinpath("bar.log").write_text("start\n" + bar)
    assert tail(ws, "bar.log") == ["training 1999%"]


def test_the_ui_is_updated_while_an_attempt_runs_with_no_save(attempt, monkeypatch):
    session, _ = attempt
    sent = []
    monkeypatch.setattr(artifacts, "LIVE_INTERVAL_S", 0.2)
    monkeypatch.setattr(artifacts.SessionArtifacts, "_create", lambda self: self.views())
    monkeypatch.setattr(artifacts.SessionArtifacts, "_update", lambda self: sent.append(self.views()["attempts"]))
    publisher = artifacts.SessionArtifacts.attach(session, interval_s=0.05)
    try:
        wait_for(lambda: len(sent) >= 3, 10, "the running attempts sent again")
    finally:
        publisher.close()
    assert "GPUs 0, 1" in sent[0]["running now"][0]


def test_a_run_at_a_terminal_shows_its_running_attempt_under_the_spinner(tmp_path, prefect_api):
    """`labrun run` at a terminal, an attempt of the demo running a few seconds: the line under
    the spinner says how long it has run."""
    from support import DEMO_IDEA
    from terminal import Terminal

    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160",
           "LABRUN_SCRIPTED_FAULTS": "slow-attempt@experiments:3"}
    term = Terminal("run", str(DEMO_IDEA), "--workspace", str(tmp_path / "ws"), "--agent", "scripted", env=env)
    try:
        assert term.wait(timeout=240) == 0, term.output[-3000:]
    finally:
        term.close() if term.proc.poll() is None else os.close(term.master)
    assert re.search(r"\n\s*attempt \d+: running [1-9] s", term.output), term.output[-3000:]

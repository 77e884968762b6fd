"""What a study hands on and what it says before it runs: `labrun results` across a folder of
sessions, `labrun export` of one (through `labrun.wsfs`: a link the agent made is never
followed), the cost and time `labrun check` and a new run state first, the demo's plot, and a
review's Markdown rendered at a terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import tarfile

import pytest

from support import DEMO_IDEA, labrun
from terminal import Terminal


@pytest.fixture(scope="module")
def sessions(tmp_path_factory, prefect_api):
    """A folder of two sessions, as `labrun queue --workspaces` makes: a finished demo, and one
    stopped for review after planning."""
    folder = tmp_path_factory.mktemp("queue")
    assert labrun("demo", str(folder / "demo-1")).returncode == 0
    waiting = labrun("run", str(DEMO_IDEA), "--workspace", str(folder / "demo-2"), "--agent", "scripted",
                     "--review-after", "planning")
    assert waiting.returncode == 3, waiting.stderr
    return folder


def test_results_is_one_line_per_session_in_80_columns_and_json_or_csv_for_machines(sessions):
    shown = labrun("results", str(sessions), env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if "│" in line or "┃" in line), shown.stdout
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2, shown.stdout
    # two sessions of one idea: named by their folders
    assert re.match(r"│ demo-1 +│ complete +│ 3/3 │ 0 +│ 0 │ yes +│ \$0\.00 │ max_abs_slope_error", rows[0]), \
        rows[0]
    assert re.match(r"│ demo-2 +│ awaits review │ 0/3 │", rows[1]), rows[1]

    data = json.loads(labrun("results", str(sessions), "--json").stdout)
    assert [(r["state"], r["met"], r["reproduced"]) for r in data] == [("complete", 3, True), ("awaits review", 0, None)]
    assert data[0]["claims"][0] == {"id": "K1", "metric": "max_abs_slope_error", "value": 0.0027,
                                    "standing": "reproduced"}
    table = list(csv.DictReader(io.StringIO(labrun("results", str(sessions), "--csv").stdout)))
    assert table[0]["idea"] == "demo_noise_averaging" and table[0]["met"] == "3"
    assert "K2 max_rel_gap=0.0308" in table[0]["claims"]

    empty = labrun("results", str(sessions / "demo-1" / "src"))
    assert empty.returncode == 2 and "no labrun session in it or in the folders under it" in empty.stderr


def test_export_bundles_the_study_without_engine_caches_or_keys_and_follows_no_link(sessions, tmp_path):
    ws = tmp_path / "study"
    shutil.copytree(sessions / "demo-1", ws, symlinks=True)
    secret = tmp_path / "outside" / "key.txt"
    secret.parent.mkdir()
    secret.write_text("the secret outside the workspace\n")
    (ws / "results" / "notes.txt").symlink_to(secret)  # a link the agent made, to a file outside
    (ws / "secrets_dir").symlink_to(secret.parent, target_is_directory=True)
    (ws / ".env").write_text("API_KEY=abc\n")
    (ws / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\nxyz\n-----END PRIVATE KEY-----\n")
    (ws / "src" / "__pycache__").mkdir()
    (ws / "src" / "__pycache__" / "experiment.cpython-311.pyc").write_bytes(b"\0")
    (ws / "env" / "lib").mkdir(parents=True)
    (ws / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    token = "sk-ant-api03-" + "x" * 40  # a key the redaction knows by its shape
    (ws / "results" / "log.txt").write_text(f"called the API with {token}\n")

    bundle = tmp_path / "out" / "study.tar.gz"
    bundle.parent.mkdir()
    done = labrun("export", str(ws), "--to", str(bundle))
    assert done.returncode == 0, done.stderr
    assert "left out: results/notes.txt (a link, not followed)" in done.stdout
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        log = tar.extractfile("study/results/log.txt").read().decode()  # type: ignore[union-attr]
        every = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
    for wanted in ("REPORT.md", "README.md", "STATE.md", "requirements.txt", "planning.md", "src/experiment.py",
                   "results/metrics.json", "results/rmse_vs_k.svg", "IDEA.yaml"):
        assert f"study/{wanted}" in names, names
    assert not [n for n in names if re.search(r"\.labrun|__pycache__|\.env|\.pem|/env/|notes\.txt|secrets_dir", n)], names
    assert all(tarfile.TarInfo.isfile(m) for m in tarfile.open(bundle).getmembers())  # no link in the bundle
    assert b"the secret outside the workspace" not in every
    assert "sk-ant-api03-" not in log and "[REDACTED]" in log

    again = labrun("export", str(ws), "--to", str(bundle))
    assert again.returncode == 2 and "already exists; labrun does not overwrite it" in again.stderr
    inside = labrun("export", str(ws), "--to", str(ws / "x.tar.gz"))
    assert inside.returncode == 2 and "inside the workspace" in inside.stderr
    assert labrun("export", str(tmp_path / "none")).returncode == 2


def test_export_redacts_every_file_and_the_sessions_own_keys_and_prints_no_escape(sessions, tmp_path):
    """A key passed with --pass-env under a name not like a secret's is redacted (the export
    declares the session's keys, as the session does), in a file that is not UTF-8 too; a file
    too large to check is left out, not shipped unchecked; a name holding an escape sequence
    is printed escaped, not run by the terminal."""
    ws = tmp_path / "study"
    shutil.copytree(sessions / "demo-1", ws, symlinks=True)
    state_file = ws / ".labrun" / "state.json"
    saved = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**saved, "pass_env": ["SERVICE_ACCESS"]}))
    access = "svc-access-0123456789"
    (ws / "results" / "blob.bin").write_bytes(b"\xff\x00" + access.encode() + b"\xfe")
    with open(ws / "results" / "big.dat", "wb") as big:
        big.truncate((8 << 20) + 1)
    (ws / "results" / "\x1b]0;owned\x07\x1b[2Jname.txt").write_text("sk-ant-api03-" + "x" * 40 + "\n")
    (ws / "results" / "\x1b[31mlink").symlink_to("/etc/hostname")

    bundle = tmp_path / "study.tar.gz"
    done = labrun("export", str(ws), "--to", str(bundle), env={"SERVICE_ACCESS": access})
    assert done.returncode == 0, done.stderr
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        blob = tar.extractfile("study/results/blob.bin").read()  # type: ignore[union-attr]
        every = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
    assert blob == b"\xff\x00[REDACTED]\xfe" and access.encode() not in every and b"sk-ant-" not in every
    assert "study/results/big.dat" not in names
    assert "left out: results/big.dat (over 8 MiB: not checked for secrets, left out)" in done.stdout
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout
    assert "results/\\x1b]0;owned\\x07\\x1b[2Jname.txt: secrets redacted" in done.stdout
    assert "left out: results/\\x1b[31mlink (a link, not followed)" in done.stdout
    assert "results/blob.bin: secrets redacted" in done.stdout


def test_check_and_a_new_run_say_what_the_session_may_cost_and_take(tmp_path):
    checked = labrun("check", str(DEMO_IDEA), env={"LABRUN_MODEL": "claude-sonnet-4-6"})
    assert checked.returncode == 0, checked.stderr
    out = " ".join(checked.stdout.split())
    # 260 turns (30+40+60+60+40+30) × (160k prompt tokens × $3.75 + 16k reply tokens × $15) per million
    assert "no budget set, so only the turn limits stop the spending" in out
    assert "260 turns, each with a prompt of about 160k tokens and a reply of 16k, at claude-sonnet-4-6's " \
           "prices: $218, a bound" in out
    assert "the idea's limit of 10 min is the agent's clock" in out and "each experiment attempt at 10 min" in out
    idea = tmp_path / "budgeted.yaml"
    idea.write_text(DEMO_IDEA.read_text().replace("    budget: 0\n", "    budget: 0\n    agent_budget: 7.5\n"))
    checked = labrun("check", str(idea))
    assert "model cost: at most about $7.50, the agent's budget" in " ".join(checked.stdout.split()), checked.stdout
    # a new run says it first, before anything else can stop it (here: no key for the agent)
    keyless = {k: "" for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")}
    started = labrun("run", str(idea), "--workspace", str(tmp_path / "ws"), "--budget-usd", "3", env=keyless)
    assert started.stdout.startswith("model cost: at most about $3.00, the agent's budget"), started.stdout
    assert "time: the idea's limit of 10 min" in started.stdout and started.returncode == 2, started.stderr


def test_the_demos_plot_has_axes_ticks_labels_and_a_legend(sessions):
    svg = (sessions / "demo-1" / "results" / "rmse_vs_k.svg").read_text()
    assert "k, measurements averaged (log scale)" in svg and "RMSE (log scale)" in svg
    assert all(f">{k}</text>" in svg for k in (1, 2, 4, 256))
    assert all(label in svg for label in ("Gaussian noise", "uniform noise", "sigma/sqrt(k)"))


def test_review_renders_its_markdown_at_a_terminal_and_leaves_it_plain_in_a_pipe(sessions):
    ws = sessions / "demo-2"
    piped = labrun("review", str(ws))
    assert piped.returncode == 0, piped.stderr
    headings = re.findall(r"^#+ (.+)$", piped.stdout, re.M)
    assert headings, piped.stdout
    term = Terminal("review", str(ws), env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"})
    assert term.wait(timeout=60) == 0, term.output
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.output)
    assert headings[0] in plain
    assert not re.search(r"^#+ ", plain, re.M), plain  # rendered: no Markdown marks left

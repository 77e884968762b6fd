"""NeuriCo's whole pipeline as phases: `--with resources,paper` sessions on a real (embedded)
Prefect, with the scripted agent and with the real SDK against the fake Messages API. They
complete, resume after a `kill -9` in each new phase, skip their finished phases in a fresh
flow run (what a Retry from the UI or a deployment re-run is), and write the paper without
TeX when there is none."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from support import attempt_group, DEMO_IDEA, group_alive, kill_attempt_supervisor, start_labrun, wait_for
from web_host import serving
from labrun.sandbox import bubblewrap

from labrun import latex
from labrun.journal import Conversation, ReplyRecord
from labrun.state import parse_state_md, phase_table
from labrun.status import session_status

EIGHT = ["resources", "planning", "setup", "implementation", "experiments", "analysis",
         "documentation", "paper"]


@pytest.fixture
def served_paper(tmp_path):
    """A web server with one PDF on it, where agent commands reach it (tests/web_host.py):
    the reference the idea names."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "averaging.pdf").write_bytes(b"%PDF-1.4\n% a paper about averaging\n")
    with serving(folder, "averaging.pdf") as url:
        yield f"{url}/averaging.pdf"


def idea_file(folder: Path, url: str | None, **metadata) -> Path:
    """The demo idea with a reference to fetch and, in `metadata`, what the idea asks for."""
    doc = yaml.safe_load(DEMO_IDEA.read_text())
    if url:
        doc["idea"]["background"]["papers"] = [{"url": url, "description": "Averaging, the known result"}]
    doc["idea"]["metadata"].update(metadata)
    path = folder / "idea.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def runs(ws: Path) -> dict[str, int]:
    return {p["key"]: p["runs"] for p in session_status(ws)["phases"]}


def replies(ws: Path, phase: str) -> list[ReplyRecord]:
    return [r for f in Conversation.files(ws / ".labrun/phases" / phase) for r in Conversation(f, repair=False).of(ReplyRecord)]


def kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def assert_paper_done(ws: Path, compiled: bool) -> None:
    sections = parse_state_md((ws / "STATE.md").read_text())
    assert "paper/main.tex" in sections["Paper"]
    assert ("not compiled" in sections["Paper"]) != compiled
    assert (ws / "paper/main.pdf").is_file() == compiled
    latexmk = [a for a in session_status(ws)["attempts"] if a["phase"] == "paper"]
    if compiled:  # the scripted agent's first source has an error, fixed as an attempt
        assert [a["status"] for a in latexmk][-2:] == ["FAILED", "SUCCESS"]
        assert "Undefined control sequence" in latexmk[-2]["error"]
        assert latexmk[-1]["fix_applied"]
    else:
        assert latexmk == []


# -- the scripted agent ---------------------------------------------------------------------


def test_kill_9_in_each_new_phase_then_resume_and_a_fresh_run_finds_nothing_to_do(tmp_path, prefect_api, served_paper,
                                                                              cli):
    """An idea asking for both phases (and the AMS style), its session killed in resources'
    second turn, then in the paper's compile (its second turn when there is no TeX): each
    resume redoes no finished phase and no completed turn, and leaves no process of the
    killed engine behind; then a fresh flow run of the session (a deployment re-run, a
    scheduled run) finds all eight finished and writes nothing."""
    from labrun.flows.session import research_session

    ws = tmp_path / "ws"
    idea = idea_file(tmp_path, served_paper, with_phases=["resources", "paper"], paper_style="ams")
    tex = latex.toolchain() is not None
    paper_fault = "hang-attempt@paper:3" if tex else "hang@paper:2"
    env = {"LABRUN_SCRIPTED_FAULTS": f"hang@resources:2,{paper_fault}"}
    start = ("run", str(idea), "--workspace", str(ws), "--agent", "scripted")

    proc = start_labrun(*start, env=env)
    wait_for((ws / ".labrun/faults/resources-2.reached").exists, what="resources turn 2")
    kill(proc)
    assert phase_table((ws / "STATE.md").read_text())["resources"] == "IN PROGRESS"
    assert len(replies(ws, "resources")) == 1

    proc = start_labrun("resume", str(ws), env=env)
    marker = ws / f".labrun/faults/{paper_fault.split('@')[1].replace(':', '-')}.reached"
    wait_for(marker.exists, timeout=240, what="the paper phase's fault")
    pgid = None
    if tex:
        wait_for(lambda: attempt_group(ws), what="the latexmk attempt's process group")
        pgid = attempt_group(ws)
    kill(proc)
    assert runs(ws)["resources"] == 2 and runs(ws)["documentation"] == 1
    if pgid:  # the attempt outlives the engine, not its supervisor (killed here, as a reboot would)
        kill_attempt_supervisor(ws)
    if pgid and bubblewrap():  # the sandbox dies with its supervisor (its lifeline)
        wait_for(lambda: not group_alive(pgid), timeout=10, what="the latexmk attempt to die with its supervisor")

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    if pgid:
        assert not group_alive(pgid)
    assert runs(ws) == {**{k: 1 for k in EIGHT}, "resources": 2, "paper": 2}
    # Each completed turn was answered once: the turn cut off by the kill is the only repeat.
    assert len(replies(ws, "resources")) == 3
    attempts = session_status(ws)["attempts"]
    if tex:
        assert [a["status"] for a in attempts if a["phase"] == "paper"][0] == "INTERRUPTED"
    assert "- Status: RUNNING" not in (ws / "STATE.md").read_text()
    assert_paper_done(ws, compiled=tex)

    report = session_status(ws)
    assert [p["key"] for p in report["phases"]] == EIGHT and report["session"]["paper_style"] == "ams"
    text = (ws / "STATE.md").read_text()
    assert phase_table(text) == {k: "DONE" for k in EIGHT}
    assert "Phase 1 of 8 — resources: DONE" in text and "Phase 8 of 8 — paper: DONE" in text
    sections = list(parse_state_md(text))
    assert sections.index("Literature and Resources") < sections.index("Research Specification")
    assert sections[-1] == "Paper"
    # The resources phase really fetched the idea's reference, and cites it.
    assert (ws / "papers/source-1.pdf").read_bytes().startswith(b"%PDF")
    assert served_paper in (ws / "literature_review.md").read_text()
    assert "No source could be fetched" not in parse_state_md(text)["Literature and Resources"]
    # Planning's prompt builds on what resources handed on; the paper cites it.
    planning = Conversation.latest(ws / ".labrun/phases/planning").system.text
    assert "`literature_review.md` (phase 1)" in planning
    assert "The literature, data and code gathered for this study" in planning
    assert served_paper in (ws / "paper/references.bib").read_text()
    assert "\\documentclass[11pt]{amsart}" in (ws / "paper/main.tex").read_text()

    again = research_session(None, str(ws), return_state=True)  # a deployment re-run: nothing to do
    assert again.is_completed()
    assert runs(ws) == {**{k: 1 for k in EIGHT}, "resources": 2, "paper": 2}
    assert (ws / "STATE.md").read_text() == text


def test_without_tex_the_paper_phase_completes_with_its_source_uncompiled(tmp_path, prefect_api, no_tex):
    from labrun.flows.session import research_session

    ws = tmp_path / "ws"
    state = research_session(str(DEMO_IDEA), str(ws), "scripted", with_phases=["paper"], return_state=True)
    assert state.is_completed(), state.message
    assert [p["key"] for p in session_status(ws)["phases"]][-1] == "paper"
    assert_paper_done(ws, compiled=False)
    prompt = Conversation.latest(ws / ".labrun/phases/paper").system.text
    assert "No TeX is installed here" in prompt
    for name in ("main.tex", "sections/results.tex", "references.bib"):
        assert (ws / "paper" / name).is_file(), name


# -- the Anthropic backend, against the fake Messages API -----------------------------------


def test_web_phases_through_the_messages_api_resume_after_kills_and_bill_what_was_charged(
        tmp_path, serve, cli):
    """The real SDK: resources searches and fetches with the API's own web tools (the API
    pauses its turn once), the paper is written and, with TeX, compiled. Killed in the
    paused turn's continuation and in the paper's second turn, the session resumes, asks no
    completed turn again, and bills exactly what the API charged, searches included."""
    from auto_responder import EXTRA_TURNS, IDEA, SOURCE, TURNS, AutoResearcher
    from labrun.flows.session import research_session
    from labrun.prices import cost_usd
    from labrun.usage import Usage
    from test_anthropic_session import USAGE_FIELDS, turn_of

    idea = tmp_path / "idea.yaml"
    idea.write_text(IDEA)
    api = serve(AutoResearcher({("resources", 2): [{"hang": True}], ("paper", 2): [{"hang": True}]}))
    ws = tmp_path / "ws"
    for stop_at in (("resources", 2), ("paper", 2)):
        args = ("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--with", "resources,paper")
        proc = start_labrun(*(args if stop_at[0] == "resources" else ("resume", str(ws))))
        wait_for(lambda: any(turn_of(r) == stop_at for r in api.requests),  # noqa: B023 (called here, at once)
                 timeout=240, what=f"{stop_at}")
        kill(proc)
    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr

    tex = latex.toolchain() is not None
    turns = {"resources": 3, **TURNS, "paper": EXTRA_TURNS["paper"] - (0 if tex else 1)}
    billed = {b["n"] for b in api.billed}
    answered = [turn_of(r) for r in api.requests if r["n"] in billed]
    assert sorted(answered) == sorted((p, t) for p, n in turns.items() for t in range(1, n + 1))
    assert len(answered) == len(set(answered))  # no completed turn asked (or paid for) twice
    assert [turn_of(r) for r in api.requests if r["n"] not in billed] == [("resources", 2), ("paper", 2)]

    # The paused turn went on: the request after it ends with the paused reply, unchanged.
    first, second = [r["body"] for r in api.requests if turn_of(r)[0] == "resources"][:2]
    assert [t["name"] for t in first["tools"]][-2:] == ["web_search", "web_fetch"]
    assert second["messages"][-1]["role"] == "assistant"
    assert [b["type"] for b in second["messages"][-1]["content"]] == [
        "text", "server_tool_use", "web_search_tool_result"]
    planning = next(r["body"] for r in api.requests if turn_of(r)[0] == "planning")
    assert [t["name"] for t in planning["tools"]][-2:] == ["web_search", "web_fetch"]  # a web phase too
    setup = next(r["body"] for r in api.requests if turn_of(r)[0] == "setup")
    assert "web_search" not in [t["name"] for t in setup["tools"]]
    assert "`literature_review.md` (phase 1)" in planning["system"][0]["text"]

    report = session_status(ws)
    assert report["session"]["complete"] and [p["key"] for p in report["phases"]] == EIGHT
    assert runs(ws) == {**{k: 1 for k in EIGHT}, "resources": 2, "paper": 2}
    assert SOURCE in (ws / "literature_review.md").read_text()  # cited, and fetched by web_fetch
    assert (ws / "paper/main.pdf").is_file() == tex
    # What labrun counts is what the API billed, token for token, and each search at its price.
    total = Usage()
    for b in api.billed:
        u = Usage(**{k: b["usage"][k] for k in USAGE_FIELDS},
                  web_search_requests=b["usage"].get("server_tool_use", {}).get("web_search_requests", 0))
        u.cost_usd = cost_usd(b["model"], u)
        total += u
    for field in USAGE_FIELDS:
        assert report["usage"][field] == getattr(total, field), field
    assert report["usage"]["web_search_requests"] == 1 and report["usage"]["web_fetch_requests"] == 1
    assert report["usage"]["cost_usd"] == pytest.approx(total.cost_usd, abs=1e-9)

    # A fresh flow run (a Retry from the UI) asks the API nothing: every phase is cached.
    asked = len(api.requests)
    assert research_session(None, str(ws), return_state=True).is_completed()
    assert len(api.requests) == asked
    assert runs(ws) == {**{k: 1 for k in EIGHT}, "resources": 2, "paper": 2}


# -- the deployment's parameters ------------------------------------------------------------


def test_labrun_queue_with_gives_the_deployment_run_its_phases_and_style(tmp_path, prefect_api):
    """`labrun queue --with ... --paper-style ... --pass-env ...` against a real server: the
    session run it creates carries `with_phases`, `paper_style` and the keys' names (never
    a value: the worker's environment holds those; tests/e2e runs such a run on a worker)."""
    from prefect.client.orchestration import get_client

    from labrun.flows.session import research_session
    from support import labrun

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(research_session)
        deployment_id = client.create_deployment(flow_id, "pipeline-params", entrypoint="flows/session.py:research_session")
    try:
        result = labrun("queue", str(DEMO_IDEA), "--with", "resources,paper", "--paper-style", "icml",
                        "--pass-env", "SERVICE_ACCESS", "--workspaces", str(tmp_path / "workspaces"), "--agent", "scripted",
                        "--deployment", "research-session/pipeline-params", env={"SERVICE_ACCESS": "on-the-worker-only"})
        assert result.returncode == 0, result.stderr
        assert "\n  agent scripted\n" in result.stdout, result.stdout  # it says which agent the run uses
        with get_client(sync_client=True) as client:
            (run,) = client.read_flow_runs(limit=1, deployment_filter=_deployment_filter(deployment_id))
            assert run.parameters["with_phases"] == ["resources", "paper"]
            assert run.parameters["paper_style"] == "icml"
            assert run.parameters["pass_env"] == ["SERVICE_ACCESS"]
            assert "on-the-worker-only" not in json.dumps(run.parameters)
            assert run.parameters["workspace"].startswith(str(tmp_path / "workspaces"))
            client.delete_flow_run(run.id)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)


def _deployment_filter(deployment_id):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))

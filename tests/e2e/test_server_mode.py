"""Server mode end to end: deployments on the `labrun` process pool, a queue of sessions
running at once, a failed run retried the way the UI's Retry button does it, a worker
killed mid-run, a flow-run process killed while an attempt runs in the background, and two
runs of one workspace."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path


from labrun import model_api_limit
from labrun import prefect_processes as processes
from labrun import serving
from labrun.serving import submit
from labrun.artifacts import artifact_key

from e2e_helpers import (submit_run, CRASH_AFTER_S, EXAMPLES, REPO, client, idea_copy, labrun, latest_task_states,
                         read_run, status_json, wait_for)

FIRST_THREE = ("planning", "setup", "implementation")


def phases(status: dict) -> dict[str, dict]:
    return {p["key"]: p for p in status["phases"]}


def assert_the_forms_explain_themselves(session: dict, queue: dict) -> None:
    """The UI's forms of both deployments, from their schemas on the server: every parameter
    described, the required ones marked, choices as choices."""
    from labrun.agents.registry import names
    from labrun.phase_registry import BY_KEY, phase_list

    phases = list(phase_list(BY_KEY))
    for schema in (session, queue):
        undescribed = [n for n, p in schema["properties"].items() if len(p.get("description") or "") < 20]
        assert not undescribed, undescribed
    assert session["required"] == ["workspace"] and queue["required"] == ["folder", "workspaces"]
    props = session["properties"]
    assert props["agent"]["enum"] == [*names(), None] and props["from_phase"]["enum"] == [*phases, None]
    for name in ("with_phases", "review_after"):
        assert props[name]["anyOf"][0]["items"]["enum"] == phases, props[name]
        assert queue["properties"][name] == {**props[name], "position": queue["properties"][name]["position"]}


def test_deployments_from_prefect_yaml(prefect_server, deployed):
    with client() as c:
        session = c.read_deployment_by_name("research-session/default")
        queue = c.read_deployment_by_name("experiment-queue/ideas-folder")
        pool = c.read_work_pool("labrun")
        sessions_queue = c.read_work_queue_by_name("sessions", work_pool_name="labrun")
        limit = c.read_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT)
        automations = c.read_automations_by_name(serving.ZOMBIE_AUTOMATION)
    assert pool.type == "process"
    assert session.work_pool_name == "labrun" and session.work_queue_name == "sessions"
    assert session.entrypoint == "labrun.flows.session.research_session"
    assert {"idea_path", "workspace", "agent", "model", "from_phase"} <= set(session.parameter_openapi_schema["properties"])
    assert_the_forms_explain_themselves(session.parameter_openapi_schema, queue.parameter_openapi_schema)
    # no network in the pull step: the worker runs the flows from this clone
    assert session.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
    ]
    assert session.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    assert sessions_queue.concurrency_limit == 4
    assert limit.limit >= 1 and limit.active
    assert len(automations) == 1
    assert [s.schedule.cron for s in queue.schedules] == ["*/10 * * * *"]


def test_three_sessions_at_once_and_a_retry_from_the_ui(prefect_server, three_sessions):
    s = three_sessions
    runs = {name: read_run(rid) for name, rid in s.runs.items()}
    for name, run in runs.items():
        expected = "FAILED" if name == s.failing else "COMPLETED"
        assert run.state.type.value == expected, (name, run.state)
    # they ran at the same time: each started before another one ended
    spans = sorted((r.start_time, r.end_time) for r in runs.values())
    assert all(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans

    failed_id = s.runs[s.failing]
    failed = runs[s.failing]
    assert "injected failure at experiments turn 3" in (failed.state.message or "") + json.dumps(
        status_json(s.workspaces[s.failing], prefect_server.env)["phases"])
    before = status_json(s.workspaces[s.failing], prefect_server.env)
    p = phases(before)
    assert [p[k]["status"] for k in FIRST_THREE] == ["DONE"] * 3
    assert p["experiments"]["status"] == "FAILED"
    assert [(a["n"], a["status"]) for a in before["attempts"]] == [(1, "FAILED")]
    assert f"`prefect flow-run retry {failed_id}`" in before["session"]["next_action"]
    assert "Retry button" in before["session"]["next_action"]

    # Retry, as the Retry button of the run's page (V1 UI) does it: the same flow run goes
    # to AwaitingRetry, unforced. (The crash test below retries as the V2 UI does.)
    retried_at = datetime.now(timezone.utc)
    result = submit.retry_like_the_ui(failed_id, ui="v1")
    assert result.status.value == "ACCEPT", result
    run = wait_for([failed_id], timeout_s=180)[failed_id]
    assert run.state.type.value == "COMPLETED", run.state
    assert run.run_count == 2 and str(run.id) == failed_id

    # The finished phases were cache hits in the retry; the failed one really ran again.
    states = latest_task_states(failed_id, since=retried_at)
    for number, key in enumerate(FIRST_THREE, 1):
        assert states[f"{number}-{key}"] == "Cached", states
    for name in ("4-experiments", "5-analysis", "6-documentation"):
        assert states[name] == "Completed", states

    after = status_json(s.workspaces[s.failing], prefect_server.env)
    p_before, p_after = phases(before), phases(after)
    for key in FIRST_THREE:
        assert p_after[key]["runs"] == p_before[key]["runs"] == 1
    assert p_after["experiments"]["runs"] == 2
    assert after["session"]["complete"]
    # The experiments phase went on at turn 3: attempt 1 was not tried again.
    attempts = [(a["n"], a["status"]) for a in after["attempts"]]
    assert attempts == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")], attempts  # 3: the analysis's figures
    assert after["attempts"][1]["fix_applied"]
    commands = [(a["command"], a["fix_applied"]) for a in after["attempts"]]
    assert len(set(commands)) == len(commands)

    # The UI shows the session: STATE.md, attempts, progress, tokens and cost.
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    sid, title = after["session"]["id"], after["idea"]["title"]
    with client() as c:
        versions = c.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key(title, sid, "state")])))
        collections = {a.key: a for a in c.read_latest_artifacts(limit=200)}
    assert len(versions) == 1, "one STATE.md version per flow run, a retry's brought up to date"
    state_md = collections[artifact_key(title, sid, "state")].data
    assert (s.workspaces[s.failing] / "STATE.md").read_text() == state_md
    assert "Phase 6 — documentation: DONE" in state_md
    assert float(collections[artifact_key(title, sid, "progress")].data) == 100.0
    attempts_table = json.loads(collections[artifact_key(title, sid, "attempts")].data)
    assert attempts_table["status"] == ["FAILED", "SUCCESS", "SUCCESS"]
    usage_table = json.loads(collections[artifact_key(title, sid, "usage")].data)
    assert usage_table["phase"][-1] == "session"
    assert usage_table["input"][-1] == after["usage"]["input_tokens"]


def test_experiment_queue_flow_submits_each_new_idea_once(prefect_server, worker, tmp_path):
    from prefect.deployments import run_deployment

    ideas = tmp_path / "ideas"
    new = idea_copy(ideas, "fresh.yaml", "Queue test: a fresh idea")
    (ideas / "broken.yaml").write_text('idea:\n  title: "An idea with no domain or hypothesis"\n')
    root = tmp_path / "workspaces"

    def queue_once():
        run = run_deployment(serving.QUEUE_DEPLOYMENT, timeout=0, parameters={
            "folder": str(ideas), "workspaces": str(root), "agent": "scripted"})
        return wait_for([run.id], timeout_s=120)[str(run.id)]

    first = queue_once()
    assert first.state.type.value == "COMPLETED", first.state
    sessions = _session_runs_for(root)
    assert len(sessions) == 1, sessions
    (workspace, run_id), = sessions.items()
    assert Path(workspace).name.startswith("fresh-")
    second = queue_once()
    assert second.state.type.value == "COMPLETED"
    assert _session_runs_for(root) == sessions, "an idea is submitted once"
    done = wait_for([run_id], timeout_s=180)[run_id]
    assert done.state.type.value == "COMPLETED"
    assert status_json(Path(workspace), prefect_server.env)["session"]["complete"]
    assert new.exists()


def _session_runs_for(root: Path) -> dict[str, str]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with client() as c:
        runs = c.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["default"])), limit=200)
    return {r.parameters["workspace"]: str(r.id) for r in runs
            if str(r.parameters.get("workspace", "")).startswith(str(root))}


def test_dead_worker_run_is_crashed_then_retried_and_one_workspace_one_writer(
        prefect_server, worker, tmp_path):
    idea = idea_copy(tmp_path / "ideas", "crash.yaml", "Crash test: a worker that dies")
    from labrun.idea import load_idea

    ws = submit.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run = submit_run(idea, ws, agent="scripted", job_variables={"env": {
        "LABRUN_SCRIPTED_FAULTS": "hang@experiments:1", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}})
    run_id = str(run.id)
    marker = ws / ".labrun" / "faults" / "experiments-1.reached"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the session never reached the hang"
        assert read_run(run_id).state.type.value not in ("FAILED", "CRASHED", "COMPLETED")
        time.sleep(0.5)
    time.sleep(1)  # the hang is inside the model call of experiments turn 1
    state_before = (ws / ".labrun" / "state.json").read_bytes()

    # A second run of the same workspace, while the first holds it: refused, nothing written.
    busy = submit_run(idea, ws, agent="scripted")
    busy_run = wait_for([busy.id], timeout_s=120)[str(busy.id)]
    assert busy_run.state.type.value == "FAILED"
    assert "another labrun process" in busy_run.state.message, busy_run.state.message
    assert "WorkspaceBusy" in busy_run.state.message
    assert (ws / ".labrun" / "state.json").read_bytes() == state_before
    assert read_run(run_id).state.type.value == "RUNNING"

    # The machine dies: the worker and the flow run's process, kill -9.
    killed_at = time.monotonic()
    worker.kill_hard()
    crashed = wait_for([run_id], states={"CRASHED", "FAILED", "COMPLETED"},
                       timeout_s=CRASH_AFTER_S + 90)[run_id]
    assert crashed.state.type.value == "CRASHED", crashed.state
    assert "heartbeat" in crashed.state.message
    crash_s = time.monotonic() - killed_at
    assert crash_s <= CRASH_AFTER_S + 60
    p = phases(status_json(ws, prefect_server.env))
    assert p["experiments"]["status"] == "IN PROGRESS"

    # A new worker; retry as the UI does: the run resumes and completes.
    worker.start()
    assert submit.retry_like_the_ui(run_id, ui="v2").status.value == "ACCEPT"
    done = wait_for([run_id], timeout_s=180)[run_id]
    assert done.state.type.value == "COMPLETED", done.state
    status = status_json(ws, prefect_server.env)
    p = phases(status)
    assert status["session"]["complete"]
    assert [p[k]["runs"] for k in FIRST_THREE] == [1, 1, 1]
    assert p["experiments"]["runs"] == 2
    assert [(a["n"], a["status"]) for a in status["attempts"]] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]
    states = latest_task_states(run_id)
    assert all(states[f"{n}-{k}"] == "Cached" for n, k in enumerate(FIRST_THREE, 1)), states


def test_a_killed_flow_run_process_leaves_its_background_attempt_running_and_the_retry_records_it_once(
        prefect_server, worker, tmp_path):
    """kill -9 of the worker's flow-run process alone (the worker lives on, as after the OOM
    killer) while the experiments' attempt runs in the background: the attempt runs on under
    its supervisor; the run is Crashed; its retry, on the same worker, re-attaches and records
    the attempt once, without starting its command again."""
    import psutil

    from labrun.agents.scripted import SLOW_ATTEMPT_S, SLOW_ATTEMPT_STARTS
    from labrun.supervisor import start_ticks

    idea = idea_copy(tmp_path / "ideas", "outlive.yaml", "Outlive test: a flow-run process killed mid-attempt")
    from labrun.idea import load_idea

    ws = submit.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "workspaces")
    run_id = str(submit_run(idea, ws, agent="scripted", job_variables={"env": {
        "LABRUN_SCRIPTED_FAULTS": "background-attempt@experiments:3", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}).id)
    report_file = ws / ".labrun/attempts/attempt-002.supervisor.json"
    deadline = time.monotonic() + 180
    while not ((ws / SLOW_ATTEMPT_STARTS).exists() and report_file.exists() and "pgid" in report_file.read_text()):
        assert time.monotonic() < deadline, "the background attempt never started"
        assert read_run(run_id).state.type.value not in ("FAILED", "CRASHED", "COMPLETED")
        time.sleep(0.1)
    report = json.loads(report_file.read_text())
    [flow_run_process] = psutil.Process(worker.proc.pid).children()  # the worker runs each flow run as its child
    flow_run_process.kill()

    # The crash is proposed twice, by the flow-run executor and then by the worker once it is
    # done with the run (`prefect.worker.executed-flow-run`): a Retry between the two would be
    # overwritten by the second (seen here), so the test retries after both, as a person would.
    deadline = time.monotonic() + 60
    while not worker_done_with(run_id):
        assert time.monotonic() < deadline, "the worker never finished with the killed run"
        time.sleep(0.5)
    crashed = read_run(run_id)
    assert crashed.state.type.value == "CRASHED", crashed.state
    assert worker.proc.poll() is None
    assert start_ticks(report["pid"]) == report["ticks"] or "ended" in json.loads(report_file.read_text()), \
        "the attempt died with its flow-run process"

    assert submit.retry_like_the_ui(run_id, ui="v2").status.value == "ACCEPT"
    done = wait_for([run_id], timeout_s=180)[run_id]
    assert done.state.type.value == "COMPLETED", done.state
    status = status_json(ws, prefect_server.env)
    assert status["session"]["complete"] and phases(status)["experiments"]["runs"] == 2
    assert [(a["n"], a["status"]) for a in status["attempts"]] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]
    assert status["attempts"][1]["duration_s"] >= SLOW_ATTEMPT_S
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n", "the retry started the command again"
    assert "the resume records it" in (ws / "STATE.md").read_text()
    assert start_ticks(report["pid"]) != report["ticks"], "a supervisor outlived its session"


def worker_done_with(flow_run_id: str) -> bool:
    """Whether a worker said it is done with the flow run's process (its executed-flow-run event)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    with client() as c:
        page = c.request("POST", "/events/filter", json={"filter": EventFilter(
            event=EventNameFilter(name=["prefect.worker.executed-flow-run"]),
            related=EventRelatedFilter(resources_in_roles=[(f"prefect.flow-run.{flow_run_id}", "flow-run")]),
        ).model_dump(mode="json"), "limit": 5}).json()
    return page["total"] > 0


def test_model_api_limit(prefect_server, deployed):
    """In server mode each model call holds a slot of `labrun-model-api` (created when it
    is missing); without a server, or outside a deployment's run, no slot is taken."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    os.environ["LABRUN_MODEL_API_LIMIT"] = "on"  # as prefect.yaml sets it for session runs
    with client() as c:
        c.delete_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT)
    model_api_limit.forget_limits()
    with model_api_limit.model_api_slot():
        with client() as c:
            limit = c.read_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT)
        assert limit.active_slots == 1
    with client() as c:
        assert c.read_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT).active_slots == 0
        # deleted behind this process's back: made again, not skipped
        c.delete_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT)
    with model_api_limit.model_api_slot():
        with client() as c:
            assert c.read_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT).active_slots == 1
    with client() as c:
        c.update_global_concurrency_limit(model_api_limit.MODEL_API_LIMIT, GlobalConcurrencyLimitUpdate(limit=4))
    # The agent factory puts the limit around a deployment run's model, never the turn loop.
    from labrun.agents.backends import make_agent

    assert isinstance(make_agent("scripted").model, model_api_limit.LimitedModel)
    with temporary_settings({PREFECT_API_URL: None}):  # no server: no limit
        assert not isinstance(make_agent("scripted").model, model_api_limit.LimitedModel)
    del os.environ["LABRUN_MODEL_API_LIMIT"]
    assert not isinstance(make_agent("scripted").model, model_api_limit.LimitedModel)


def test_model_calls_take_the_model_api_limit(prefect_server, three_sessions):
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.schemas.events import ResourceSpecification

    with client() as c:
        page = c.request("POST", "/events/filter", json={"filter": EventFilter(
            event=EventNameFilter(name=["prefect.concurrency-limit.acquired"]),
            resource=EventResourceFilter(labels=ResourceSpecification(
                {"prefect.resource.name": model_api_limit.MODEL_API_LIMIT})),
        ).model_dump(mode="json"), "limit": 50}).json()
    # 3 sessions and a retry: dozens of model calls, each took a slot
    assert page["total"] >= 30, page["total"]


def test_labrun_server_command(tmp_path):
    """`labrun server`: server, pool, limits, automation, deployments and a worker in one
    command; a queued idea runs; Ctrl-C stops everything."""
    import os
    import signal
    import subprocess
    import sys

    port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(tmp_path / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_WORKER_QUERY_SECONDS": "1"})
    log = open(tmp_path / "labrun-server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "labrun.cli", "server", "--port", str(port),
                             "--sessions", "2"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 240
        while "labrun server ready" not in (tmp_path / "labrun-server.log").read_text():
            assert proc.poll() is None, (tmp_path / "labrun-server.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "labrun-server.log").read_text()
            time.sleep(0.5)
        out = (tmp_path / "labrun-server.log").read_text()
        assert f"UI: http://127.0.0.1:{port}" in out
        children = processes.descendants(proc.pid)
        client_env = {**env, "PREFECT_API_URL": api_url}
        queued = labrun("queue", str(EXAMPLES / "demo_noise_averaging.yaml"), "--workspaces",
                        str(tmp_path / "ws"), "--agent", "scripted", env=client_env).stdout
        from e2e_helpers import UUID_RE
        from prefect.settings import PREFECT_API_URL, temporary_settings

        run_id = UUID_RE.search(queued).group(0)
        again = labrun("queue", str(EXAMPLES / "demo_noise_averaging.yaml"), "--workspaces",
                       str(tmp_path / "ws"), env=client_env).stdout
        assert "queued or running already" in again and run_id in again, again
        with temporary_settings({PREFECT_API_URL: api_url}):
            assert wait_for([run_id], timeout_s=180)[run_id].state.type.value == "COMPLETED"
            with client() as c:
                assert c.read_work_queue_by_name("sessions", work_pool_name="labrun").concurrency_limit == 2
                assert c.read_global_concurrency_limit_by_name(model_api_limit.MODEL_API_LIMIT)
                assert c.read_automations_by_name(serving.ZOMBIE_AUTOMATION)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
        code = proc.wait(60)
    assert code == 0, (tmp_path / "labrun-server.log").read_text()
    assert not processes.healthy(api_url)
    assert not [p for p in children if processes.alive(p)], "a process outlived `labrun server`"


def _labrun_server(tmp_path, port: int, env: dict, log_name: str, *extra: str):
    import subprocess
    import sys

    log = tmp_path / log_name
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "labrun.cli", "server", "--port", str(port),
                                 "--crash-after", str(CRASH_AFTER_S), *extra], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while "labrun server ready" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)
    return proc


def test_a_run_in_flight_when_labrun_server_stops_is_crashed_after_its_restart(tmp_path):
    """Ctrl-C to `labrun server` while a session runs; once the server is started again the
    run becomes Crashed within 2 minutes (the heartbeat automation), and Retry finishes it
    from where it stopped. Meanwhile a `labrun run` from the command line, on that server
    and alive longer than the automation's window, is never Crashed; and a run suspended for
    review before the stop still waits after the restart, and a review resumes it."""
    import signal
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from labrun.idea import load_idea

    port = processes.free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LABRUN_SCRIPTED"))}
    env.update({"PREFECT_HOME": str(tmp_path / "home"), "PREFECT_WORKER_QUERY_SECONDS": "1"})
    idea = idea_copy(tmp_path / "ideas", "in_flight.yaml")
    ws = submit.workspace_for(idea, load_idea(idea).content_hash, tmp_path / "ws")
    reviewed = idea_copy(tmp_path / "ideas", "reviewed.yaml", "Restart test: a plan that awaits review")
    reviewed_ws = submit.workspace_for(reviewed, load_idea(reviewed).content_hash, tmp_path / "ws")
    server = _labrun_server(tmp_path, port, env, "server-1.log")
    try:
        with temporary_settings({PREFECT_API_URL: api_url}):
            run_id = submit_run(idea, ws, agent="scripted", job_variables={"env": {
                "LABRUN_SCRIPTED_FAULTS": "hang@experiments:3"}}).id
            reviewed_id = submit_run(reviewed, reviewed_ws, agent="scripted",
                                                review_after=["planning"]).id
            assert wait_for([reviewed_id], states={"PAUSED"}, timeout_s=180)[str(reviewed_id)].state.name == "Suspended"
            deadline = time.monotonic() + 180
            while not (ws / ".labrun/faults/experiments-3.reached").exists():
                assert time.monotonic() < deadline, "the session never reached experiments turn 3"
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert server.wait(60) == 0
    assert not processes.healthy(api_url)

    server = _labrun_server(tmp_path, port, env, "server-2.log")
    cli_ws, cli_log = tmp_path / "cli-ws", tmp_path / "cli-run.log"
    cli_run = None
    try:
        restarted = time.monotonic()
        # Beside the crash and the retry, which outlast the automation's window anyway: a run
        # outside any deployment, whose heartbeats come as often as labrun sets, not Prefect's
        # default of one in 180 s.
        with open(cli_log, "w") as out:
            cli_run = subprocess.Popen(
                [sys.executable, "-m", "labrun.cli", "run", str(EXAMPLES / "demo_noise_averaging.yaml"),
                 "--workspace", str(cli_ws), "--agent", "scripted"],
                env={**env, "PREFECT_API_URL": api_url, "LABRUN_SCRIPTED_FAULTS": "hang@experiments:1"},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        with temporary_settings({PREFECT_API_URL: api_url}):
            crashed = wait_for([run_id], states={"CRASHED", "CANCELLED", "FAILED"}, timeout_s=120)[str(run_id)]
            assert time.monotonic() - restarted < 120
            assert crashed.state.type.value == "CRASHED", crashed.state
            assert "retry" in status_json(ws, {**env, "PREFECT_API_URL": api_url})["session"]["next_action"]
            assert submit.retry_like_the_ui(run_id, ui="v1").status.value == "ACCEPT"
            assert wait_for([run_id], timeout_s=180)[str(run_id)].state.type.value == "COMPLETED"

            assert cli_run.poll() is None, cli_log.read_text()
            with client() as c:
                [cli_flow_run] = [r for r in c.read_flow_runs(limit=20)
                                  if r.parameters.get("workspace") == str(cli_ws.resolve())]
            running_s = (datetime.now(timezone.utc) - cli_flow_run.start_time).total_seconds()
            time.sleep(max(0.0, CRASH_AFTER_S + 15 - running_s))  # the automation's window, and its lag
            with client() as c:
                states = sorted(c.read_flow_run_states(cli_flow_run.id), key=lambda s: s.timestamp)
            history = [s.type.value for s in states]
            assert cli_run.poll() is None, cli_log.read_text()
            assert history == ["PENDING", "RUNNING"], f"the command-line run went through {history}"

            assert read_run(reviewed_id).state.name == "Suspended"  # through the restart and the window
            out = labrun("review", str(reviewed_ws), "--approve", env={**env, "PREFECT_API_URL": api_url}).stdout
            assert "resumed with the decision (approve)" in out, out
            assert wait_for([reviewed_id], timeout_s=180)[str(reviewed_id)].state.type.value == "COMPLETED"
        status = status_json(ws, env)
        assert {p["key"]: p["runs"] for p in status["phases"]}["implementation"] == 1
        assert [(a["n"], a["status"]) for a in status["attempts"]] == [(1, "FAILED"), (2, "SUCCESS"), (3, "SUCCESS")]
    finally:
        processes.stop(cli_run, grace_s=30, first=signal.SIGINT)  # Ctrl-C, while its server answers
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(60) == 0

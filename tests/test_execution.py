"""The engine's tasks run from a serializable spec and the workspace alone: with
`LABRUN_TASKS_IN=process` every attempt, every rerun and the sealed scoring runs in a Python
process of its own, and the session ends as it ends when they run in the engine's process."""

from __future__ import annotations

import os
import re
from uuid import UUID

import psutil

from support import DEMO_IDEA
from labrun.state import load_state
from labrun.workspace import Workspace

RAN_IN = re.compile(r"attempt (\d+) ran in process (\d+)")


def session(tmp_path, name: str):
    from labrun.flows.session import research_session

    ws = tmp_path / name
    assert research_session(str(DEMO_IDEA), str(ws), "scripted", return_state=True).is_completed()
    return load_state(Workspace(ws))[0]


def outcome(state) -> list:
    """What the session found, whatever ran it: attempts, their metrics, the reruns' verdicts."""
    return [(a.n, a.status, a.metrics, a.reproduction and a.reproduction.status) for a in state.attempts]


def test_every_engine_task_runs_in_a_process_of_its_own_and_the_session_ends_the_same(tmp_path, prefect_api,
                                                                                       monkeypatch):
    from prefect.client.orchestration import get_client

    here = session(tmp_path, "here")
    assert not any(RAN_IN.search(line) for line in here.worklog)  # the default: the engine's process

    monkeypatch.setenv("LABRUN_TASKS_IN", "process")
    apart = session(tmp_path, "apart")
    ran = {int(n): int(pid) for line in apart.worklog if (m := RAN_IN.search(line)) for n, pid in [m.groups()]}
    assert sorted(ran) == [a.n for a in apart.attempts]
    assert os.getpid() not in ran.values() and len(set(ran.values())) == len(ran)  # one process each
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).ppid() == os.getpid() for pid in ran.values())
    assert outcome(apart) == outcome(here) and any(a.reproduction for a in apart.attempts)
    assert {a.status for a in apart.attempts} == {"SUCCESS", "FAILED"}
    with get_client(sync_client=True) as client:  # each attempt is a Prefect task run, failed as it did
        for a in [*here.attempts, *apart.attempts]:
            state = client.read_task_run(UUID(a.task_run)).state
            assert state.type.value == ("COMPLETED" if a.status == "SUCCESS" else "FAILED"), (a.n, a.status, state)


def test_an_attempts_run_file_is_read_beneath_the_workspace_never_through_a_link(tmp_path):
    """What reconcile kills and records comes from the run file: a link in its place (to a
    file that names another process group) is read as no file at all."""
    from labrun.attempt_records import AttemptRecords

    ws = Workspace(tmp_path / "ws")
    ws.attempts.mkdir(parents=True)
    outside = tmp_path / "forged.json"
    outside.write_text('{"pgid": 1, "started": 0}')
    records = AttemptRecords(ws, store=None)
    records.run_path(1).write_text('{"task_run": "t"}')
    assert records.run(1) == {"task_run": "t"}
    records.run_path(1).unlink()
    records.run_path(1).symlink_to(outside)
    assert records.run(1) == {}


PHASE_TASK = """
import sys
from labrun.phases.execution import TaskSpec
from labrun.session import Session

session = Session.attach(TaskSpec.model_validate_json(sys.argv[1]), writing=True)
session.store.log("recorded by the phase task")
session.close()
"""


def test_a_phase_task_records_from_another_process_under_the_engines_lease(tmp_path):
    """The phase task's session is rebuilt from its spec wherever it runs: it records into the
    state while the engine that gave the spec holds the workspace, and the engine's next change
    starts from what it recorded; the spec of an engine since gone is refused."""
    import subprocess
    import sys

    from labrun.phases.execution import TaskSpec
    from labrun.session import Session

    def phase_task(spec: TaskSpec) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", PHASE_TASK, spec.model_dump_json()],
                              capture_output=True, text=True, timeout=120)

    engine = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    spec = TaskSpec(workspace=str(engine.ws.root), session_id=engine.state.session_id, lease=engine.ws.lease)
    try:
        done = phase_task(spec)
        assert done.returncode == 0, done.stderr
        engine.store.log("the engine's own change")  # from the state the phase task saved
        worklog = "\n".join(load_state(engine.ws)[0].worklog)
        assert "recorded by the phase task" in worklog and "the engine's own change" in worklog
        forged = phase_task(spec.model_copy(update={"lease": "0" * 16}))
        assert forged.returncode != 0 and "no longer holds the workspace" in forged.stderr
    finally:
        engine.close()
    late = phase_task(spec)
    assert late.returncode != 0 and "no longer holds the workspace" in late.stderr
    assert "recorded by the phase task" in "\n".join(load_state(Workspace(tmp_path / "ws"))[0].worklog)


def test_the_attempt_flows_deployment_declares_the_flows_own_parameters():
    """The engine declares the attempt flow's parameters without importing it (that module
    imports the engine's tasks): they must be the flow's."""
    from prefect.utilities.callables import parameter_schema

    from labrun.flows.attempt import experiment_attempt_flow
    from labrun.serving.pools import ATTEMPT_PARAMETERS

    schema = parameter_schema(experiment_attempt_flow).model_dump_for_openapi()
    assert set(schema["properties"]) == set(ATTEMPT_PARAMETERS["properties"])
    assert schema["required"] == ATTEMPT_PARAMETERS["required"]

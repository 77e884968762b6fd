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


def test_a_pool_run_crashed_by_its_cancel_is_told_as_cancelled_not_as_a_lost_machine(tmp_path, prefect_api):
    """A worker that cancels a run by a signal to its process (labrun-slurm's scancel) has the
    run read Crashed, its engine's view of the signal, for seconds before the worker marks it
    Cancelled: an engine that looks then says the attempt was cancelled; a run that crashed
    unasked is still a lost machine."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed, Running, State

    from labrun.attempt_records import AttemptRecords
    from labrun.phases.attempts import AttemptSpec
    from labrun.phases.execution import run_on_pool

    @flow(name="experiment-attempt")
    def attempt_flow() -> None: ...

    def judged(*states, n: int) -> str:
        with get_client(sync_client=True) as client:
            run = client.create_flow_run(attempt_flow, name=f"ws-attempt-{n}")
            for state in states:
                client.set_flow_run_state(run.id, state, force=True)
        ws = Workspace(tmp_path / "ws")
        ws.attempts.mkdir(parents=True, exist_ok=True)
        records = AttemptRecords(ws, store=None)
        records.run_path(n).write_text(f'{{"task_run": "t", "flow_run": "{run.id}", "pool": "slurm"}}')
        record = run_on_pool("attempt", AttemptSpec(workspace=str(ws.root), session_id="s", n=n, pool="slurm"))
        assert record["status"] == "INTERRUPTED" and "infrastructure failure" in record["error"], record
        return record["error"]

    cancelled = judged(Running(), State(type=StateType.CANCELLING, name="Cancelling"),
                       Crashed(message="Execution was aborted by a termination signal."), n=1)
    assert "was cancelled" in cancelled and "lost" not in cancelled, cancelled
    lost = judged(Running(), Crashed(message="Slurm job 7 ended NODE_FAIL (exit 0:0)"), n=2)
    assert "crashed (Slurm job 7 ended NODE_FAIL" in lost and "lost" in lost, lost


def test_an_attempts_gpus_become_its_jobs_where_the_pools_jobs_take_a_gpu_count(tmp_path, prefect_api):
    """A labrun-slurm pool's jobs have a `gpus` variable (`--gres=gpu:N`): the flow run of an
    attempt asking for 2 GPUs asks its job for 2; a process pool's jobs have none, so nothing
    is asked there (the pool's own settings hold)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from labrun.phases.attempts import AttemptSpec
    from labrun.phases.execution import _submit
    from labrun.session import Session
    from labrun.serving.slurm_worker import SlurmWorker
    from labrun.state import Attempt

    with get_client(sync_client=True) as client:
        for name, worker in (("gres-slurm", SlurmWorker), ("gres-process", ProcessWorker)):
            client.create_work_pool(WorkPoolCreate(name=name, type=worker.type,
                                                   base_job_template=worker.get_default_base_job_template()))
    session = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    try:
        with session.store.transaction() as state:
            state.attempts += [Attempt(n=1, phase="experiments", command="python3 train.py", gpu_count=2),
                               Attempt(n=2, phase="experiments", command="python3 train.py", gpu_count=2),
                               Attempt(n=3, phase="experiments", command="python3 eval.py")]
        asked = {}
        for pool, n in (("gres-slurm", 1), ("gres-process", 2), ("gres-slurm", 3)):
            spec = AttemptSpec.of(session, n=n).model_copy(update={"pool": pool})
            with get_client(sync_client=True) as client:
                asked[pool, n] = client.read_flow_run(_submit("attempt", spec, n, session.records)).job_variables
    finally:
        session.close()
    assert asked[("gres-slurm", 1)] == {"gpus": 2}
    assert asked[("gres-process", 2)] == {}
    assert asked[("gres-slurm", 3)] == {}  # none asked: the pool's default, whatever it is

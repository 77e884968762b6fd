"""Flow runs of a `labrun-slurm` pool as real Slurm jobs (labrun/serving/slurm_worker.py), on
the one-node Slurm that .ci/install-slurm starts: the pool made by `prefect work-pool create
--type labrun-slurm` (Prefect finding the type through labrun's entry point), a deployment of
tests/e2e/slurm_probe.py on it, and `prefect worker start` for it. Each run goes through
`sbatch`, is seen in `sacct`, and is followed by whichever worker is alive; Slurm owns the job.
Last, a session's experiment attempts on that pool (`labrun run --experiments-pool`): an
attempt is a Slurm job, and the engine survives a kill -9 while it runs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from labrun import prefect_processes as processes
from labrun.agents.scripted import SLOW_ATTEMPT_STARTS
from labrun.status import session_status
from support import DEMO_IDEA

from e2e_helpers import FINAL, cancel_like_the_ui, client, labrun, read_run, wait_for
from test_experiments_pool import engine, run_file, until

HERE = Path(__file__).parent
INSTALL = "run .ci/install-slurm (as root) to install and start a one-node Slurm"


def _why_no_slurm() -> str | None:
    if not shutil.which("sbatch"):
        return f"Slurm is not installed (no sbatch): {INSTALL}"
    try:
        seen = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return f"the Slurm controller does not answer (sinfo took over 15 s): {INSTALL}"
    if not re.search(r"^(idle|mixed|allocated)", seen.stdout, re.M):
        return f"no Slurm node takes jobs (sinfo: {(seen.stderr or seen.stdout).strip()!r}): {INSTALL}"
    return None


def sacct(*args: str) -> list[list[str]]:
    """`sacct` rows (JobID, JobName, State), from accounting or, where the cluster keeps only
    the job-completion log (.ci/install-slurm's), from that."""
    for extra in ([], ["--completion"]):
        done = subprocess.run(["sacct", *extra, "-X", "-n", "-P", "-o", "JobID,JobName,State", *args],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return [line.split("|") for line in done.stdout.splitlines() if line]
    raise AssertionError(f"sacct failed: {done.stderr.strip()}")


def sacct_rows_of(job: str, timeout_s: float = 60) -> list[list[str]]:
    """`sacct -j JOB` once Slurm has recorded the job's end (a moment after its flow run
    reported its own)."""
    deadline = time.monotonic() + timeout_s
    while not (rows := sacct("-j", job)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return rows


def squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True, timeout=30).stdout.strip()


class SlurmPool:
    def __init__(self, env: dict[str, str], name: str, deployment_id, jobs: Path, logs: Path):
        self.env, self.name, self.deployment_id, self.jobs, self.logs = env, name, deployment_id, jobs, logs
        self.worker: subprocess.Popen | None = None
        self.started = 0

    def start_worker(self) -> None:
        self.started += 1
        self.worker = processes.start_worker(self.env, self.worker_log(self.started), pool=self.name,
                                             name=f"slurm-worker-{self.started}")

    def worker_log(self, n: int) -> Path:
        return self.logs / f"slurm-worker-{n}.log"

    def run(self, out: Path, seconds: float = 0.0, **job_variables) -> str:
        with client() as c:
            run = c.create_flow_run_from_deployment(self.deployment_id, parameters={"out": str(out), "seconds": seconds},
                                                    job_variables=job_variables)
        return str(run.id)

    def running(self, run_id: str, out: Path, timeout_s: float = 120) -> str:
        """The job id of a run once its flow has started in the job (its line is in `out`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = read_run(run_id)
            if run.infrastructure_pid and out.exists() and out.read_text().strip():
                return run.infrastructure_pid
            assert run.state is None or run.state.type.value not in FINAL, (run.state, self.tail())
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} did not start in Slurm within {timeout_s:.0f} s: {self.tail()}")

    def tail(self) -> str:
        return self.worker_log(self.started).read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def slurm_pool(prefect_server, tmp_path_factory):
    from prefect.client.schemas.actions import WorkPoolUpdate

    why = _why_no_slurm()
    if why:
        pytest.skip(why)
    env = dict(prefect_server.env)
    env["PREFECT_WORKER_QUERY_SECONDS"] = "1"
    name = f"slurm-{uuid.uuid4().hex[:6]}"
    made = subprocess.run([*processes.prefect_cli(), "work-pool", "create", name, "--type", "labrun-slurm"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and "labrun-slurm" in made.stdout, made.stdout + made.stderr
    jobs = tmp_path_factory.mktemp("slurm-jobs")
    with client() as c:
        pool = c.read_work_pool(name)
        variables = pool.base_job_template["variables"]["properties"]
        assert set(variables) >= {"partition", "time_limit", "gpus", "sbatch_args"}
        # The pool's jobs write their slurm-<job id>.out there, not in the worker's folder.
        variables["working_dir"]["default"] = str(jobs)
        c.update_work_pool(name, WorkPoolUpdate(base_job_template=pool.base_job_template))
        flow_id = c.create_flow_from_name("slurm-probe")
        deployment_id = c.create_deployment(
            flow_id=flow_id, name="probe", work_pool_name=name, entrypoint="slurm_probe.py:slurm_probe",
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(HERE)}}])
    p = SlurmPool(env, name, deployment_id, jobs, prefect_server.logs)
    p.start_worker()
    yield p
    processes.stop(p.worker)


def test_a_flow_run_is_a_slurm_job_seen_in_sacct(slurm_pool, tmp_path):
    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, gpus=1)
    run = wait_for([run_id], timeout_s=180)[run_id]
    assert run.state.type.value == "COMPLETED", (run.state, slurm_pool.tail())
    job = run.infrastructure_pid
    assert job and job.isdigit()
    # The flow ran inside that job, with the one GPU it asked for.
    assert out.read_text().split() == [job, "0"]
    assert (slurm_pool.jobs / f"slurm-{job}.out").exists()
    assert sacct_rows_of(job) == [[job, run.name, "COMPLETED"]]


def test_a_cancelled_job_ends_its_flow_run(slurm_pool, tmp_path):
    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, seconds=300)
    job = slurm_pool.running(run_id, out)
    subprocess.run(["scancel", job], check=True, timeout=30)
    run = wait_for([run_id], timeout_s=90)[run_id]
    assert run.state.type.value == "CRASHED", run.state
    assert sacct_rows_of(job)[0][2].startswith("CANCELLED")


def test_cancelling_a_running_run_cancels_its_job(slurm_pool, tmp_path):
    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, seconds=300)
    job = slurm_pool.running(run_id, out)
    cancel_like_the_ui(run_id)
    assert sacct_rows_of(job)[0][2].startswith("CANCELLED")
    # The engine in the job reports the SIGTERM as a crash; the worker then says Cancelled.
    run = wait_for([run_id], states={"CANCELLED"}, timeout_s=30)[run_id]
    assert "cancelled with its flow run" in run.state.message


def test_the_job_outlives_a_killed_worker_and_is_not_submitted_again(slurm_pool, tmp_path):
    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, seconds=20)
    job = slurm_pool.running(run_id, out)
    old = slurm_pool.worker
    assert old is not None
    old.send_signal(signal.SIGKILL)  # its process alone: the job is Slurm's, not its child
    old.wait()
    assert squeue_state(job) == "RUNNING"
    slurm_pool.start_worker()
    run = wait_for([run_id], timeout_s=120)[run_id]
    assert run.state.type.value == "COMPLETED", (run.state, slurm_pool.tail())
    assert out.read_text().split() == [job, "-"]  # ran once, in that job
    sacct_rows_of(job)
    assert [row for row in sacct() if row[1] == run.name] == [[job, run.name, "COMPLETED"]]
    assert "Submitted flow run" not in slurm_pool.tail()


def test_a_job_that_dies_while_no_worker_watches_crashes_its_run(slurm_pool, tmp_path):
    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, seconds=300)
    job = slurm_pool.running(run_id, out)
    old = slurm_pool.worker
    assert old is not None
    old.send_signal(signal.SIGKILL)
    old.wait()
    # kill -9 of the job's processes (as the kernel's OOM killer would): the flow's engine
    # cannot say anything; only a worker can tell that the job ended. (scancel, even with
    # --signal=KILL, sends SIGTERM first, and the engine reports its run Crashed itself.)
    pids = subprocess.run(["scontrol", "listpids", job], capture_output=True, text=True,
                          check=True, timeout=30).stdout.split("\n")[1:]
    for line in pids:
        if line.split() and line.split()[0].isdigit():
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 60
    while squeue_state(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert read_run(run_id).state.type.value == "RUNNING"
    slurm_pool.start_worker()
    run = wait_for([run_id], timeout_s=60)[run_id]
    assert run.state.type.value == "CRASHED", run.state
    assert f"Slurm job {job} ended" in (run.state.message or "")


def test_a_run_scheduled_again_while_its_job_lives_is_followed_not_submitted(slurm_pool, tmp_path):
    """A run put back to Scheduled while its job still runs (Prefect's retry of a run that an
    automation marked Crashed): the worker takes it, finds its job by the flow run's id, and
    follows that job instead of starting a second one."""
    from prefect.states import Scheduled

    out = tmp_path / "probe.txt"
    run_id = slurm_pool.run(out, seconds=15)
    job = slurm_pool.running(run_id, out)
    old = slurm_pool.worker
    assert old is not None
    old.send_signal(signal.SIGKILL)
    old.wait()
    with client() as c:
        c.set_flow_run_state(run_id, Scheduled(), force=True)
    slurm_pool.start_worker()
    deadline = time.monotonic() + 60
    while f"Slurm job {job} already runs flow run {run_id}" not in slurm_pool.tail():
        assert time.monotonic() < deadline, slurm_pool.tail()
        time.sleep(0.5)
    sacct_rows_of(job)
    name = read_run(run_id).name
    assert [row for row in sacct() if row[1] == name] == [[job, name, "COMPLETED"]]
    assert out.read_text().split() == [job, "-"]


def test_a_job_that_sbatch_refuses_crashes_its_run_with_the_reason(slurm_pool, tmp_path):
    run_id = slurm_pool.run(tmp_path / "probe.txt", gpus=3)  # the node has two
    run = wait_for([run_id], timeout_s=60)[run_id]
    assert run.state.type.value == "CRASHED", run.state
    assert "sbatch refused the job" in run.state.message and "not available" in run.state.message


def test_cancelling_a_run_whose_job_waits_cancels_the_job(slurm_pool, tmp_path):
    run_id = slurm_pool.run(tmp_path / "probe.txt", sbatch_args=["--hold"])  # pending until released
    deadline = time.monotonic() + 60
    while not (job := read_run(run_id).infrastructure_pid):
        assert time.monotonic() < deadline, slurm_pool.tail()
        time.sleep(0.5)
    assert squeue_state(job) == "PENDING"
    cancel_like_the_ui(run_id)
    run = wait_for([run_id], timeout_s=60)[run_id]
    assert run.state.type.value == "CANCELLED", run.state
    assert sacct_rows_of(job)[0][2].startswith("CANCELLED")


def test_an_attempt_is_a_slurm_job_and_the_engine_survives_a_kill_while_it_runs(slurm_pool, tmp_path):
    """`labrun run --experiments-pool` on the labrun-slurm pool: attempt 2 (slow) runs as a
    Slurm job named after its flow run; kill -9 of the engine while the job runs; `labrun
    resume` waits for that job's flow run and records the attempt once."""
    ws = tmp_path / f"ws-{uuid.uuid4().hex[:6]}"  # its runs' names are its own: sacct keeps earlier runs' jobs
    first = engine(["run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted",
                    "--experiments-pool", slurm_pool.name],
                   {**slurm_pool.env, "LABRUN_SCRIPTED_FAULTS": "slow-attempt@experiments:3"})
    until(lambda: (ws / SLOW_ATTEMPT_STARTS).exists() or first.poll() is not None, "the slow attempt to start", 120)
    assert first.poll() is None, first.communicate()[1][-3000:]
    first.send_signal(signal.SIGKILL)
    assert first.wait(60) == -9
    flow_run = run_file(ws, 2)["flow_run"]
    job = read_run(flow_run).infrastructure_pid
    assert job and squeue_state(job) == "RUNNING", "the engine was killed while the attempt's job ran"

    resumed = labrun("resume", str(ws), env=slurm_pool.env, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:] + slurm_pool.tail()
    status = session_status(ws)
    assert status["session"]["complete"]
    assert (ws / SLOW_ATTEMPT_STARTS).read_text() == "started\n", "the attempt's command was started again"
    attempts = status["attempts"]
    assert [a["status"] for a in attempts] == ["FAILED", "SUCCESS", "SUCCESS"], attempts
    assert attempts[1]["metrics"] and (ws / "results/metrics.json").is_file()  # what it wrote came back
    run = read_run(flow_run)
    assert run.state.type.value == "COMPLETED" and run.work_pool_name == slurm_pool.name, run.state
    sacct_rows_of(job)
    assert [row for row in sacct() if row[1] == run.name] == [[job, run.name, "COMPLETED"]], "one job, seen in sacct"
    assert "attempt 2 SUCCESS" in (slurm_pool.jobs / f"slurm-{job}.out").read_text()
    # A FAILED attempt is its flow run's Failed state, told as such, not an error of Prefect's.
    failed = read_run(run_file(ws, 1)["flow_run"])
    assert failed.state.type.value == "FAILED", failed.state
    said = (slurm_pool.jobs / f"slurm-{failed.infrastructure_pid}.out").read_text()
    assert "attempt 1 FAILED" in said and "TypeError" not in said, said[-3000:]

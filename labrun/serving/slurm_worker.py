"""Prefect's `labrun-slurm` worker type: each flow run of its pool is a Slurm batch job.

`prefect worker start --pool POOL --type labrun-slurm` (Prefect finds the type through the
`prefect.collections` entry point in pyproject.toml). For each flow run the worker submits
what Prefect's process worker would run, `python -m prefect.engine` with the flow run's
environment (PREFECT__FLOW_RUN_ID, the API's address, the job's `env`), to `sbatch`, with
the job variables below; then it follows the job (`scontrol`, then `sacct` once the
controller has forgotten it) until it ends, and cancels it when its run is cancelled. The
flow run reports its own states from inside the job; a job that ends otherwise (scancel,
preemption, the time limit, a lost node) makes the run Crashed, and the run's logs say how
the job ended.

Slurm owns the jobs: a worker that dies leaves them running. Prefect hands a worker only
Scheduled runs and this one moves a run to Pending before it calls `sbatch`, so no restarted
worker submits a run again; each job carries its flow run's id (`--comment`), and a run that
comes back to Scheduled while its job lives (a retry of a run marked Crashed by a missed
heartbeat) is followed, not submitted twice. The job id is the flow run's
`infrastructure_pid`, as with Prefect's own workers, and a worker follows every run of its
pool that has one and no final state, so a job that ends while no worker watched it still
makes its run Crashed.

Job variables (the pool's base job template; a deployment's or a run's `job_variables`
override them): `partition`, `time_limit` (`--time`, e.g. `"02:00:00"`), `gpus`
(`--gres=gpu:N`), `cpus_per_task`, `memory` (`--mem`, e.g. `"16G"`), `sbatch_args` (more
options, as a list), `working_dir` (`--chdir`, where `slurm-<job id>.out` goes; the worker's
folder by default), `env`, `command`, `name` (the job's name; the flow run's by default).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import anyio
import anyio.abc
from pydantic import Field

from prefect.client.schemas.filters import (
    FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType, WorkPoolFilter, WorkPoolFilterName,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import InfrastructureNotFound
from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorker, BaseWorkerResult

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

WORKER_TYPE = "labrun-slurm"
COMMENT = "prefect-flow-run:"
"""A job's `--comment`: its flow run's id after this."""
POLL_S = 5.0
"""How often the worker asks Slurm about a job it follows."""

# A job in one of these has ended (sacct prints `CANCELLED by 0`: the first word counts).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


class SlurmError(Exception):
    """A Slurm command failed; its one-line reason."""


class SlurmJobConfiguration(BaseJobConfiguration):
    partition: Optional[str] = Field(default=None)
    time_limit: Optional[str] = Field(default=None)
    gpus: int = Field(default=0, ge=0)
    cpus_per_task: Optional[int] = Field(default=None, ge=1)
    memory: Optional[str] = Field(default=None)
    sbatch_args: list[str] = Field(default_factory=list)
    working_dir: Optional[Path] = Field(default=None)

    @staticmethod
    def _base_flow_run_command() -> str:
        # The worker's own Python: a cluster's nodes see the environment labrun is installed in.
        return shlex.join([sys.executable, "-m", "prefect.engine"])

    def sbatch_command(self, flow_run_id: str) -> list[str]:
        """`sbatch` with this configuration; the job script comes on stdin."""
        cmd = ["sbatch", "--parsable", f"--job-name={self.name}", f"--comment={COMMENT}{flow_run_id}",
               # A preempted job is not started again under the same flow run: the run is
               # Crashed, and whoever submitted it decides (labrun retries the attempt).
               "--no-requeue"]
        if self.working_dir:
            cmd.append(f"--chdir={self.working_dir}")
        if self.partition:
            cmd.append(f"--partition={self.partition}")
        if self.time_limit:
            cmd.append(f"--time={self.time_limit}")
        if self.gpus:
            cmd.append(f"--gres=gpu:{self.gpus}")
        if self.cpus_per_task:
            cmd.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.memory:
            cmd.append(f"--mem={self.memory}")
        return cmd + list(self.sbatch_args)

    def job_script(self) -> str:
        # exec: Slurm's signals (scancel, the time limit) reach Prefect's engine itself.
        return f"#!/bin/sh\nexec {self.command}\n"


class SlurmVariables(BaseVariables):
    partition: Optional[str] = Field(default=None, description="Slurm partition (`--partition`); the cluster's default when empty.")
    time_limit: Optional[str] = Field(default=None, description="Time limit (`--time`), e.g. `02:00:00`; the partition's when empty.")
    gpus: int = Field(default=0, ge=0, description="GPUs for the job (`--gres=gpu:N`).")
    cpus_per_task: Optional[int] = Field(default=None, ge=1, description="CPUs (`--cpus-per-task`).")
    memory: Optional[str] = Field(default=None, description="Memory (`--mem`), e.g. `16G`.")
    sbatch_args: list[str] = Field(default_factory=list, description="More `sbatch` options, one a list item, e.g. `--account=lab`.")
    working_dir: Optional[Path] = Field(default=None, description="The job's folder (`--chdir`), where `slurm-<job id>.out` goes; the worker's by default. Must exist on the nodes.")


class SlurmWorkerResult(BaseWorkerResult):
    """The job's id and how it ended."""


async def _slurm(*cmd: str, stdin: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    try:
        done = await anyio.run_process(list(cmd), input=stdin.encode() if stdin is not None else None,
                                       env=env, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} is not installed on the worker's machine") from None
    return done.returncode, done.stdout.decode(errors="replace").strip(), done.stderr.decode(errors="replace").strip()


async def submit(configuration: SlurmJobConfiguration, flow_run_id: str) -> str:
    """The job id of a new job for the flow run."""
    env = {**os.environ, **{k: v for k, v in configuration.env.items() if v is not None}}
    rc, out, err = await _slurm(*configuration.sbatch_command(flow_run_id), stdin=configuration.job_script(), env=env)
    if rc != 0:
        raise SlurmError(f"sbatch refused the job: {err or out}")
    return out.split(";")[0]


async def live_job(flow_run_id: str) -> str | None:
    """The id of a job the controller holds for the flow run (pending or running), if any."""
    rc, out, _ = await _slurm("squeue", "--me", "-h", "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING", "-o", "%i %k")
    if rc != 0:
        return None
    for line in out.splitlines():
        job, _, comment = line.partition(" ")
        if comment.strip() == f"{COMMENT}{flow_run_id}":
            return job
    return None


async def job_state(job_id: str) -> tuple[str, str] | None:
    """(state, exit code as `code:signal`) of a job; None when Slurm knows no such job. The
    controller first (it keeps a job a few minutes after its end), then accounting
    (`sacct`, or `sacct --completion` where the cluster keeps only the job-completion log)."""
    rc, out, _ = await _slurm("scontrol", "-o", "show", "job", job_id)
    if rc == 0 and out:
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "0:0")
    for extra in ([], ["--completion"]):
        rc, out, err = await _slurm("sacct", *extra, "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode")
        if rc != 0:
            continue  # accounting storage is disabled: the completion log next
        for line in out.splitlines():
            jid, state, code = (line.split("|") + ["", ""])[:3]
            if jid == job_id:
                return state.split()[0] if state else "UNKNOWN", code or "0:0"
    return None


def exit_status(state: str, code: str) -> int:
    """The status the worker reports for a job that ended: 0 for COMPLETED, else the job's
    exit code, 128 + its signal, or 1."""
    if state == "COMPLETED":
        return 0
    status, _, signal = code.partition(":")
    try:
        return int(status) or (128 + int(signal) if int(signal) else 1)
    except ValueError:
        return 1


class SlurmWorker(BaseWorker[SlurmJobConfiguration, SlurmVariables, SlurmWorkerResult]):
    type = WORKER_TYPE
    job_configuration = SlurmJobConfiguration
    job_configuration_variables = SlurmVariables
    _description = "Run each flow run as a Slurm batch job (sbatch), followed until it ends."
    _display_name = "Slurm (labrun)"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._followed: set[str] = set()
        """Flow runs whose jobs this worker follows."""

    async def run(self, flow_run: "FlowRun", configuration: SlurmJobConfiguration,
                  task_status: Optional[anyio.abc.TaskStatus[int]] = None) -> SlurmWorkerResult:
        logger = self.get_flow_run_logger(flow_run)
        self._followed.add(str(flow_run.id))
        try:
            job_id = await live_job(str(flow_run.id))
            if job_id:
                logger.info(f"Slurm job {job_id} already runs flow run {flow_run.id}: following it")
            else:
                job_id = await submit(configuration, str(flow_run.id))
                logger.info(f"Submitted flow run {flow_run.id} as Slurm job {job_id}")
            if task_status is not None:
                task_status.started(job_id)  # type: ignore[arg-type]  # the flow run's infrastructure_pid
            state, code = await self._follow(flow_run, job_id)
        finally:
            self._followed.discard(str(flow_run.id))
        if state != "COMPLETED":
            logger.warning(f"Slurm job {job_id} ended {state} (exit {code})")
        return SlurmWorkerResult(status_code=exit_status(state, code), identifier=job_id)

    async def _follow(self, flow_run: "FlowRun", job_id: str) -> tuple[str, str]:
        """Until the job ends: its state and exit code ("GONE" when Slurm no longer knows it).
        A run cancelled in Prefect meanwhile has its job cancelled, pending or running."""
        while True:
            seen = await job_state(job_id)
            if seen is None:
                return "GONE", "0:0"
            if seen[0] in ENDED:
                return seen
            if await self._state(flow_run) == StateType.CANCELLING:
                await self._cancel(flow_run, job_id)
                return "COMPLETED", "0:0"  # nothing more for the worker to report
            await anyio.sleep(POLL_S)

    async def _cancel(self, flow_run: "FlowRun", job_id: str) -> None:
        """scancel, then Cancelled once the job has ended: the engine in a running job takes
        the SIGTERM for a crash and says so (Prefect's own workers tell it otherwise through
        a local socket, which a node cannot reach), so its Crashed is replaced."""
        self.get_flow_run_logger(flow_run).info(f"Flow run {flow_run.id} is cancelled: cancelling Slurm job {job_id}")
        await _slurm("scancel", job_id)
        while (seen := await job_state(job_id)) is not None and seen[0] not in ENDED:
            await anyio.sleep(1)
        await self._mark_flow_run_as_cancelled(
            flow_run, state_updates={"message": f"Slurm job {job_id} cancelled with its flow run."})

    async def _state(self, flow_run: "FlowRun") -> StateType | None:
        run = await self.client.read_flow_run(flow_run.id)
        return run.state.type if run.state else None

    async def kill_infrastructure(self, infrastructure_pid: str, configuration: SlurmJobConfiguration,
                                  grace_seconds: int = 30) -> None:
        rc, out, err = await _slurm("scancel", infrastructure_pid)
        if rc != 0:
            raise InfrastructureNotFound(f"scancel {infrastructure_pid}: {err or out}")

    async def get_and_submit_flow_runs(self) -> list["FlowRun"]:
        submitted = await super().get_and_submit_flow_runs()
        await self._follow_unwatched()
        return submitted

    async def _follow_unwatched(self) -> None:
        """Follow the jobs of the pool's unfinished runs that no task of this worker follows
        (those a dead worker submitted): a job that has ended makes its run Crashed."""
        runs = await self.client.read_flow_runs(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[self._work_pool_name])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING]))))
        for run in runs:
            if str(run.id) not in self._followed and run.infrastructure_pid:
                self._followed.add(str(run.id))
                assert self._runs_task_group is not None
                self._runs_task_group.start_soon(self._watch, run, run.infrastructure_pid)

    async def _watch(self, flow_run: "FlowRun", job_id: str) -> None:
        try:
            self.get_flow_run_logger(flow_run).info(f"Following Slurm job {job_id} of flow run {flow_run.id}")
            state, code = await self._follow(flow_run, job_id)
            if state != "COMPLETED":
                await self._propose_crashed_state(flow_run, f"Slurm job {job_id} ended {state} (exit {code})")
        finally:
            self._followed.discard(str(flow_run.id))


"""Cheap engines to kill: one process imports labrun and Prefect once, then forks a fresh
`labrun` process for every run a test asks for.

Each run is the real command line (`labrun.cli.main`) in a child process of its own, with
the environment the test gives it, killed for real when it reaches its crash point
(LABRUN_CRASH_AT); only the interpreter start and the imports, seconds on a small machine,
are paid once instead of per run. The forker holds no thread and no connection when it forks.

    with EngineForker() as forker:
        result = forker.run(["run", idea, "--workspace", ws], env={"LABRUN_CRASH_AT": "attempt:1"})
        result.returncode  # -9 when killed

Protocol (stdin/stdout, one JSON object a line): {"args", "env", "out", "err", "new_session",
"whole_env"} in, {"pid"} out once forked and {"returncode"} once it ended; `out` and `err` are
files for the child's stdout and stderr. `forker.start(args, env)` returns at the fork, for a
test that kills the engine from outside.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path



class EngineForker:
    def __init__(self, env: dict[str, str] | None = None, inherit: bool = True):
        """`env`: the forker's environment, over this process's own unless `inherit` is False."""
        self.env = {**(os.environ if inherit else {}), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix="labrun-forker-"))
        self.runs = 0
        self.current: ForkedRun | None = None

    def __enter__(self) -> "EngineForker":
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=self.env)
        ready = self.proc.stdout.readline()
        assert ready.strip() == "ready", f"the engine forker did not start: {ready!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.end_current()
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def run(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 300,
            whole_env: bool = False) -> subprocess.CompletedProcess:
        """`labrun <args>` to its end; its environment is the forker's with `env` over it, or
        with `whole_env`, `env` alone (as Popen's env=)."""
        run = self.start(args, env, whole_env=whole_env)
        out, err = run.communicate(timeout)
        return subprocess.CompletedProcess(["labrun", *args], run.returncode, out, err)

    def start(self, args: list[str], env: dict[str, str] | None = None, new_session: bool = False,
              whole_env: bool = False) -> "ForkedRun":
        """`labrun <args>` started, not waited for: what a test kills from outside (with
        `new_session`, in a session and process group of its own, as Popen's start_new_session)."""
        self.end_current()
        self.runs += 1
        out, err = self.tmp / f"{self.runs}.out", self.tmp / f"{self.runs}.err"
        self.proc.stdin.write(json.dumps({"args": args, "env": env or {}, "out": str(out), "err": str(err),
                                          "new_session": new_session, "whole_env": whole_env}) + "\n")
        self.proc.stdin.flush()
        started = json.loads(self.proc.stdout.readline())
        self.current = ForkedRun(self, started["pid"], args, out, err)
        return self.current

    def end_current(self) -> None:
        """Kill the run a test left running (it failed before its end), so that the forker
        answers the next run: one run at a time."""
        if self.current is not None and self.current.returncode is None:
            try:
                os.kill(self.current.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.current.communicate(60)


class ForkedRun:
    """One forked `labrun` run, with what tests use of a Popen: `pid`, `send_signal()`, `poll()`,
    `wait()`, `communicate()`."""

    def __init__(self, forker: EngineForker, pid: int, args: list[str], out: Path, err: Path):
        self.forker, self.pid, self.args, self.out, self.err = forker, pid, args, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not _exists(self.pid):
            self.communicate()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float = 300) -> int:
        self.communicate(timeout)
        return self.returncode

    def communicate(self, timeout: float = 300) -> tuple[str, str]:
        if self.returncode is None:
            answer: list[str] = []
            reader = threading.Thread(target=lambda: answer.append(self.forker.proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(timeout)
            assert answer and answer[0], f"labrun {' '.join(self.args)} did not end within {timeout} s"
            self.returncode = json.loads(answer[0])["returncode"]
        return tuple(f.read_text() if f.exists() else "" for f in (self.out, self.err))  # killed at once: none


def _exists(pid: int) -> bool:
    """Whether `pid` is still a process that runs (the forker reaps its children at once)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


PREFECT_AT_RUN = ("fastapi.encoders", "prefect.engine", "prefect.flow_engine", "prefect.task_engine",
                  "prefect.artifacts", "prefect.telemetry.run_telemetry", "anyio._backends._asyncio")
"""What Prefect imports only once a flow runs (FastAPI's encoders serialise its parameters)."""
RUN_IMPORTS = (
    # What a run imports only when it gets there (a quarter of a killed run's CPU, each time):
    *PREFECT_AT_RUN, "prefect.utilities.visualization", "psutil", "sqlite3", "pydantic.color",
    "rich._emoji_codes", "encodings.idna",
    "labrun.cli.reading", "labrun.cli.serving", "labrun.cli.branches", "labrun.run_api.api",
    "labrun.interrupts", "labrun.model_api_limit",
)
"""Modules a `labrun run` imports lazily, imported once here instead of in every fork; a
name the code no longer has only costs its fork the import again, so a missing one is skipped."""


def _serve() -> None:
    import importlib

    import labrun.agents.anthropic  # noqa: F401  (everything a run imports, once)
    import labrun.agents.scripted  # noqa: F401
    import labrun.cli
    import labrun.cli.running  # noqa: F401
    import labrun.flows.session  # noqa: F401
    import labrun.phases.phase  # noqa: F401

    for name in RUN_IMPORTS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass

    assert threading.active_count() == 1, "a thread before fork(): the children would inherit its locks"
    gc.freeze()  # the children's collector leaves the shared imports alone (and their pages shared)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job, labrun.cli.main)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"returncode": code}), flush=True)


def _child(job: dict, main) -> None:
    """In the forked child: become `labrun <args>` with the job's environment, then exit."""
    import atexit

    from labrun import crashpoints

    code = 1
    try:
        if job["new_session"]:
            os.setsid()
        if job["whole_env"]:
            os.environ.clear()
        os.environ.update(job["env"])
        crashpoints.arm()
        out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the jobs stay the forker's
        sys.stdin = open(os.devnull)
        sys.stdout.reconfigure(line_buffering=True)  # a kill -9 keeps what was printed
        sys.stderr.reconfigure(line_buffering=True)
        code = main(job["args"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what an interpreter's exit does: Prefect drains its workers
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _serve()

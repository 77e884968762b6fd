"""Experiment attempts: what a `kill -9` of the engine costs a running attempt, and k
independent attempts on k GPUs at once against one at a time.

Prints two tables, measured side by side in one run, with real supervised commands
(`labrun.supervisor`), real Prefect subtasks and a fake device list (CUDA_VISIBLE_DEVICES
with ids of this run's own: no GPU is needed, and no other labrun's GPU locks are taken):

1. Command-seconds lost per kill. An engine (a process of its own that opens the session
   and calls `run_experiment` with one GPU, a command of `--seconds` S seconds) is killed
   with `kill -9` (its process alone, as the OOM killer or a crash would) at a random point
   of the command; the session is then opened again and the attempt re-attached as the
   resume does (`PhaseAttempts.adopt`). The command notes its start and end
   (`date +%s.%N`) in the workspace; command-seconds executed is the sum of its spans, and
   what is lost is that sum minus S. Beside it, the same with the protection off: the
   attempt dies with the engine (its supervisor and its command killed with it, as before
   attempts had a supervisor), the resume finds it INTERRUPTED and runs it again, as the
   model would; a killed span ends at the kill. With one GPU each, GPU-seconds lost are the
   same figures. Goal: 0 lost with the protection on.
2. Speed-up of k attempts on k devices: k attempts with `gpus=1`, each a command of
   `--attempt-s` T seconds that sleeps (this measures the engine's scheduling, not the
   machine's cores), started with `run_in_background` and followed with `experiment_output`,
   against the same k as foreground calls one after another; wall time from the first call
   to the last attempt recorded. Goal: speed-up ≥ 0.9 k. labrun runs at most as many
   attempts at once as the machine has CPUs (`Limits.parallel_attempts`): k defaults to
   min(4, CPUs), and a larger `--k` measures that cap (the speed-up then stays near the CPUs).

Run: `python bench/attempts.py [--kills 3] [--seconds 5] [--k K] [--attempt-s 4] [--repeat 2]`
(uses a throwaway Prefect home and its own Prefect server).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from prefect_env import REPO  # sets Prefect's environment: import it before Prefect or labrun
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

IDEA = REPO / "examples" / "demo_noise_averaging.yaml"
SPANS = "results/spans-{name}.txt"


def timed_command(name: str, seconds: float) -> str:
    """A command that sleeps `seconds` and notes its start and end in the workspace."""
    spans = SPANS.format(name=name)
    return f"echo start $(date +%s.%N) >> {spans}; sleep {seconds}; echo end $(date +%s.%N) >> {spans}"


def spans_of(ws: Path, name: str, killed_at: float | None = None) -> list[tuple[float, float]]:
    """The command's runs as (start, end); one with no end was killed, at `killed_at`."""
    path = ws / SPANS.format(name=name)
    marks = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    runs: list[tuple[float, float]] = []
    start = None
    for what, when in marks:
        if what == "start":
            if start is not None:  # killed before its end
                runs.append((start, _killed(killed_at, start)))
            start = float(when)
        else:
            runs.append((start, float(when)))
            start = None
    if start is not None:
        runs.append((start, _killed(killed_at, start)))
    return runs


def _killed(killed_at: float | None, start: float) -> float:
    assert killed_at is not None and killed_at >= start, "a run with no end, and no kill to end it"
    return killed_at


def new_session(ws: Path) -> None:
    from labrun.session import Session

    Session.open(ws, IDEA, "scripted").close()
    (ws / "results").mkdir()


def as_engine(ws: str, command: str) -> None:
    """The engine the bench kills: it opens the session and runs one attempt in its turn."""
    from labrun.phase_registry import BY_KEY
    from labrun.phases.phase import toolbox
    from labrun.session import Session

    session = Session.open(ws)
    result = toolbox(session, BY_KEY["experiments"]).call(
        "run_experiment", {"command": command, "purpose": "bench: killed mid-attempt", "gpus": 1})
    print(result.content)  # reached only if the bench failed to kill it


def supervisor_report(ws: Path) -> dict:
    """The killed attempt's supervisor's report (`labrun.supervisor`): its pid and its command's group."""
    from labrun.workspace import Workspace

    try:
        return json.loads(Workspace(ws).attempt_file(1, "supervisor").read_text())
    except (OSError, ValueError):  # not yet written
        return {}


def kill_mid_attempt(ws: Path, seconds: float, at: float, protected: bool) -> dict:
    """One engine killed `at` seconds into its attempt's command, then the resume; what ran."""
    from labrun.phase_registry import BY_KEY
    from labrun.phases.phase import toolbox
    from labrun.session import Session

    new_session(ws)
    command = timed_command("killed", seconds)
    engine = subprocess.Popen([sys.executable, __file__, "--as-engine", str(ws), command],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        started = _wait(lambda: spans_of(ws, "killed", time.time()) or engine.poll() is not None, 300,
                        "the engine's attempt to start")
        assert engine.poll() is None, engine.communicate()[1][-3000:]
        report = _wait(lambda: (r := supervisor_report(ws)).get("pgid") and r, 60, "the supervisor's report")
        time.sleep(max(0.0, started[0][0] + at - time.time()))
        killed_at = time.time()
    finally:
        engine.send_signal(signal.SIGKILL)  # its process alone
        engine.wait(60)
    if not protected:  # the attempt dies with the engine, as it did before it had a supervisor
        killed_at = time.time()  # its command's run ends here
        os.kill(report["pid"], signal.SIGKILL)
        os.killpg(report["pgid"], signal.SIGKILL)

    resumed = time.monotonic()
    session = Session.open(ws)  # the resume: a RUNNING attempt whose supervisor is gone is INTERRUPTED
    try:
        box = toolbox(session, BY_KEY["experiments"])
        attempt = session.state.attempts[0]
        if attempt.status == "RUNNING":
            attempt = box.experiments.adopt(attempt.n)
        else:  # the model is told it was interrupted, and runs it again
            result = box.call("run_experiment", {"command": command, "purpose": "bench: again", "gpus": 1})
            assert "SUCCESS" in result.content, result.content
        statuses = [a.status for a in session.state.attempts]
    finally:
        session.close()
    runs = spans_of(ws, "killed", killed_at)
    executed = sum(end - start for start, end in runs)
    return {"at": at, "runs": len(runs), "executed": executed, "lost": executed - seconds,
            "statuses": statuses, "resume": time.monotonic() - resumed}


def _wait(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.05)
    raise SystemExit(f"bench/attempts.py: timed out waiting for {what}")


def k_attempts(ws: Path, k: int, seconds: float, at_once: bool) -> dict:
    """k attempts of `seconds` each with a GPU of its own: in the background at once, or as
    foreground calls one after another. Wall time from the first call to the last recorded."""
    from labrun.phase_registry import BY_KEY
    from labrun.phases.phase import toolbox
    from labrun.session import Session

    new_session(ws)
    session = Session.open(ws)
    session.state.parallel_attempts = k  # `--parallel-attempts k`; Limits caps it at the CPUs
    try:
        box = toolbox(session, BY_KEY["experiments"])
        start, called = time.monotonic(), time.time()
        calls = [{"command": timed_command(str(i), seconds), "purpose": f"bench: attempt {i}", "gpus": 1,
                  "run_in_background": at_once} for i in range(k)]
        results = [box.call("run_experiment", c) for c in calls]
        if at_once:
            results = [box.call("experiment_output", {"attempt": int(r.content.split()[1].rstrip(":")), "wait_s": 600})
                       for r in results]
        wall = time.monotonic() - start
        assert all(r.content.startswith(f"Attempt {i + 1}: SUCCESS") for i, r in enumerate(results)), \
            [r.content for r in results]
        gpus = [tuple(a.gpus or ()) for a in session.state.attempts]
        assert all(len(g) == 1 for g in gpus), gpus
        limit = session.limits.parallel_attempts
    finally:
        session.close()
    runs = [spans_of(ws, str(i))[0] for i in range(k)]
    return {"wall": wall, "gpus": gpus, "limit": limit, "overlap": _most_at_once(runs),
            "starts": [s - called for s, _ in runs]}


POOL = "bench-gpu"


def pool_attempt(ws: Path, pool: str | None, name: str, seconds: float) -> dict:
    """One foreground attempt of a new session, on work pool `pool` or in the engine: seconds
    from the call to its command's start and to its record; on a pool, when the worker took
    its flow run (Pending) and when the flow run's process ran it (Running), from the call."""
    from labrun.phase_registry import BY_KEY
    from labrun.phases.phase import toolbox
    from labrun.session import Session

    new_session(ws)
    session = Session.open(ws, experiments_pool=pool)
    try:
        called, start = time.time(), time.monotonic()
        result = toolbox(session, BY_KEY["experiments"]).call(
            "run_experiment", {"command": timed_command(name, seconds), "purpose": "bench: an idle pool"})
        recorded = time.monotonic() - start
        assert result.content.startswith("Attempt 1: SUCCESS"), result.content
        flow_run = session.records.run(1).get("flow_run")
    finally:
        session.close()
    [(began, _)] = spans_of(ws, name)
    row = {"start": began - called, "recorded": recorded}
    if flow_run:
        row.update(_flow_run_marks(flow_run, called))
    return row


def _flow_run_marks(flow_run: str, since: float) -> dict:
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(UUID(flow_run))
    first = {}
    for state in states:
        first.setdefault(state.type.value, state.timestamp.timestamp() - since)
    return {"taken": first.get("PENDING"), "running": first.get("RUNNING")}


def idle_pool(console: Console, root: Path, args: argparse.Namespace, api_url: str) -> None:
    """A process worker on pool POOL, idle, then attempts sent to it one at a time, beside the
    same attempts run in the engine."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from labrun import prefect_processes as processes
    from labrun.serving.pools import unattended

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
    from prefect.settings import PREFECT_WORKER_QUERY_SECONDS

    poll_s = args.worker_poll_s or PREFECT_WORKER_QUERY_SECONDS.value()
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": str(poll_s)}
    worker = processes.start_worker(env, root / "worker.log", pool=POOL, name="bench-worker")
    try:
        _wait(lambda: unattended(POOL) is None or worker.poll() is not None, 300, "the worker's first poll")
        assert worker.poll() is None, (root / "worker.log").read_text()[-3000:]
        time.sleep(2)  # idle: it has polled, and polls on
        rows = []
        for i in range(args.pool_attempts):
            rows.append(("engine", pool_attempt(root / f"here-{i}", None, f"here-{i}", 1)))
            rows.append((f"work pool ({POOL})", pool_attempt(root / f"pool-{i}", POOL, f"pool-{i}", 1)))
    finally:
        processes.stop(worker)
    poll = f"{poll_s:g} s" + ("" if args.worker_poll_s else ", Prefect's default")
    table = Table(title=f"an attempt's wait from request to start, on an idle pool (one process worker, "
                        f"polling every {poll}), and in the engine")
    for col in ("where", "taken by the worker s", "its process running s", "command started s", "recorded s"):
        table.add_column(col, justify="left" if col == "where" else "right")
    for where, r in rows:
        table.add_row(where, *(f"{r[k]:.2f}" if r.get(k) is not None else "" for k in
                               ("taken", "running", "start", "recorded")))
    console.print(table)
    console.print("seconds from the `run_experiment` call: the flow run taken (Pending), its process "
                  "running the attempt flow (Running), the command's own start, the attempt recorded; "
                  "a 1 s command each")
    here = statistics.median(r["start"] for w, r in rows if w == "engine")
    there = statistics.median(r["start"] for w, r in rows if w != "engine")
    console.print(f"request to start: {there:.2f} s on the idle pool against {here:.2f} s in the engine (medians)")


def _most_at_once(runs: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def start_server():
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url  # this process's and the engines'
    return server


def main() -> None:
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="engine kills, each way; 0: none (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=5, help="S: the killed attempt's command (default %(default)s)")
    parser.add_argument("--k", type=int, default=min(4, cpus), help="attempts at once (default min(4, CPUs): %(default)s)")
    parser.add_argument("--attempt-s", type=float, default=4, help="T: each of the k attempts' command (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the k attempts, each way; 0: none (default %(default)s)")
    parser.add_argument("--pool-attempts", type=int, default=2,
                        help="attempts sent to an idle work pool, and as many in the engine; 0: none (default %(default)s)")
    parser.add_argument("--worker-poll-s", type=float, default=0,
                        help="the pool's worker polls this often, s (PREFECT_WORKER_QUERY_SECONDS; default: Prefect's)")
    parser.add_argument("--seed", type=int, default=0, help="for the kill points (default %(default)s)")
    parser.add_argument("--as-engine", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # GPUs of this run's own: ids no other labrun (a test, another bench) locks.
    fake = [f"GPU-{uuid.uuid4()}" for _ in range(max(1, args.k))]
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(fake))
    if args.as_engine:
        as_engine(*args.as_engine)
        return

    console = Console()
    root = Path(tempfile.mkdtemp(prefix="labrun-bench-attempts-"))
    server = start_server()
    try:
        if args.kills:
            kills(console, root, args)
        if args.repeat:
            at_once(console, root, args, cpus)
        if args.pool_attempts:
            idle_pool(console, root, args, server.api_url)
    finally:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)  # while the server is up: else the exit retries for a minute
        EventsWorker.drain_all(timeout=10)
        server.stop()


def kills(console: Console, root: Path, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    points = [rng.uniform(0.1, 0.9) * args.seconds for _ in range(args.kills)]
    table = Table(title=f"kill -9 of the engine mid-attempt: a {args.seconds:g} s command on 1 GPU, "
                        f"{args.kills} kills each way")
    for col in ("kill at s", "supervisor", "runs", "command-s run", "lost s", "recorded", "resume s"):
        table.add_column(col, justify="left" if col in ("supervisor", "recorded") else "right",
                         no_wrap=col == "recorded")
    lost: dict[bool, list[float]] = {True: [], False: []}
    for i, at in enumerate(points):
        for protected in (True, False):
            r = kill_mid_attempt(root / f"kill-{i}-{'on' if protected else 'off'}", args.seconds, at, protected)
            lost[protected].append(r["lost"])
            table.add_row(f"{at:.2f}", "on" if protected else "off",
                          str(r["runs"]), f"{r['executed']:.2f}", f"{r['lost']:.2f}", " ".join(r["statuses"]),
                          f"{r['resume']:.1f}")
    console.print(table)
    console.print("supervisor off: the attempt dies with the engine and the resume runs it again; "
                  "lost s: command-s run minus S (= GPU-s, one GPU each); resume s: from the "
                  "resume's start to the attempt recorded")
    console.print(f"command-seconds lost per kill: {statistics.mean(lost[True]):.3f} with the supervisor "
                  f"(goal 0), {statistics.mean(lost[False]):.2f} with the protection off "
                  f"(the command's own start and end add a few ms to each run)")


def at_once(console: Console, root: Path, args: argparse.Namespace, cpus: int) -> None:
    table = Table(title=f"{args.k} attempts of {args.attempt_s:g} s, each on a GPU of its own "
                        f"({args.k} fake devices, {cpus} CPUs)")
    for col in ("round", "how", "wall s", "commands started at s", "most at once", "GPUs used"):
        table.add_column(col, justify="left" if col == "how" else "right")
    walls: dict[bool, list[float]] = {True: [], False: []}
    limit = None
    for i in range(args.repeat):
        for background in ((True, False) if i % 2 == 0 else (False, True)):  # the order alternates
            r = k_attempts(root / f"k-{i}-{'bg' if background else 'fg'}", args.k, args.attempt_s, background)
            walls[background].append(r["wall"])
            limit = r["limit"]
            how = "background" if background else "foreground"
            table.add_row(str(i + 1), how, f"{r['wall']:.2f}", " ".join(f"{t:.2f}" for t in r["starts"]), str(r["overlap"]),
                          str(len({g for gpus in r["gpus"] for g in gpus})))
    console.print(table)
    console.print("background: all k with run_in_background, then experiment_output for each; foreground: "
                  "one call after another, one at a time; wall s: from the first call to the last attempt "
                  "recorded; commands started at s: each command's own start, from the first call")
    one, many = statistics.median(walls[False]), statistics.median(walls[True])
    capped = f"; labrun runs at most {limit} at once here (the CPUs)" if limit is not None and limit < args.k else ""
    console.print(f"speed-up of {args.k} at once: {one / many:.2f}x = {one / many / args.k:.2f} k "
                  f"(medians {one:.2f} s against {many:.2f} s; goal ≥ 0.9 k){capped}")


if __name__ == "__main__":
    main()

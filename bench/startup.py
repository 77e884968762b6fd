"""Start-up: the time from invoking `labrun run` to the first phase starting (its
"phase 1 of 6 planning started" line), with a cold Prefect home (no database yet: the very
first run) and a warm one. labrun without a server (it starts an API for the run alone, at
once, in the background, and stops it with the run) runs beside Prefect's default in the
same rounds (the flow called without an API, so Prefect starts its ephemeral server when the
flow first needs it), and the ratios labrun / Prefect's default are printed for a first run
and a warm one (the goal: at most 0.9 each). Also labrun on a running server
(PREFECT_API_URL or `labrun server`), and `labrun run` and `labrun resume` on a finished
session.

    python bench/startup.py [--repeat 3]

The scripted agent; each measured run is stopped (SIGINT) once its first phase has started.
Python writes its bytecode caches here (PYTHONDONTWRITEBYTECODE is dropped), as in an
installed labrun.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labrun.prefect_processes import free_port, server_env, stop, wait_healthy  # noqa: E402
from labrun.run_api.process import start_api  # noqa: E402

DEMO = REPO / "examples" / "demo_noise_averaging.yaml"
FIRST_PHASE = "phase 1 of 6 planning started"
PREFECT_DEFAULT = (
    "import logging, sys; logging.basicConfig(level=logging.INFO); "
    "from labrun.flows.session import research_session; "
    "research_session(sys.argv[1], sys.argv[2], 'scripted')"
)


COLD_PREFECT = "cold home · Prefect's default (ephemeral server on first use)"
COLD_LABRUN = "cold home · labrun (an API for this run, started at once)"
WARM_PREFECT = "warm home · Prefect's default"
WARM_LABRUN = "warm home · labrun (an API for this run)"


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "LABRUN_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                # Prefect's default waits 20 s for its ephemeral server: too short for a first
                # start (the database migration) on a busy 2-core machine
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"})
    return env


def to_first_phase(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `cmd` to its first phase's start line; then stops it."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = []
        for line in proc.stderr:
            if FIRST_PHASE in line:
                return time.monotonic() - started
            seen.append(line)
        raise RuntimeError(f"{' '.join(cmd)} ended (code {proc.wait()}) before its first phase:\n"
                           + "".join(seen[-20:]))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def labrun_run(ws: Path) -> list[str]:
    return [sys.executable, "-m", "labrun.cli", "run", str(DEMO), "--workspace", str(ws), "--agent", "scripted"]


def prefect_default(ws: Path) -> list[str]:
    return [sys.executable, "-c", PREFECT_DEFAULT, str(DEMO), str(ws)]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="labrun-bench-startup-") as tmp_name:
        tmp = Path(tmp_name)
        n = iter(range(10**6))

        def ws() -> Path:
            return tmp / f"ws-{next(n)}"

        warm = tmp / "warm-home"
        to_first_phase(labrun_run(ws()), base_env(warm))  # makes the warm home's database
        for i in range(args.repeat):
            print(f"round {i + 1} of {args.repeat} …", file=sys.stderr)
            side_by_side = [(COLD_PREFECT, prefect_default, tmp / f"cold-p-{i}"),
                            (COLD_LABRUN, labrun_run, tmp / f"cold-l-{i}"),
                            (WARM_PREFECT, prefect_default, warm), (WARM_LABRUN, labrun_run, warm)]
            if i % 2:  # neither goes first every round
                side_by_side = [side_by_side[k] for k in (1, 0, 3, 2)]
            for name, command, home in side_by_side:
                rows.setdefault(name, []).append(to_first_phase(command(ws()), base_env(home)))

        port = free_port()
        url = f"http://127.0.0.1:{port}/api"
        api = start_api(port, server_env(url, base_env(warm)), tmp / "api.log")
        try:
            wait_healthy(url, api, tmp / "api.log")
            env = {**base_env(warm), "PREFECT_API_URL": url}
            for _ in range(args.repeat):
                rows.setdefault("a server running (PREFECT_API_URL or `labrun server`) · labrun",
                                []).append(to_first_phase(labrun_run(ws()), env))
            done = ws()
            subprocess.run(labrun_run(done), env=env, check=True, capture_output=True)
            for _ in range(args.repeat):
                rows.setdefault("finished session · `labrun run` (answer)", []).append(timed(labrun_run(done), env))
                rows.setdefault("finished session · `labrun resume` (answer)", []).append(
                    timed([sys.executable, "-m", "labrun.cli", "resume", str(done)], env))
        finally:
            stop(api)

    table = Table("start-up (2-core machine; scripted agent)", "median s", "min s", "max s", "runs",
                  title=f"labrun start-up · invocation to the first phase's start · load {os.getloadavg()[0]:.1f}")
    for name, times in rows.items():
        table.add_row(name, f"{statistics.median(times):.1f}", f"{min(times):.1f}", f"{max(times):.1f}",
                      str(len(times)))
    console = Console()
    console.print(table)
    for what, mine, theirs, goal in (("first run (new home)", COLD_LABRUN, COLD_PREFECT, 0.9),
                                     ("warm run", WARM_LABRUN, WARM_PREFECT, 0.9)):
        ratio = statistics.median(rows[mine]) / statistics.median(rows[theirs])
        console.print(f"{what}: labrun / Prefect's default = {ratio:.2f} (goal at most {goal}: "
                      f"{'met' if ratio <= goal else 'not met'})")


if __name__ == "__main__":
    main()

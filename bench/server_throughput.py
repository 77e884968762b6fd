"""Sessions completed per minute through a Prefect server, with 1, 2 and 4 sessions at once.

Starts its own `prefect server start` (a free port on 127.0.0.1, a throwaway PREFECT_HOME),
creates the `labrun` pool and the rest as `labrun server` does, deploys prefect.yaml, starts
one worker, and then, for each concurrency level N, sets the `sessions` work queue's limit
to N, submits N × --per-slot new sessions of the demo idea with the scripted agent (an
offline stand-in, not research) and times them until the last one completes.

    python bench/server_throughput.py [--levels 1,2,4] [--per-slot 2] [--latency 0]

`--latency S` makes the scripted agent wait S seconds per model call, like a real model;
with 0 the numbers are the engine's and the server's own cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefect.settings import PREFECT_API_URL, temporary_settings  # noqa: E402

from labrun.serving.deploy import deploy  # noqa: E402
from labrun.serving.prepare import prepare
from labrun import prefect_processes as processes
from labrun import serving
from labrun.serving import submit
from labrun.run_params import RunParams

DEMO = REPO / "examples" / "demo_noise_averaging.yaml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="1,2,4", help="concurrency levels (default %(default)s)")
    p.add_argument("--per-slot", type=int, default=2, help="sessions per concurrent slot (default %(default)s)")
    p.add_argument("--latency", type=float, default=0.0, help="scripted agent's seconds per model call")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="labrun-bench-"))
    port = processes.free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LABRUN_SCRIPTED"))}
    env.update({"PREFECT_HOME": str(tmp / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_API_URL": api_url, "PREFECT_SERVER_LOGGING_LEVEL": "WARNING"})
    worker_env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1",
                  "LABRUN_SCRIPTED_LATENCY_S": str(args.latency)}
    server = worker = None
    rows = []
    try:
        print(f"starting a Prefect server on 127.0.0.1:{port} …", file=sys.stderr)
        server = processes.start_server("127.0.0.1", port, env, tmp / "server.log")
        processes.wait_healthy(api_url, server, tmp / "server.log")
        with temporary_settings({PREFECT_API_URL: api_url}):
            prepare(session_slots=max(levels), crash_after_s=serving.DEFAULT_CRASH_AFTER_S)
            deploy(env)
            worker = processes.start_worker(worker_env, tmp / "worker.log")
            print("warming up (one session) …", file=sys.stderr)
            run_level(1, 1, tmp / "warmup")
            for n in levels:
                count = n * args.per_slot
                print(f"{n} at once: {count} sessions …", file=sys.stderr)
                rows.append((n, count, *run_level(n, count, tmp / f"level-{n}")))
    finally:
        processes.stop(worker)
        processes.stop(server)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)

    base = rows[0][4] if rows else 0
    print(f"\nlabrun server throughput · scripted agent (offline stand-in) · model latency "
          f"{args.latency:g} s/call · {os.cpu_count()} CPUs\n")
    head = ("at once", "sessions", "wall (s)", "sessions/min", "speed-up", "median run (s)", "median wait (s)")
    print("  ".join(f"{h:>15}" for h in head))
    for n, count, wall, run_s, per_min, wait_s in rows:
        cells = (n, count, f"{wall:.1f}", f"{per_min:.1f}", f"{per_min / base:.2f}×" if base else "-",
                 f"{run_s:.1f}", f"{wait_s:.1f}")
        print("  ".join(f"{c:>15}" for c in cells))
    return 0


def run_level(n: int, count: int, root: Path) -> tuple[float, float, float, float]:
    """Submit `count` sessions with the queue limited to `n`; wall s, median run s,
    sessions per minute, median wait s (created → started)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        queue = client.read_work_queue_by_name(serving.SESSION_QUEUE, work_pool_name=serving.POOL)
        client.update_work_queue(queue.id, concurrency_limit=n)
    started = time.monotonic()
    ids = [submit.submit_session(RunParams(idea_path=str(DEMO), workspace=str(root / f"session-{i:02d}"),
                                           agent="scripted")).id for i in range(count)]
    runs = {}
    while True:
        with get_client(sync_client=True) as client:
            runs = {i: client.read_flow_run(i) for i in ids}
        if all(r.state and r.state.is_final() for r in runs.values()):
            break
        time.sleep(0.5)
    wall = time.monotonic() - started
    bad = [r.name for r in runs.values() if not r.state.is_completed()]
    if bad:
        raise SystemExit(f"sessions did not complete: {bad}")
    durations = [(r.end_time - r.start_time).total_seconds() for r in runs.values()]
    waits = [(r.start_time - r.created).total_seconds() for r in runs.values()]
    return wall, statistics.median(durations), count / wall * 60, statistics.median(waits)


if __name__ == "__main__":
    sys.exit(main())

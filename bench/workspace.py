"""What a big workspace costs the engine: an empty workspace against one holding a 2 GB data
file and a 20,000-file virtual environment (named `env/`, found by its `pyvenv.cfg`).

Prints one table, measured side by side in one run (medians):
- one experiment attempt through `run_experiment` (the command is `true`, so the time is the
  engine's: the retry rule's snapshot, the attempt's record, the snapshot after it);
- one phase through its Prefect task (planning with the scripted agent at zero latency: the
  phase's start and end, the stale-output check, its two turns, the same in both);
- bytes the engine read while doing each (from /proc/self/io), which is what decides
  whether sparseness could flatter the figures: the 2 GB file is sparse by default, and a
  sparse file reads faster than real data, but the engine never reads it at all (it is above
  the size threshold, recorded by size and mtime). `--dense` writes real random data instead.
- one workspace snapshot on its own, the part of both that depends on the workspace;
- for scale, what one sha256 of the 2 GB file costs as real data (measured on 256 MB of
  random data in memory, times 8): the price of each snapshot before issue 11.

Run: `python bench/workspace.py [--repeat N] [--dense]` (uses a throwaway Prefect home).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prefect_env import REPO  # sets Prefect's environment: import it before Prefect or labrun
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

IDEA = REPO / "examples" / "demo_noise_averaging.yaml"
BIG_FILE = 2 << 30
VENV_FILES = 20_000


def bytes_read() -> int:
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def make_big(ws: Path, dense: bool) -> None:
    data = ws / "data" / "train.bin"
    data.parent.mkdir(parents=True)
    with open(data, "wb") as f:
        if dense:
            block = os.urandom(1 << 24)
            for _ in range(BIG_FILE // len(block)):
                f.write(block)
        else:
            f.truncate(BIG_FILE)
    env = ws / "env"
    (env / "bin").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    site = env / "lib" / "python3.11" / "site-packages"
    for i in range(VENV_FILES):
        package = site / f"package_{i // 100:03d}"
        if i % 100 == 0:
            package.mkdir(parents=True)
        (package / f"module_{i % 100:02d}.py").write_text(f"VALUE = {i}\n")


def open_session(ws: Path):
    from labrun.session import Session

    return Session.open(ws, IDEA if not (ws / ".labrun" / "state.json").exists() else None, "scripted")


def attempt(session, n: int) -> None:
    from labrun.phase_registry import BY_KEY
    from labrun.phases.phase import toolbox

    result = toolbox(session, BY_KEY["experiments"]).call(
        "run_experiment", {"command": "true", "purpose": f"bench {n}"})
    assert "SUCCESS" in result.content, result.content


def phase(session) -> None:
    from labrun.phase_registry import phase_version
    from labrun.phases.execution import TaskSpec
    from labrun.phases.phase import run_phase

    task = run_phase.with_options(result_storage=session.ws.results, refresh_cache=True)
    task(spec=TaskSpec.of(session), phase_key="planning",
         number=1, version=phase_version("planning"), upstream="none", refresh=True)


def measure(fn) -> tuple[float, int]:
    read, start = bytes_read(), time.perf_counter()
    fn()
    return time.perf_counter() - start, bytes_read() - read


def sha256_rate() -> float:
    """Seconds to hash 2 GB of real data, from 256 MB of random data in memory."""
    data = os.urandom(256 << 20)
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return (time.perf_counter() - start) * (BIG_FILE / len(data))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--dense", action="store_true", help="write the 2 GB file with random data")
    args = parser.parse_args()
    from prefect import flow

    from labrun.snapshot import workspace_files

    console = Console(width=120)
    root = Path(tempfile.mkdtemp(prefix="labrun-bench-ws-"))
    empty, big = root / "empty", root / "big"
    big.mkdir()
    made = time.perf_counter()
    make_big(big, args.dense)
    console.print(f"big workspace made in {time.perf_counter() - made:.1f} s "
                  f"({'dense' if args.dense else 'sparse'} 2 GB file, {VENV_FILES:,}-file env/)")

    results: dict[str, dict[str, list[tuple[float, int]]]] = {}

    @flow(name="bench-workspace", persist_result=False)
    def run_all() -> None:
        sessions = {"empty": open_session(empty), "big": open_session(big)}
        try:
            for name, session in sessions.items():
                attempt(session, 0)  # warm: the first snapshot of each workspace
                phase(session)
                results[name] = {"attempt": [], "phase": [], "snapshot": []}
            for i in range(args.repeat):  # side by side, so that the machine's load hits both
                for name, session in sessions.items():
                    results[name]["attempt"].append(measure(lambda: attempt(session, i + 1)))
                    results[name]["phase"].append(measure(lambda: phase(session)))
                    results[name]["snapshot"].append(measure(lambda: workspace_files(session.ws.root)))
        finally:
            for session in sessions.values():
                session.close()

    run_all()
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)  # before the embedded server stops
    EventsWorker.drain_all(timeout=10)
    table = Table(title=f"a big workspace against an empty one (median of {args.repeat})")
    for col in ("work", "empty (ms)", "big (ms)", "difference (ms)", "goal (ms)", "read, big (KB)"):
        table.add_column(col, justify="right" if col != "work" else "left")
    labels = {"attempt": "one experiment attempt (two snapshots)", "phase": "one phase (start, two turns, end)",
              "snapshot": "one workspace snapshot"}
    for work, goal in (("attempt", "≤ 50"), ("phase", "≤ 200"), ("snapshot", "")):
        e = statistics.median(t for t, _ in results["empty"][work]) * 1000
        b = statistics.median(t for t, _ in results["big"][work]) * 1000
        read = statistics.median(r for _, r in results["big"][work]) / 1024
        table.add_row(labels[work], f"{e:.1f}", f"{b:.1f}", f"{b - e:+.1f}", goal, f"{read:,.0f}")
    console.print(table)
    console.print(f"For scale: one sha256 of the 2 GB file as real data takes {sha256_rate():.1f} s "
                  "here (256 MB hashed in memory, times 8); before issue 11 every attempt paid it twice "
                  "and every phase twice more, besides reading it from disk.")


if __name__ == "__main__":
    main()

"""What a rerun from a phase costs against a fresh session, with the scripted agent.

One finished six-phase session is made, then copied once per phase and rerun from that
phase (`from_phase`). Printed side by side: model calls and input tokens billed, and wall
time, of the fresh session and of each rerun, with the ratios. The scripted agent has no
latency, so the times are the engine's own (archiving the branch, cache hits, the rerun
phases' work).

Run: `python bench/rerun.py` (uses a throwaway Prefect home).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from prefect_env import REPO  # sets Prefect's environment: import it before Prefect or labrun

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

IDEA = REPO / "examples" / "demo_noise_averaging.yaml"


def billed(ws: Path) -> tuple[int, int]:
    """(model calls, input tokens) the scripted provider billed in this workspace."""
    lines = [json.loads(line) for line in (ws / ".labrun/faults/billed.jsonl").read_text().splitlines()]
    return len(lines), sum(line["input_tokens"] for line in lines)


def main() -> None:
    from labrun.flows.session import research_session
    from labrun.phase_registry import DEFAULT

    root = Path(tempfile.mkdtemp(prefix="labrun-bench-rerun-"))
    fresh = root / "fresh"
    research_session(str(IDEA), str(fresh), "scripted")  # warm-up: Prefect's server starts
    shutil.rmtree(fresh)
    started = time.perf_counter()
    research_session(str(IDEA), str(fresh), "scripted")
    fresh_s = time.perf_counter() - started
    calls, tokens = billed(fresh)

    table = Table("run", "model calls", "input tokens", "wall (s)", "tokens vs fresh", "time vs fresh",
                  title="A rerun from each phase against a fresh session (scripted agent)")
    table.add_row("fresh session", str(calls), f"{tokens:,}", f"{fresh_s:.1f}", "1.00", "1.00")
    for phase in DEFAULT:
        ws = root / phase
        shutil.copytree(fresh, ws, symlinks=True)
        started = time.perf_counter()
        research_session(None, str(ws), from_phase=phase)
        took = time.perf_counter() - started
        c, t = billed(ws)
        table.add_row(f"rerun --from {phase}", str(c - calls), f"{t - tokens:,}", f"{took:.1f}",
                      f"{(t - tokens) / tokens:.2f}", f"{took / fresh_s:.2f}")
    Console().print(table)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Every bench runs, on its smallest setting: a smoke test that each ends without an error.
Their figures are for `bench/`'s own runs, side by side on a quiet machine, not for CI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from e2e_helpers import REPO

from agent_clis import claude_executable

SMALLEST = {
    "overhead.py": ["--repeat", "1"],
    "tokens.py": ["--jobs", "1", "--phases", "planning"],
    "workspace.py": ["--repeat", "1"],
    "startup.py": ["--repeat", "1"],
    "rerun.py": [],
    "server_throughput.py": ["--levels", "1", "--per-slot", "1"],
    "claude_tools.py": [],
    "integrity.py": [],
    "transfer.py": ["--files", "50", "--data-mb", "1"],
    "attempts.py": ["--kills", "1", "--seconds", "2", "--attempt-s", "1", "--repeat", "1", "--pool-attempts", "1",
                    "--worker-poll-s", "1"],
}


def test_every_bench_is_listed_here():
    assert sorted(SMALLEST) == sorted(p.name for p in (REPO / "bench").glob("*.py") if p.name != "prefect_env.py")


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_the_bench_runs_to_its_end(script, tmp_path):
    if script == "claude_tools.py" and claude_executable() is None:
        pytest.skip("the real Claude Code CLI is not installed: .ci/install-agent-clis")
    # Each bench makes its own Prefect home and server; none of the tests' may leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LABRUN_SCRIPTED"))}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), *SMALLEST[script]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]

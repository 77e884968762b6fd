"""Server mode with the real Codex CLI (`--agent codex` in the deployment): a spent usage
limit does not hold the worker. The flow run reschedules itself for the minute Codex names
(state "AwaitingUsageWindow"), its process exits, and a worker runs it again then; the phase
resumes the same Codex thread. Skipped without the CLI (`.ci/install-agent-clis`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest


from e2e_helpers import submit_run, client, status_json, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_clis import INSTALL, PREFIX  # noqa: E402
from auto_responder import IDEA  # noqa: E402
from codex_responder import MODEL, CodexResearcher, phase_of  # noqa: E402
from fake_responses_api import FakeResponsesAPI  # noqa: E402

LAUNCHER = PREFIX / "node_modules/.bin/codex"


@pytest.mark.skipif(not LAUNCHER.exists(), reason=f"the real Codex CLI is not installed: {INSTALL}")
def test_a_spent_codex_usage_limit_reschedules_the_flow_run(prefect_server, worker, tmp_path):
    idea, ws, home = tmp_path / "idea.yaml", tmp_path / "ws", tmp_path / "codex-home"
    idea.write_text(IDEA)
    home.mkdir()

    def usage_limit_reached() -> dict:
        return {"status": 429, "error": {"type": "usage_limit_reached", "message": "The usage limit has been reached",
                                         "resets_at": int(time.time()) + 1, "plan_type": "plus"}}

    with FakeResponsesAPI(default=CodexResearcher(faults={("setup", 0): [usage_limit_reached]})) as api:
        env = {"LABRUN_CODEX": str(LAUNCHER), "CODEX_HOME": str(home), "CODEX_API_KEY": "sk-proj-test-0000",
               "OPENAI_BASE_URL": f"{api.url}/v1", "LABRUN_MIN_WINDOW_WAIT_S": "0",
               "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
        run = submit_run(idea, ws, agent="codex", model=MODEL, job_variables={"env": env})
        final = wait_for([run.id])[str(run.id)]
        posts = [r for r in api.requests if r["method"] == "POST"]
    assert final.state.type.value == "COMPLETED", final.state
    with client() as c:
        history = c.read_flow_run_states(run.id)
    [state] = [s for s in history if s.name == "AwaitingUsageWindow"]
    assert state.is_scheduled()
    limited, after = [r for r in posts if phase_of(r["body"]) == "setup"][:2]
    minute_end = (int(limited["time"]) // 60 + 1) * 60  # Codex names the reset's minute
    scheduled = state.state_details.scheduled_time.timestamp()
    assert minute_end - 0.5 <= scheduled <= minute_end + 61 and after["time"] >= scheduled - 1
    # a new engine process ran the rescheduled flow run, resuming the thread
    runs = sorted((ws / ".labrun" / "phases" / "setup").glob("codex-run-*.jsonl"))
    starts = [json.loads(f.read_text().splitlines()[0]) for f in runs]
    assert len(starts) == 2 and starts[0]["engine_pid"] != starts[1]["engine_pid"]
    assert "resume" in starts[1]["argv"]
    assert status_json(ws, prefect_server.env)["session"]["complete"]

"""The Anthropic backend end to end: the real engine, the real `anthropic` SDK and `labrun`
processes against the fake Messages API, with a competent stand-in for the model.

The fake server runs in this process (a thread). `labrun run` runs as its own process where
it must be killable (SIGKILL mid-phase) or be seen as a user sees it; resumes and short runs
call the same command line's `main()` in this process, which saves an interpreter start and
the Prefect import per call. Usage is computed by the fake's prompt-cache model, so the
totals `labrun status --json` reports are checked against what the server billed, token for
token. `tests/auto_responder.py` plays the model.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from auto_responder import IDEA, PLAN as PLAN_MD, TURNS, AutoResearcher, phase_and_turn  # noqa: E402
from support import attempt_group, kill_attempt_supervisor, labrun, status, wait_for  # noqa: E402
from fake_messages_api import FakeMessagesAPI, count_tokens, prompt_blocks  # noqa: E402

from labrun.journal import Conversation, ReplyRecord  # noqa: E402
from labrun.prices import cost_usd  # noqa: E402
from labrun.state import phase_table  # noqa: E402
from labrun.status import session_status  # noqa: E402
from labrun.usage import Usage  # noqa: E402
from labrun.phase_registry import PHASES  # noqa: E402

USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
RATE_LIMITED = {"status": 429, "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"},
                "headers": {"retry-after": "1"}}
OVERLOADED = {"status": 529, "error": {"type": "overloaded_error", "message": "Overloaded"}}
SERVER_ERROR = {"status": 500, "error": {"type": "api_error", "message": "Internal server error"}}
BAD_KEY = {"status": 401, "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
BAD_REQUEST = {"status": 400, "error": {"type": "invalid_request_error",
                                        "message": "messages.1.content.0: unexpected `tool_use_id` found"}}


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def idea(tmp_path) -> Path:
    path = tmp_path / "idea.yaml"
    path.write_text(IDEA)
    return path


def run(idea: Path, ws: Path, *args: str):
    """`labrun run IDEA --workspace W --agent anthropic ...` in its own process."""
    return labrun("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", *args)


def replies(ws: Path, phase: str | None = None) -> list[ReplyRecord]:
    """Every model reply saved in the journals (of one phase, or all), across conversations."""
    found = []
    for p in PHASES:
        if phase in (None, p.key):
            for f in Conversation.files(ws / ".labrun" / "phases" / p.key):
                found += Conversation(f, repair=False).of(ReplyRecord)
    return found


def billed_total(api: FakeMessagesAPI) -> Usage:
    """What the fake server billed, priced the way labrun prices a reply."""
    total = Usage()
    for b in api.billed:
        u = Usage(**{k: b["usage"][k] for k in USAGE_FIELDS})
        u.cost_usd = cost_usd(b["model"], u)
        total += u
    return total


def assert_usage_is_what_was_billed(ws: Path, api: FakeMessagesAPI, report: dict | None = None) -> None:
    """`labrun status --json` totals are exactly what the fake server billed."""
    reported, billed = (report or status(ws))["usage"], billed_total(api)
    for field in USAGE_FIELDS:
        assert reported[field] == getattr(billed, field), field
    assert reported["cost_usd"] == pytest.approx(billed.cost_usd, abs=1e-9)
    assert billed.cost_usd > 0 and billed.cache_read_input_tokens > 0


def strip_cache_control(value):
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def blocks(body: dict) -> list[str]:
    """The conversation of a request as a list of (role, block) JSON strings, in order,
    without cache_control: the unit in which a prompt cache matches a prefix."""
    out = []
    for m in body["messages"]:
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        out += [m["role"] + ":" + json.dumps(strip_cache_control(b)) for b in content]
    return out


def turn_of(request: dict) -> tuple[str, int]:
    return phase_and_turn(request["body"])


def answered(api: FakeMessagesAPI) -> list[tuple[str, int]]:
    """(phase, turn) of every request the fake server billed, in order."""
    billed = {b["n"] for b in api.billed}
    return [turn_of(r) for r in api.requests if r["n"] in billed]


def assert_one_line_stop(result, *needles: str, ws: Path) -> None:
    """Stopped with a non-zero exit, one line saying why, and how to resume said once."""
    assert result.returncode not in (0, None), result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("labrun:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, result.stderr)
    closing = result.stderr[result.stderr.index(lines[0]):]  # the event log above may say it too
    assert closing.count(f"labrun resume {ws}") == 1, closing


def kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def process_gone(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# -- a whole session ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_session(tmp_path_factory, prefect_api):
    """One whole session through `labrun run`, shared by the tests that only read it."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("ANTHROPIC_AUTH_TOKEN", "LABRUN_MODEL", "LABRUN_PRICES", "LABRUN_CONTEXT_MANAGEMENT"):
            mp.delenv(name, raising=False)
        tmp = tmp_path_factory.mktemp("full")
        (tmp / "idea.yaml").write_text(IDEA)
        with FakeMessagesAPI(default=AutoResearcher(), cache_accounting=True) as api:
            mp.setenv("ANTHROPIC_API_KEY", "test-key")
            mp.setenv("ANTHROPIC_BASE_URL", api.url)
            result = run(tmp / "idea.yaml", tmp / "ws")
        yield result, api, tmp / "ws"


def test_a_full_session_bills_exactly_what_the_api_charged(full_session):
    result, api, ws = full_session
    assert result.returncode == 0, result.stderr
    assert "Session complete" in result.stdout
    assert "Traceback" not in result.stderr

    report = status(ws)
    assert report["session"]["complete"] and report["session"]["agent"] == "anthropic"
    assert [p["status"] for p in report["phases"]] == ["DONE"] * 6
    assert [(a["n"], a["status"]) for a in report["attempts"]] == [(1, "SUCCESS")]
    assert report["attempts"][0]["metrics"]["slope"] == json.loads((ws / "results/metrics.json").read_text())["slope"]
    for name in ("planning.md", "src/experiment.py", "REPORT.md", "README.md"):
        assert (ws / name).is_file(), name

    # One request a turn, each billed once, and the totals are what was billed.
    assert len(api.requests) == len(api.billed) == len(replies(ws)) == sum(TURNS.values())
    assert answered(api) == [(p, t) for p, n in TURNS.items() for t in range(1, n + 1)]
    assert all(r["headers"].get("x-stainless-retry-count") == "0" for r in api.requests)
    assert_usage_is_what_was_billed(ws, api, report)
    by_n = {r["n"]: turn_of(r)[0] for r in api.requests}
    for phase in report["phases"]:
        for field in USAGE_FIELDS:
            assert phase["usage"][field] == sum(b["usage"][field] for b in api.billed if by_n[b["n"]] == phase["key"])


def test_each_turn_is_logged_to_the_prefect_task_run_of_its_phase(full_session):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId,
                                                TaskRunFilter, TaskRunFilterName)

    _, _, ws = full_session
    with get_client(sync_client=True) as client:
        flow_runs = [r.id for r in flow_runs_of(client, ws)]
        phase_runs = {t.id: t.name for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_runs)),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[f"{n}-{p.key}" for n, p in enumerate(PHASES, 1)])))}
        logs = []
        deadline = time.monotonic() + 10
        while len(logs) < sum(TURNS.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            logs = [log for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_runs)), limit=200)
                if log.name == "labrun" and " · turn " in log.message]
    seen = {(phase_runs.get(log.task_run_id), log.message.split(" · ")[:2][1]) for log in logs}
    for n, p in enumerate(PHASES, 1):
        for t in range(1, TURNS[p.key] + 1):
            assert (f"{n}-{p.key}", f"turn {t}") in seen, (p.key, t, sorted(map(str, seen)))
    # The line names the phase, turn, tools, tokens and cost.
    line = next(log.message for log in logs if log.message.startswith("experiments · turn 1 ·"))
    assert "run_experiment" in line and "tokens" in line and "$" in line


def flow_runs_of(client, ws: Path) -> list:
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=200)
    found = [r for r in runs if r.parameters.get("workspace") == str(ws.resolve())]
    assert found, f"no flow run of {ws}"
    return found


def test_cache_breakpoints_and_a_conversation_rebuilt_byte_for_byte(full_session):
    _, api, _ = full_session
    previous: dict | None = None
    for request in api.requests:
        body = request["body"]
        # Breakpoints: the last tool, the system prompt, the last block of the last message
        # and of the previous turn's last message; nowhere else.
        marked = [i for i, t in enumerate(body["tools"]) if "cache_control" in t]
        assert marked == [len(body["tools"]) - 1]
        assert [("cache_control" in b) for b in body["system"]] == [True]
        users = [i for i, m in enumerate(body["messages"]) if m["role"] == "user"]
        expected = {len(body["messages"]) - 1} | ({users[-2]} if len(users) > 1 else set())
        found = {(i, j) for i, m in enumerate(body["messages"]) for j, b in enumerate(m["content"]) if "cache_control" in b}
        assert found == {(i, len(body["messages"][i]["content"]) - 1) for i in expected}
        assert len(marked) + 1 + len(found) <= 4

        phase, turn = phase_and_turn(body)
        if turn > 1:
            # Same system prompt and tools, and the previous request's conversation as a prefix.
            assert strip_cache_control(body["system"]) == strip_cache_control(previous["system"])
            assert strip_cache_control(body["tools"]) == strip_cache_control(previous["tools"])
            assert blocks(body)[: len(blocks(previous))] == blocks(previous)
            # So the prompt cache serves everything up to the previous request's end.
            usage = api.billed[api.requests.index(request)]["usage"]
            assert usage["cache_read_input_tokens"] >= sum(count_tokens(t) for t, _ in prompt_blocks(previous))
        previous = body
    # A phase's first request writes the cache; the following ones mostly read it.
    billed = [b["usage"] for b in api.billed]
    read = sum(u["cache_read_input_tokens"] for u in billed)
    prompt = sum(u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] + u["input_tokens"] for u in billed)
    assert read / prompt > 0.4


# -- transient and fatal errors -------------------------------------------------------------


def test_429_529_and_500_mid_phase_are_retried_by_prefect_and_the_session_completes(tmp_path, idea, serve):
    from labrun.flows.session import research_session

    faults = {("setup", 2): [RATE_LIMITED], ("experiments", 2): [OVERLOADED], ("analysis", 2): [SERVER_ERROR]}
    api = serve(AutoResearcher(faults))
    ws = tmp_path / "ws"
    state = research_session(str(idea), str(ws), "anthropic", return_state=True)  # in this process
    assert state.is_completed(), state.message

    # Each error cost one request, retried once; no successful call was made twice.
    turns = sum(TURNS.values())
    assert len(replies(ws)) == len(api.billed) == turns
    assert len(api.requests) == turns + 3
    assert answered(api) == [(p, t) for p, n in TURNS.items() for t in range(1, n + 1)]
    billed = {b["n"] for b in api.billed}
    assert [turn_of(r) for r in api.requests if r["n"] not in billed] == [("setup", 2), ("experiments", 2), ("analysis", 2)]
    # The retries are Prefect's (the SDK's are off): every request is the SDK's first try,
    # and the model-call task runs of those turns ran twice.
    assert all(r["headers"].get("x-stainless-retry-count") == "0" for r in api.requests)
    assert model_calls_run_twice(state) == {"setup turn 2", "experiments turn 2", "analysis turn 2"}
    # The retry after the 429 waited out its retry-after (1 s).
    i = next(i for i, r in enumerate(api.requests) if turn_of(r) == ("setup", 2))
    assert api.requests[i + 1]["time"] - api.requests[i]["time"] >= 0.9
    assert_usage_is_what_was_billed(ws, api)


def model_calls_run_twice(flow_state) -> set[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 10
        while True:
            task_runs = [t for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id])),
                limit=200) if " turn " in t.name]
            if all(t.state and t.state.is_final() for t in task_runs) or time.monotonic() > deadline:
                return {t.name for t in task_runs if t.run_count > 1}
            time.sleep(0.2)


def test_401_and_400_stop_the_session_at_once_with_what_to_do(tmp_path, idea, serve, cli):
    api = serve(AutoResearcher({("planning", 1): [BAD_KEY], ("setup", 2): [BAD_REQUEST]}))
    ws = tmp_path / "ws"

    result = run(idea, ws)
    assert_one_line_stop(result, "401", "ANTHROPIC_API_KEY", ws=ws)
    assert "test-key" not in result.stderr
    assert len(api.requests) == 1 and not api.billed  # not retried
    assert phase_table((ws / "STATE.md").read_text())["planning"] == "FAILED"

    result = cli("resume", str(ws))
    assert_one_line_stop(result, "400", "invalid_request_error", "a retry cannot fix it", ws=ws)
    assert [turn_of(r) for r in api.requests] == [("planning", 1), ("planning", 1), ("planning", 2),
                                                  ("setup", 1), ("setup", 2)]
    table = phase_table((ws / "STATE.md").read_text())
    assert table["planning"] == "DONE" and table["setup"] == "FAILED"
    assert_usage_is_what_was_billed(ws, api)


# -- kill -9 and resume ---------------------------------------------------------------------


def test_kill_9_during_a_model_call_then_resume_pays_for_no_turn_twice(tmp_path, idea, serve, cli, forker):
    api = serve(AutoResearcher({("implementation", 2): [{"hang": True}]}))
    ws = tmp_path / "ws"
    proc = forker.start(["run", str(idea), "--workspace", str(ws), "--agent", "anthropic"], env=dict(os.environ),
                        whole_env=True)
    wait_for(lambda: any(turn_of(r) == ("implementation", 2) for r in api.requests),
             what="the model call of implementation turn 2")
    kill(proc)
    hanging = len(api.requests) - 1
    before = [turn_of(r) for r in api.requests[:hanging]]
    assert before == [("planning", 1), ("planning", 2), ("setup", 1), ("setup", 2), ("implementation", 1)]
    assert len(api.billed) == hanging  # the hanging call was never answered, so never billed

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr

    after = [turn_of(r) for r in api.requests[hanging + 1:]]
    assert not set(after) & set(before)  # no completed turn was asked again
    assert after[0] == ("implementation", 2)
    # The resumed call continues the conversation: every completed turn, then the resume note.
    resumed, cut = blocks(api.requests[hanging + 1]["body"]), blocks(api.requests[hanging]["body"])
    assert resumed[: len(cut)] == cut
    (note,) = resumed[len(cut):]
    assert note.startswith("user:") and "interrupted" in json.loads(note[5:])["text"]
    assert len(Conversation.files(ws / ".labrun/phases/implementation")) == 1

    report = status(ws)
    assert report["session"]["complete"]
    assert {p["key"]: p["runs"] for p in report["phases"]} == {
        "planning": 1, "setup": 1, "implementation": 2, "experiments": 1, "analysis": 1, "documentation": 1}
    assert len(replies(ws)) == len(api.billed) == sum(TURNS.values())
    assert_usage_is_what_was_billed(ws, api, report)


def test_a_phase_cut_off_before_its_first_reply_asks_the_same_request_again(tmp_path, idea, serve):
    from labrun.flows.session import research_session

    api = serve(AutoResearcher({("setup", 1): [BAD_KEY]}))
    ws = tmp_path / "ws"
    assert research_session(str(idea), str(ws), "anthropic", return_state=True).is_failed()  # in this process
    cut = len(api.requests) - 1
    assert turn_of(api.requests[cut]) == ("setup", 1) and len(api.billed) == cut

    assert research_session(None, str(ws), return_state=True).is_completed()
    # Nothing was said in the phase yet: the same request again, no second kickoff, no note.
    assert api.requests[cut + 1]["body"] == api.requests[cut]["body"]
    assert len(api.requests) == len(api.billed) + 1 == sum(TURNS.values()) + 1
    assert_usage_is_what_was_billed(ws, api)


def test_kill_9_between_a_reply_and_its_tool_result_answers_it_as_interrupted(tmp_path, idea, serve, cli, forker):
    api = serve(AutoResearcher(slow_experiment_s=120))
    ws = tmp_path / "ws"
    proc = forker.start(["run", str(idea), "--workspace", str(ws), "--agent", "anthropic"], env=dict(os.environ),
                        whole_env=True)

    def attempt() -> dict | None:
        try:
            attempts = json.loads((ws / ".labrun/state.json").read_text())["attempts"]
        except (FileNotFoundError, ValueError):
            return None
        return attempts[0] if attempts and attempt_group(ws) else None

    wait_for(attempt, what="the experiment attempt to start")
    kill(proc)
    pgid = attempt_group(ws)
    kill_attempt_supervisor(ws)  # the attempt outlives the engine, not its supervisor (as after a reboot)
    assert "- Status: RUNNING" in (ws / "STATE.md").read_text()
    (reply,) = replies(ws, "experiments")  # saved, its tool call never answered
    (call,) = reply.tool_uses()
    asked = len(api.requests)

    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    assert process_gone(pgid)  # the attempt's command was killed, not left running

    text = (ws / "STATE.md").read_text()
    assert "### Attempt 1\n- Status: INTERRUPTED" in text
    assert "### Attempt 2\n- Status: SUCCESS" in text
    # The model was not asked that turn again: its next request carries the tool result
    # "interrupted" for the call it had made, and the resume note.
    assert [turn_of(r) for r in api.requests].count(("experiments", 1)) == 1
    first = api.requests[asked]["body"]
    assert turn_of(api.requests[asked]) == ("experiments", 2)
    last = first["messages"][-1]["content"]
    result_block = next(b for b in last if b["type"] == "tool_result")
    assert result_block["tool_use_id"] == call["id"] and result_block["is_error"] is True
    assert "cut off" in result_block["content"] and "INTERRUPTED" in result_block["content"]
    assert "interrupted" in last[-1]["text"] and "run_experiment" in last[-1]["text"]
    report = status(ws)
    assert report["session"]["complete"]
    assert_usage_is_what_was_billed(ws, api, report)


# -- limits ---------------------------------------------------------------------------------


def test_a_spent_budget_stops_the_session_and_a_larger_one_continues_it(tmp_path, idea, serve, cli):
    api = serve(AutoResearcher())
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--budget-usd", "0.07")  # spent in the middle of setup
    assert_one_line_stop(result, "budget of $0.07 is spent", f"labrun resume {ws} --budget-usd", ws=ws)
    stopped = session_status(ws)
    assert stopped["usage"]["cost_usd"] >= 0.07
    phase = next(p["key"] for p in stopped["phases"] if p["status"] == "FAILED")
    asked = len(api.requests)
    last = api.requests[-1]["body"]

    result = cli("resume", str(ws), "--budget-usd", "5")
    assert result.returncode == 0, result.stderr
    report = status(ws)
    assert report["session"]["complete"]
    # The same conversation goes on: one conversation file, nothing asked twice.
    assert len(Conversation.files(ws / ".labrun/phases" / phase)) == 1
    first = api.requests[asked]["body"]
    assert phase_and_turn(first)[0] == phase
    assert blocks(first)[: len(blocks(last))] == blocks(last)
    assert len(api.requests) == len(api.billed) == len(replies(ws)) == sum(TURNS.values())
    assert_usage_is_what_was_billed(ws, api, report)


def test_a_turn_limit_stops_the_phase_and_names_the_limit(tmp_path, idea, serve, cli):
    api = serve(AutoResearcher())
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--max-turns", "1")
    assert_one_line_stop(result, "planning", "limit of 1 turns", "--max-turns 2", ws=ws)
    assert len(api.requests) == 1
    assert phase_table((ws / "STATE.md").read_text())["planning"] == "FAILED"


def test_a_budget_on_a_model_with_no_price_refuses_to_start_and_says_how_to_price_it(tmp_path, idea, serve, cli, monkeypatch):
    from labrun.flows.session import research_session

    api = serve(AutoResearcher())
    ws = tmp_path / "ws"
    # The agent's budget ($5) needs a price, and a Bedrock-style name has none.
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--model", "anthropic.claude-x-v1:0",
                 "--budget-usd", "5")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("labrun:")]
    assert "no price is known for model 'anthropic.claude-x-v1:0'" in line and "LABRUN_PRICES" in line
    assert not api.requests and not ws.exists()  # nothing asked, nothing written

    # A deployment run (no command line) refuses too, before any model call.
    state = research_session(str(idea), str(ws), "anthropic", "anthropic.claude-x-v1:0", budget_usd=5.0,
                             return_state=True)
    assert state.is_failed() and "LABRUN_PRICES" in state.message and not api.requests

    prices = tmp_path / "prices.yaml"
    prices.write_text("anthropic.claude-x-v1:0: {input: 4, output: 20, cache_write: 5, cache_read: 0.2}\n")
    monkeypatch.setenv("LABRUN_PRICES", str(prices))
    result = cli("resume", str(ws), "--max-turns", "1")
    assert_one_line_stop(result, "limit of 1 turns", ws=ws)  # it ran, and its spending counts
    assert session_status(ws)["usage"]["cost_usd"] > 0


# -- stop reasons ---------------------------------------------------------------------------

PAUSED = {"content": [{"type": "text", "text": "Reading about the question first."}], "stop_reason": "pause_turn"}
PLAN = {"content": [{"type": "tool_use", "id": "toolu_plan", "name": "str_replace_based_edit_tool",
                     "input": {"command": "create", "path": "planning.md",
                               "file_text": "# Plan\n\n" + PLAN_MD}}]}
CUT_CALL = {"content": [{"type": "text", "text": "Making the folders."},
                        {"type": "tool_use", "id": "toolu_cut", "name": "bash",
                         "partial_json": '{"command": "touch cut-call-ran", "restart": fa'}],
            "stop_reason": "max_tokens"}
FOLDERS = {"content": [{"type": "tool_use", "id": "toolu_dirs", "name": "bash",
                        "input": {"command": "mkdir -p src results && echo '# the standard library only: "
                                             "no packages' > requirements.txt"}}]}
REFUSAL = {"content": [{"type": "text", "text": "I will not"}], "stop_reason": "refusal",
           "stop_details": {"type": "refusal", "category": "cyber",
                            "explanation": "This request was declined because it could enable cyber harm."}}


def request_of(api: FakeMessagesAPI, phase: str, turn: int) -> dict:
    return next(r["body"] for r in api.requests if turn_of(r) == (phase, turn))


def test_a_paused_turn_goes_on_and_a_call_cut_by_max_tokens_is_not_run(tmp_path, idea, serve, cli):
    api = serve(AutoResearcher({("planning", 1): [PAUSED], ("planning", 2): [PLAN],
                                ("setup", 1): [CUT_CALL], ("setup", 2): [FOLDERS]}))
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic")
    assert result.returncode == 0, result.stderr

    # pause_turn: the paused reply is sent back as it is (it ends the request), no nudge.
    resumed = request_of(api, "planning", 2)["messages"]
    assert resumed[-1]["role"] == "assistant"
    assert strip_cache_control(resumed[-1]["content"]) == PAUSED["content"]

    # max_tokens: the cut call was not run; the model read why, and what to do.
    assert not (ws / "cut-call-ran").exists()
    (cut,) = replies(ws, "setup")[:1]
    assert cut.stop_reason == "max_tokens" and cut.content[1]["input"] == {"command": "touch cut-call-ran"}
    answer = request_of(api, "setup", 2)["messages"][-1]["content"]
    (told,) = [b for b in answer if b.get("type") == "tool_result"]
    assert told["tool_use_id"] == "toolu_cut" and told["is_error"] and "Not run" in told["content"]
    assert not [b for b in answer if b.get("type") == "text"]  # no nudge besides

    report = status(ws)
    assert report["session"]["complete"]
    assert len(api.requests) == len(api.billed) == sum(TURNS.values()) + 2
    assert_usage_is_what_was_billed(ws, api, report)


def test_a_refusal_stops_the_phase_at_once_and_a_resume_sets_the_refused_reply_aside(tmp_path, idea, serve, cli):
    api = serve(AutoResearcher({("experiments", 1): [REFUSAL]}))
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic")
    assert_one_line_stop(result, "refused to go on with phase experiments", "cyber", "--model", ws=ws)
    assert [turn_of(r)[0] for r in api.requests].count("experiments") == 1  # not nudged, not paid again
    assert phase_table((ws / "STATE.md").read_text())["experiments"] == "FAILED"

    asked = len(api.requests)
    result = cli("resume", str(ws))
    assert result.returncode == 0, result.stderr
    first = json.dumps(api.requests[asked]["body"]["messages"])
    assert "I will not" not in first  # the refused turn is not sent again
    report = status(ws)
    assert report["session"]["complete"]
    assert_usage_is_what_was_billed(ws, api, report)  # the refused reply was billed, and counts


# -- the model is not the phase -------------------------------------------------------------


def test_resume_with_another_model_and_settings_keeps_finished_phases_and_says_so(tmp_path, idea, serve, cli, monkeypatch):
    api = serve(AutoResearcher())
    ws = tmp_path / "ws"
    result = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--max-turns", "2")
    assert_one_line_stop(result, "implementation", "limit of 2 turns", ws=ws)  # planning and setup done
    asked = len(api.requests)
    assert {r["body"]["model"] for r in api.requests} == {"claude-opus-5-5"}

    monkeypatch.setenv("LABRUN_CONTEXT_MANAGEMENT", "off")  # another agent setting too
    result = cli("resume", str(ws), "--model", "claude-sonnet-5", "--max-turns", "10")
    assert result.returncode == 0, result.stderr
    later = api.requests[asked:]
    assert {turn_of(r)[0] for r in later} == {"implementation", "experiments", "analysis", "documentation"}
    assert {r["body"]["model"] for r in later} == {"claude-sonnet-5"}
    assert not any("context_management" in r["body"] for r in later)
    report = status(ws)
    assert {p["key"]: p["runs"] for p in report["phases"]}["planning"] == 1
    assert {p["key"]: p["runs"] for p in report["phases"]}["setup"] == 1
    assert report["session"]["model"] == "claude-sonnet-5"
    assert "model default → claude-sonnet-5 for the phases still to run" in (ws / "STATE.md").read_text()
    assert_usage_is_what_was_billed(ws, api, report)


def test_a_rerun_from_analysis_with_another_model_asks_nothing_of_the_earlier_phases(
        full_session, serve, cli, tmp_path):
    """`labrun rerun --from analysis --model M`: the requests are analysis's and
    documentation's only, all for M; each branch's usage is what its API billed."""
    import shutil

    first_result, first_api, finished = full_session
    assert first_result.returncode == 0
    ws = tmp_path / "ws"
    shutil.copytree(finished, ws, symlinks=True)
    api = serve(AutoResearcher())
    result = cli("rerun", str(ws), "--from", "analysis", "--model", "claude-opus-4-7",
                 "--note", "a stronger model")
    assert result.returncode == 0, result.stderr
    assert answered(api) == [(p, t) for p in ("analysis", "documentation") for t in range(1, TURNS[p] + 1)]
    assert len(api.requests) == len(api.billed)
    assert {r["body"]["model"] for r in api.requests} == {"claude-opus-4-7"}
    assert {r["body"]["model"] for r in first_api.requests} == {"claude-opus-5-5"}

    report = status(ws)
    assert report["session"]["model"] == "claude-opus-4-7" and report["session"]["branch"] == 2
    one, two = report["branches"]
    assert (one["model"], two["model"], two["from_phase"], two["note"]) == (
        None, "claude-opus-4-7", "analysis", "a stronger model")
    for branch, billed_by in ((one, first_api), (two, api)):
        billed = billed_total(billed_by)
        for field in USAGE_FIELDS:
            assert branch["usage"][field] == getattr(billed, field), field
        assert branch["usage"]["cost_usd"] == pytest.approx(billed.cost_usd, abs=1e-9)
    assert report["usage"]["cost_usd"] == pytest.approx(one["usage"]["cost_usd"] + two["usage"]["cost_usd"])

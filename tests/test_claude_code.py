"""The Claude Code backend end to end: `labrun` processes with `--agent claude-code`, and a
stand-in `claude` on PATH (`tests/fake_claude/claude`, not Claude Code: no model runs).

The stand-in prints Claude Code's stream-json, reaches labrun's `run_experiment` and
`complete_phase` over MCP with the MCP client library, edits files itself, and keeps its
sessions per directory. Faults (die, hang, print forever, a spent usage window, stop short)
are read from a file and fire once. Each invocation is logged (argv, stdin, time), so the
tests can check what labrun asked of it.
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
from support import assert_complete, processes_with_env, status, wait_for  # noqa: E402

from labrun.agents import claude_code  # noqa: E402
from labrun.agents.claude_code import SCRUB  # noqa: E402
from labrun.journal import CliSessionRecord, Conversation  # noqa: E402
from labrun.prices import cost_usd  # noqa: E402
from labrun.usage import Usage  # noqa: E402
from labrun.phase_registry import PHASES  # noqa: E402

from auto_responder import IDEA  # noqa: E402  (the same small idea as the Anthropic tests)

FAKE = Path(__file__).parent / "fake_claude"
ONLY_FAKE = os.pathsep.join([str(FAKE), str(Path(sys.executable).parent), "/usr/bin", "/bin"])  # the stand-in first
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
RESUME_NOTE = "has now\nbeen resumed"
NUDGE = "You ended your turn without calling a tool"
KICKOFF = "Start phase 1 of 6 (planning)"


class Claude:
    """The stand-in's files for one test: its session store, invocation log and faults; and
    `labrun` run with them (in this process: `cli`)."""

    def __init__(self, root: Path, in_process):
        self.root = root
        self.in_process = in_process
        self.home = root / "claude-home"
        self.log = root / "claude-invocations.jsonl"
        self.faults = root / "claude-faults.json"
        self.env = {
            "PATH": os.pathsep.join([str(FAKE), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "FAKE_CLAUDE_HOME": str(self.home),
            "FAKE_CLAUDE_LOG": str(self.log),
            "FAKE_CLAUDE_FAULTS": str(self.faults),
            "LABRUN_PASS_ENV": "FAKE_CLAUDE_HOME,FAKE_CLAUDE_LOG,FAKE_CLAUDE_FAULTS,FAKE_CLAUDE_LOGGED_OUT",  # claude gets a scrubbed environment
            "LABRUN_CLAUDE": "claude",
            "LABRUN_CLI_WRITABLE": str(root),  # the stand-in's files, in the namespace labrun runs it in
            "LABRUN_CLAUDE_PERMISSIONS": "default",
            "LABRUN_PHASE_TIMEOUT_S": "",
            "LABRUN_MIN_WINDOW_WAIT_S": "",
            "LABRUN_RETRY_BASE_S": "0.1",
        }

    def labrun(self, *args: str, **env: str):
        return self.in_process(*args, env={**self.env, **env})

    def fault(self, *faults: dict) -> None:
        self.faults.write_text(json.dumps(list(faults)))

    def calls(self, phase: str | None = None) -> list[dict]:
        """Invocations, oldest first, each with the phase its system prompt names."""
        found = []
        for line in self.log.read_text().splitlines() if self.log.exists() else []:
            call = json.loads(line)
            argv = call["argv"]
            prompt_file = argv[argv.index("--append-system-prompt-file") + 1]
            call["phase"] = Path(prompt_file).parent.name
            call["resume"] = argv[argv.index("--resume") + 1] if "--resume" in argv else None
            if phase in (None, call["phase"]):
                found.append(call)
        return found


@pytest.fixture
def claude(tmp_path, prefect_api, cli) -> Claude:
    return Claude(tmp_path, cli)


@pytest.fixture
def idea(tmp_path) -> Path:
    path = tmp_path / "idea.yaml"
    path.write_text(IDEA)
    return path


def run(idea: Path, ws: Path, claude: Claude, *args: str, **env: str):
    return claude.labrun("run", str(idea), "--workspace", str(ws), "--agent", "claude-code", *args, **env)


def transcripts(ws: Path, phase: str) -> list[list[dict]]:
    return [[json.loads(line) for line in f.read_text().splitlines()]
            for f in sorted((ws / ".labrun" / "phases" / phase).glob("claude-run-*.jsonl"))]


def sessions_recorded(ws: Path, phase: str) -> list[str | None]:
    found = []
    for f in Conversation.files(ws / ".labrun" / "phases" / phase):
        found += [r.session_id for r in Conversation(f, repair=False).of(CliSessionRecord)]
    return found


def assert_usage_is_what_claude_billed(ws: Path) -> None:
    """`labrun status` totals equal what the stand-in billed, phase by phase: every assistant
    message it streamed (one id, one bill), killed runs included, tokens exactly and dollars
    at its prices (claude-sonnet-4-5's); what killed runs streamed is marked estimated."""
    report = status(ws)
    total = {k: 0 for k in USAGE_FIELDS} | {"cost_usd": 0.0, "estimated_usd": 0.0}
    for p in report["phases"]:
        billed = {k: 0 for k in USAGE_FIELDS} | {"cost_usd": 0.0, "estimated_usd": 0.0}
        for events in transcripts(ws, p["key"]):
            finished = any(e.get("type") == "result" for e in events)
            seen = set()
            for e in events:
                message = e.get("message") or {}
                if e.get("type") != "assistant" or message.get("model") == "<synthetic>" or message["id"] in seen:
                    continue
                seen.add(message["id"])
                usage = Usage(**{k: message["usage"].get(k, 0) for k in USAGE_FIELDS})
                for k in USAGE_FIELDS:
                    billed[k] += getattr(usage, k)
                billed["cost_usd"] += cost_usd("claude-sonnet-4-5", usage)
                billed["estimated_usd"] += 0 if finished else cost_usd("claude-sonnet-4-5", usage)
        for k in USAGE_FIELDS:
            assert p["usage"][k] == billed[k], (p["key"], k)
        for k in ("cost_usd", "estimated_usd"):
            assert p["usage"][k] == pytest.approx(billed[k], rel=1e-9, abs=1e-12), (p["key"], k)
            total[k] += billed[k]
        for k in USAGE_FIELDS:
            total[k] += billed[k]
    for k in USAGE_FIELDS:
        assert report["usage"][k] == total[k], k
    assert report["usage"]["cost_usd"] == pytest.approx(total["cost_usd"], rel=1e-9)
    assert total["cost_usd"] > 0


def newest_attempt_and_its_parents():
    """The newest "attempt 1" task run and the names of the task runs above it, nearest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        attempt = client.read_task_runs(
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=["attempt 1"])),
            sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=1)[0]
        parents, run = [], attempt
        while run.task_inputs.get("__parents__"):
            run = client.read_task_run(run.task_inputs["__parents__"][0].id)
            parents.append(run)
        return attempt, parents


# -- a whole session -------------------------------------------------------------------------


def test_a_session_with_claude_code(idea, tmp_path, claude):
    """Six phases through `claude -p`; claude dies once mid-phase and stops short once; it
    gives up on an overloaded API three times in a row and on an API key's rate limit once,
    which labrun waits out with back-off, not as failures."""
    ws = tmp_path / "ws"
    overloaded = {"phase": "setup", "at_step": 0, "do": "overloaded"}
    claude.fault({"phase": "experiments", "at_step": 1, "do": "die"},
                 {"phase": "analysis", "at_step": 0, "do": "stop"},
                 {"phase": "implementation", "at_step": 1, "do": "warning"},
                 {"phase": "planning", "at_step": 1, "do": "retry", "times": 2},
                 overloaded, overloaded, overloaded,
                 {"phase": "documentation", "at_step": 0, "do": "ratelimited"})
    key = "service-access-0a1b2c3d4e5f6a7b"  # a key for the experiments: never claude's
    result = run(idea, ws, claude, "--pass-env", "SERVICE_ACCESS", SERVICE_ACCESS=key)
    assert_complete(ws, result)
    assert "usage window (five_hour) nearly spent" in result.stderr
    said = " ".join(result.stderr.split())  # the terminal's lines are wrapped
    assert "API error 529 (overloaded): claude retries in 1.0 s, attempt 2 of 10" in said
    assert said.count("the API is busy or limiting (529) after 3 retries of its own") == 3
    assert "the API is busy or limiting (429)" in said
    assert said.count("claude run failed") == 1  # only the death: no retried run counts as failed

    # the attempt ran through labrun's tool, as a recorded attempt
    state_md = (ws / "STATE.md").read_text()
    assert "### Attempt 1" in state_md and "- Status: SUCCESS" in state_md
    assert [(a["n"], a["status"]) for a in status(ws)["attempts"]] == [(1, "SUCCESS")]
    assert (ws / "REPORT.md").exists() and (ws / "README.md").exists()
    attempt, parents = newest_attempt_and_its_parents()  # a Prefect subtask of a claude run, in the phase
    assert [p.name for p in parents] == ["experiments run 1", "4-experiments"]
    assert parents[-1].flow_run_id == attempt.flow_run_id

    calls = claude.calls()
    assert [c["phase"] for c in calls] == ["planning"] + ["setup"] * 4 + [
        "implementation", "experiments", "experiments", "analysis", "analysis", "documentation", "documentation"]
    for c in calls:
        argv = c["argv"]
        assert argv[:5] == ["-p", "--output-format", "stream-json", "--verbose", "--append-system-prompt-file"]
        granted = argv[argv.index("--allowedTools") + 1].split(",")
        assert "mcp__labrun" in granted
        assert ({"WebSearch", "WebFetch"} <= set(granted)) == (c["phase"] == "planning"), c["phase"]  # a web phase
        assert "--dangerously-skip-permissions" not in argv
        assert Path(argv[argv.index("--mcp-config") + 1]).parent.name == c["phase"]
        assert c["cwd"] == str(ws)
        assert "SERVICE_ACCESS" not in c["env"] and "FAKE_CLAUDE_LOG" in c["env"]  # LABRUN_PASS_ENV's do reach it
    assert "your own shell tool runs without it" in (ws / ".labrun/phases/planning/claude-system-prompt.md").read_text()
    assert not [p for p in ws.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    first_of = {c["phase"]: c for c in reversed(calls)}
    assert all(first_of[p.key]["resume"] is None and first_of[p.key]["stdin"].startswith(f"Start phase {n}")
               for n, p in enumerate(PHASES, 1))

    # claude died mid-phase: the same session is resumed, told it was interrupted
    died, resumed = claude.calls("experiments")
    session = sessions_recorded(ws, "experiments")[0]
    assert resumed["resume"] == session and RESUME_NOTE in resumed["stdin"]
    runs = transcripts(ws, "experiments")
    assert not any(e.get("type") == "result" for e in runs[0])
    assert "estimated usage" in runs[0][-1]["note"]
    # it stopped short of complete_phase: nudged on, in the same session
    stopped, nudged = claude.calls("analysis")
    assert nudged["resume"] == sessions_recorded(ws, "analysis")[0] and NUDGE in nudged["stdin"]

    assert_usage_is_what_claude_billed(ws)


# -- reviewing -------------------------------------------------------------------------------


def test_a_revision_goes_to_the_same_claude_session_and_an_approval_on(idea, tmp_path, claude):
    """`--review-after planning` through `claude -p`: the revision is the next prompt of the
    planning session (`--resume`), the phase completes again and waits again; the approval's
    comment is in every later phase's system prompt."""
    ws = tmp_path / "ws"
    revision, comment = "Add a second noise level, sigma 2.0.", "Report the slope with an interval."
    first = run(idea, ws, claude, "--review-after", "planning")
    assert first.returncode == 3, first.stdout + first.stderr
    assert [c["phase"] for c in claude.calls()] == ["planning"]

    again = claude.labrun("review", str(ws), "--revise", revision)
    assert again.returncode == 3, again.stdout + again.stderr
    kickoff, revised = claude.calls("planning")
    assert revised["resume"] == sessions_recorded(ws, "planning")[0] and revision in revised["stdin"]
    assert KICKOFF not in revised["stdin"] and RESUME_NOTE not in revised["stdin"]
    assert status(ws)["session"]["awaiting_review"]["round"] == 2

    done = claude.labrun("review", str(ws), "--approve", "--comment", comment)
    assert_complete(ws, done)
    assert [c["phase"] for c in claude.calls()].count("planning") == 2  # not asked again
    for phase in ("setup", "implementation", "experiments", "analysis", "documentation"):
        assert comment in (ws / f".labrun/phases/{phase}/claude-system-prompt.md").read_text(), phase


# -- resuming --------------------------------------------------------------------------------


@pytest.mark.parametrize("session_known", [True, False], ids=["same-session", "unknown-session"])
def test_a_killed_engine_resumes_the_claude_session(idea, tmp_path, claude, session_known, forker):
    """kill -9 of labrun mid-phase, then `labrun resume`: `claude --resume <the stored id>`;
    when Claude Code no longer has that session, a new one starts from the system prompt."""
    ws = tmp_path / "ws"
    claude.fault({"phase": "planning", "at_step": 1, "do": "hang"})
    proc = forker.start(["run", str(idea), "--workspace", str(ws), "--agent", "claude-code"],
                        env={**os.environ, **claude.env}, whole_env=True)
    try:
        wait_for(lambda: (ws / "planning.md").exists() and sessions_recorded(ws, "planning"),
                 what="planning to start in claude")
        time.sleep(0.5)  # the hang begins after the first step's result
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    # claude died with the engine: nothing of it is left
    wait_for(lambda: not processes_with_env(f"FAKE_CLAUDE_HOME={claude.home}"), timeout=5,
             what="claude to die with the engine")
    if not session_known:
        for f in claude.home.rglob("*.json"):
            f.unlink()

    result = claude.labrun("resume", str(ws))
    assert_complete(ws, result)
    session = sessions_recorded(ws, "planning")[0]
    calls = claude.calls("planning")
    assert calls[1]["resume"] == session and RESUME_NOTE in calls[1]["stdin"]
    if session_known:
        assert len(calls) == 2
    else:  # "No conversation found with session ID": a new session, from the kickoff
        assert len(calls) == 3
        assert calls[2]["resume"] is None
        assert calls[2]["stdin"].startswith(KICKOFF) and RESUME_NOTE in calls[2]["stdin"]
        forgotten, new = sessions_recorded(ws, "planning")[1:]
        assert forgotten is None and new not in (None, session)
        assert "No conversation found" in json.dumps(transcripts(ws, "planning")[1])
    first = transcripts(ws, "planning")[0]
    assert not any(e.get("type") == "result" for e in first)
    assert "estimated usage" in first[-1]["note"]  # written by the next run
    assert_usage_is_what_claude_billed(ws)
    assert status(ws)["phases"][0]["usage"]["estimated_usd"] > 0  # what the killed run streamed


# -- usage windows ---------------------------------------------------------------------------


def test_a_spent_usage_window_is_waited_out_not_retried(idea, tmp_path, claude):
    ws = tmp_path / "ws"
    claude.fault({"phase": "setup", "at_step": 0, "do": "window", "resets_in": 2})
    result = run(idea, ws, claude, LABRUN_MIN_WINDOW_WAIT_S="0")
    assert_complete(ws, result)
    spent, resumed = claude.calls("setup")  # exactly one run after the window: no retry loop
    assert len(claude.calls()) == 7
    rejected = [e for e in transcripts(ws, "setup")[0] if e.get("type") == "rate_limit_event"
                and e["rate_limit_info"]["status"] == "rejected"]
    resets_at = rejected[0]["rate_limit_info"]["resetsAt"]
    assert resumed["time"] >= resets_at - 0.05  # it waited for the reset
    assert resumed["resume"] == sessions_recorded(ws, "setup")[0] and RESUME_NOTE in resumed["stdin"]
    assert "usage window spent" in (ws / "STATE.md").read_text()
    assert_usage_is_what_claude_billed(ws)


def plan_for(tmp_path: Path):
    from labrun.agents.cli_agent import RunPlan

    return RunPlan(tmp_path / "system.md", None, None, 7, timeout_s=60)


def test_permissions_are_rules_unless_skipping_is_asked_for(monkeypatch, tmp_path):
    from labrun.agents.backends import make_agent
    from labrun.agents.cli_agent import RunPlan

    monkeypatch.setenv("PATH", ONLY_FAKE)
    monkeypatch.delenv("LABRUN_CLAUDE", raising=False)
    monkeypatch.delenv("IS_SANDBOX", raising=False)
    monkeypatch.setenv("LABRUN_CLAUDE_PERMISSIONS", "default")
    agent = make_agent("claude-code", "claude-sonnet-4-5")
    plan = RunPlan(tmp_path / "system.md", tmp_path / "mcp.json", "abc", 7)
    argv = agent.argv(plan)
    assert argv[0] == str(FAKE / "claude") and argv[argv.index("--max-turns") + 1] == "7"
    assert argv[argv.index("--resume") + 1] == "abc" and argv[argv.index("--model") + 1] == "claude-sonnet-4-5"
    assert argv[argv.index("--system-prompt-snapshot") + 1] == "off"  # the prompt given on resume counts
    granted = argv[argv.index("--allowedTools") + 1].split(",")
    assert {"mcp__labrun", "Bash", "Edit", "Write", "Read"} <= set(granted)
    assert not {"MultiEdit", "LS", "TodoWrite"} & set(granted)
    assert not {"WebSearch", "WebFetch"} & set(granted)  # not a web phase
    web = RunPlan(tmp_path / "system.md", tmp_path / "mcp.json", "abc", 7, web=True)
    assert {"WebSearch", "WebFetch"} <= set(agent.argv(web)[argv.index("--allowedTools") + 1].split(","))
    agent.known_tools = ["Bash", "Edit", "Read", "Write", "WebFetch"]  # what a system/init event listed
    assert agent.argv(plan)[argv.index("--allowedTools") + 1] == "mcp__labrun,Bash,Read,Edit,Write"
    assert agent.argv(web)[argv.index("--allowedTools") + 1] == "mcp__labrun,Bash,Read,Edit,Write,WebFetch"
    assert "--dangerously-skip-permissions" not in argv and "IS_SANDBOX" not in agent.environment(plan_for(tmp_path))

    monkeypatch.setenv("LABRUN_CLAUDE_PERMISSIONS", "skip")
    agent = make_agent("claude-code")
    argv = agent.argv(RunPlan(tmp_path / "system.md", tmp_path / "mcp.json", None, 7))
    assert "--dangerously-skip-permissions" in argv and "--allowedTools" not in argv and "--resume" not in argv
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as root, Claude Code wants IS_SANDBOX=1 for this
    assert agent.environment(plan_for(tmp_path))["IS_SANDBOX"] == "1"


def test_claude_gets_a_scrubbed_environment_and_a_subscription_stays_one(monkeypatch, tmp_path):
    from labrun.agents.backends import make_agent

    monkeypatch.setenv("PATH", ONLY_FAKE)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-exported-by-the-user")
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-the-subscription")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not-for-claude-0000000000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-claude")
    monkeypatch.setenv("DATASET_API_KEY", "the-idea-needs-it")
    monkeypatch.setenv("LABRUN_PASS_ENV", "DATASET_API_KEY")
    monkeypatch.delenv("LABRUN_CLAUDE_AUTH", raising=False)
    monkeypatch.setattr(claude_code, "can_sandbox", lambda: True)  # bubblewrap and socat are there
    agent = make_agent("claude-code")
    env = agent.environment(plan_for(tmp_path))
    assert env["CLAUDE_CODE_OAUTH_TOKEN"] == "sk-ant-oat01-the-subscription"
    assert "ANTHROPIC_API_KEY" not in env  # it would switch the subscription onto API billing
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9" and env["DATASET_API_KEY"] == "the-idea-needs-it"
    assert "GITHUB_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PATH"] == ONLY_FAKE and env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "1"
    assert env["ENABLE_TOOL_SEARCH"] == "false"
    said = agent.announce()
    assert "login: Claude subscription (CLAUDE_CODE_OAUTH_TOKEN)" in said and "not passed on" in said

    monkeypatch.setenv("LABRUN_CLAUDE_AUTH", "api-key")  # asked for: the key is used
    agent = make_agent("claude-code")
    assert agent.environment(plan_for(tmp_path))["ANTHROPIC_API_KEY"] == "sk-ant-api03-exported-by-the-user"
    assert "login: API key (ANTHROPIC_API_KEY)" in agent.announce()
    monkeypatch.delenv("LABRUN_CLAUDE_AUTH")
    monkeypatch.delenv("CLAUDE_CODE_OAUTH_TOKEN")  # no subscription: the key it is
    agent = make_agent("claude-code")
    assert agent.environment(plan_for(tmp_path))["ANTHROPIC_API_KEY"] == "sk-ant-api03-exported-by-the-user"
    assert "login: API key" in agent.announce()

    monkeypatch.setattr(claude_code, "can_sandbox", lambda: False)  # no bubblewrap or socat: no scrub,
    agent = make_agent("claude-code")  # which would make Claude Code refuse every command
    assert SCRUB not in agent.environment(plan_for(tmp_path))
    assert "install bubblewrap and socat" in agent.announce()


def result_event(**fields) -> dict:
    """A `result` event as Claude Code 2.1.328 ends a run whose API call failed for good."""
    return {"type": "result", "subtype": "success", "is_error": True, "num_turns": 1, "session_id": "s",
            "total_cost_usd": 0, "usage": {}, "terminal_reason": "api_error", **fields}


@pytest.mark.parametrize("event, rejected, kind", [
    (result_event(api_error_status=429, api_error_type="rate_limit_error",
                  result="You've hit your 5-hour limit · resets 10:31am (UTC)"), 1796121077, "window"),
    (result_event(api_error_status=429, api_error_type="rate_limit_error",
                  result="You've hit your 5-hour limit · resets 10:31am (UTC)"), None, "window"),
    (result_event(api_error_status=429, api_error_type="rate_limit_error", result="API Error: Request rejected "
                  "(429) · This request would exceed your account's rate limit. Please try again later."),
     None, "transient"),
    (result_event(api_error_status=529, api_error_type="overloaded_error",
                  result="API Error: 529 Overloaded. This is a server-side issue"), None, "transient"),
    (result_event(api_error_status=None, result="API Error: Repeated 529 Overloaded errors"), None, "transient"),
    (result_event(api_error_status=None, terminal_reason=None, result="Claude AI usage limit reached|1796121077"),
     None, "window"),
    (result_event(subtype="error_during_execution", api_error_status=None, terminal_reason=None,
                  errors=["No conversation found with session ID: abc"]), None, "lost_session"),
    (result_event(api_error_status=401, result="Invalid API key · Please run /login"), None, "logged_out"),
    (result_event(subtype="error_max_turns", api_error_status=None, terminal_reason="max_turns"), None, "ok"),
    (result_event(is_error=False, api_error_status=None, terminal_reason="completed"), None, "ok"),
    (result_event(api_error_status=400, api_error_type="invalid_request_error", result="API Error: 400 bad"),
     None, "failed"),
], ids=["window-event", "window-text", "api-key-429", "529", "overload-text", "old-window-text", "lost-session",
        "logged-out", "max-turns", "ok", "400"])
def test_how_a_run_ended_reads_the_fields_first(monkeypatch, event, rejected, kind):
    from labrun.agents.backends import make_agent
    from labrun.agents.cli_agent import Outcome, Window

    monkeypatch.setenv("PATH", ONLY_FAKE)
    agent = make_agent("claude-code")
    [finished] = agent.read(event)
    out = Outcome(finished=finished, rejected=Window("rejected", rejected, "five_hour") if rejected else None)
    verdict = agent.judge(out)
    assert verdict.kind == kind, verdict
    if kind == "window":
        assert verdict.resets_at is not None
        if rejected:
            assert verdict.resets_at == rejected


def test_a_reset_time_is_read_from_the_text():
    from datetime import datetime, timezone

    from labrun.agents.claude_code import reset_from_text

    now = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc).timestamp()
    at = reset_from_text("You've hit your 5-hour limit · resets 10:31am (UTC)", now)
    assert datetime.fromtimestamp(at, timezone.utc) == datetime(2026, 12, 1, 10, 31, tzinfo=timezone.utc)
    at = reset_from_text("You've hit your 5-hour limit · resets 6am (UTC)", now)  # tomorrow's
    assert datetime.fromtimestamp(at, timezone.utc) == datetime(2026, 12, 2, 6, 0, tzinfo=timezone.utc)
    assert reset_from_text("Claude AI usage limit reached|1796121077") == 1796121077
    assert reset_from_text("no time here") is None


def test_the_wait_for_a_window_is_clamped(monkeypatch):
    from labrun.windows import MAX_WAIT_S, wait_seconds

    monkeypatch.delenv("LABRUN_MIN_WINDOW_WAIT_S", raising=False)
    assert wait_seconds(resets_at=1000.0, now=1000.5) == 60
    assert wait_seconds(resets_at=1000.0 + 90, now=1000.0) == 90
    assert wait_seconds(resets_at=1000.0 + 10 * 3600, now=1000.0) == MAX_WAIT_S == 6 * 3600


# -- timeouts and errors ---------------------------------------------------------------------


def test_the_phase_timeout_stops_a_claude_that_never_stops_printing(idea, tmp_path, claude):
    ws = tmp_path / "ws"
    claude.fault({"phase": "planning", "at_step": 0, "do": "chatty"})
    started = time.monotonic()
    result = run(idea, ws, claude, LABRUN_PHASE_TIMEOUT_S="8")
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 60
    assert "timeout of 8 s" in result.stderr and "Traceback" not in result.stderr
    assert not processes_with_env(f"FAKE_CLAUDE_HOME={claude.home}")
    events = transcripts(ws, "planning")[0]
    assert sum(e.get("type") == "assistant" for e in events) > 20
    assert "killed at the phase timeout" in events[-1]["note"]

    result = claude.labrun("resume", str(ws))  # and it is resumable
    assert_complete(ws, result)
    resumed = claude.calls("planning")[1]
    assert resumed["resume"] == sessions_recorded(ws, "planning")[0]


def test_no_claude_on_path_says_how_to_install_it(idea, tmp_path, claude):
    result = run(idea, tmp_path / "ws", claude, LABRUN_CLAUDE="claude-is-not-installed")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "npm install -g @anthropic-ai/claude-code" in lines[0] and "claude /login" in lines[0]


def test_a_claude_that_is_not_logged_in_says_how_to_log_in(idea, tmp_path, claude):
    result = run(idea, tmp_path / "ws", claude, FAKE_CLAUDE_LOGGED_OUT="1")
    assert result.returncode != 0
    problems = [line for line in result.stderr.splitlines() if line.startswith("labrun:")]
    assert len(problems) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "claude /login" in problems[0] and "setup-token" in problems[0]
    assert len(claude.calls()) == 1  # not retried

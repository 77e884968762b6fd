"""The Claude Code backend (`--agent claude-code`): a subscription's five-hour windows, the
same durable tools.

A phase is one or more `claude -p` runs in the workspace. The phase's system prompt goes in
with `--append-system-prompt-file`, on every run, resumes included: appended, it keeps Claude
Code's own instructions for its tools, and a file has no limit on its size as one argument
has. The kickoff, the resume note or a nudge goes on stdin. Claude Code brings its own Bash,
Read, Edit and Write (confined by its permission rules); labrun's `run_experiment` and
`complete_phase` reach it through an MCP server in this process (`labrun.mcp_tools`, named
with `--mcp-config` and `--strict-mcp-config`), so attempts stay Prefect subtasks of the
phase and the engine alone writes STATE.md.

The phase's journal (`Conversation`) keeps, in records the rest of the engine already reads:
a "reply" when a run starts (a crash is then resumed, not restarted) and one with what the
run was billed when its `result` event arrives (`total_cost_usd`, `usage`); a "reply" with
each MCP tool call and a "tool_result" with its answer; a "claude_session" record with the
session id of each run's `system/init` event. Every event of run N goes, redacted, into
`claude-run-NNN.jsonl` beside the journal, a new file per run.

The phase ends when `complete_phase` succeeds. A run that ends short of it is resumed
(`--resume <session>`) with a nudge, up to the phase's turn limit; an interrupted phase
resumes with the resume note; a session that Claude Code no longer has is started afresh
from the system prompt, which holds the STATE.md digest. A spent usage window raises
`UsageWindowSpent`, which the flow waits out (`labrun.windows`).

Settings from the environment: `LABRUN_CLAUDE` (the executable, default `claude`),
`LABRUN_CLAUDE_PERMISSIONS` (`default`: `--allowedTools` rules; `skip`:
`--dangerously-skip-permissions`), `LABRUN_PHASE_TIMEOUT_S` (default: the idea's
`constraints.time_limit`), `LABRUN_CLAUDE_GRACE_S` (how long `claude` may go on after
`complete_phase` succeeded, default 120).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labrun import prompts
from labrun.agents import AgentUnavailable
from labrun.commands import kill_group
from labrun.journal import Conversation
from labrun.mcp_tools import ToolCall, ToolServer, run_call
from labrun.model import FatalModelError, UsageWindowSpent
from labrun.secrets import redact
from labrun.tools import ToolBox, ToolResult
from labrun.turns import PhaseStopped
from labrun.usage import Budget, Usage
from labrun.windows import clock
from labrun.workspace import write_atomic

log = logging.getLogger("labrun")

TOOLS_NOTE = "claude_code.md.j2"
ALLOWED_TOOLS = ("mcp__labrun", "Bash", "Read", "Edit", "MultiEdit", "Write", "Glob", "Grep",
                 "LS", "NotebookEdit", "TodoWrite")
MAX_FAILED_RUNS = 3
NO_CONVERSATION = "no conversation found with session id"
LOGGED_OUT = re.compile(r"/login|invalid api key|not logged in|oauth token|authentication", re.I)
USAGE_LIMIT = re.compile(r"usage limit|hit your limit|limit reached|limit will reset", re.I)
RESET_EPOCH = re.compile(r"\|(\d{9,11})\b")

MISSING = ("Claude Code is not installed (no `{exe}` on PATH): install it with "
           "`npm install -g @anthropic-ai/claude-code`, then log in with `claude /login` "
           "(or `claude setup-token`)")
NOT_LOGGED_IN = ("Claude Code is not logged in ({said}): run `claude /login` (or `claude "
                 "setup-token` where no browser opens), then `labrun resume {root}`")


class ClaudeCodeFailed(FatalModelError):
    """`claude` kept failing; the message gives its last error."""


class PhaseTimeout(PhaseStopped):
    pass


@dataclass
class Outcome:
    """How one `claude` run ended."""

    result: dict[str, Any] | None = None
    rejected: dict[str, Any] | None = None
    """`rate_limit_info` of a `rate_limit_event` with status "rejected"."""
    stopped: str | None = None
    """"timeout" or "completed" when labrun stopped the process."""
    exit_code: int | None = None
    stderr: str = ""


class ClaudeCodeAgent:
    def __init__(self, model: str | None = None, workspace: str | Path | None = None):
        self.model = model
        exe = os.environ.get("LABRUN_CLAUDE", "claude")
        self.executable = shutil.which(exe)
        if self.executable is None:
            raise AgentUnavailable(MISSING.format(exe=exe))
        self.permissions = os.environ.get("LABRUN_CLAUDE_PERMISSIONS", "default")
        if self.permissions not in ("default", "skip"):
            raise AgentUnavailable(
                f"LABRUN_CLAUDE_PERMISSIONS={self.permissions!r}: use `default` (allowed-tool "
                "rules) or `skip` (--dangerously-skip-permissions)")
        note, _, _ = prompts.env.loader.get_source(prompts.env, TOOLS_NOTE)
        self.settings = {"model": model, "tools_note": hashlib.sha256(note.encode()).hexdigest()[:12]}

    # -- the phase -------------------------------------------------------------------------

    def run_phase(self, toolbox: ToolBox, convo: Conversation, system: str, max_turns: int,
                  budget: Budget) -> None:
        phase, root = toolbox.phase.key, toolbox.root
        phase_dir = convo.path.parent
        system_file = phase_dir / "claude-system-prompt.md"
        write_atomic(system_file, system.rstrip() + "\n\n" + prompts.env.get_template(TOOLS_NOTE).render() + "\n")
        timeout = float(os.environ.get("LABRUN_PHASE_TIMEOUT_S") or toolbox.session.time_limit_s)
        deadline = time.monotonic() + timeout
        close_orphaned_transcript(phase_dir)
        inbox: queue.Queue = queue.Queue()
        order = list(toolbox.session.state.phases)
        failures = 0
        with ToolServer(inbox) as server:
            mcp_config = phase_dir / "claude-mcp.json"
            write_atomic(mcp_config, json.dumps(server.mcp_config(), indent=2))
            mcp_config.chmod(0o600)
            while toolbox.completed is None:
                turns = claude_turns(convo)
                if turns >= max_turns:
                    raise PhaseStopped(
                        f"phase {phase} reached its limit of {max_turns} turns; raise it with "
                        f"`labrun resume {root} --max-turns {max_turns * 2}`")
                budget.check()
                if not pending_texts(convo):
                    convo.add_user_text(prompts.nudge(phase, "; ".join(toolbox.missing()), order))
                session_id = current_session(convo)
                texts = list(dict.fromkeys(pending_texts(convo)))  # a restarted phase repeats its kickoff
                if session_id is None:  # a new session starts from the kickoff
                    kickoff = prompts.kickoff(phase, order)
                    texts = [kickoff] + [t for t in texts if t != kickoff]
                argv = self.argv(system_file, mcp_config, session_id, max_turns - turns)
                out = self.run_once(toolbox, convo, inbox, argv, "\n\n".join(texts), session_id, deadline)
                if out.result is not None:
                    budget.spend(record_result(convo, out.result))
                if toolbox.completed is not None:
                    break
                if out.stopped == "timeout":
                    raise PhaseTimeout(f"it ran past its timeout of {timeout:g} s and claude was stopped; "
                                       "a resume continues the same Claude Code session")
                spent = window_spent(out)
                if spent is not None:
                    raise spent
                said = result_text(out)
                if out.result is not None and NO_CONVERSATION in said.lower():
                    log.warning("%s: Claude Code has no session %s here; starting a new one", phase, session_id)
                    convo.append({"kind": "claude_session", "session_id": None, "note": said[:300]})
                    convo.add_user_text(prompts.resume_note(phase, [], order))
                    continue
                if (out.result is None or out.result.get("is_error")) and LOGGED_OUT.search(said):
                    raise AgentUnavailable(NOT_LOGGED_IN.format(said=said.strip()[:120], root=root))
                if out.result is None and "unknown option" in out.stderr:
                    raise AgentUnavailable(f"this Claude Code is too old for labrun ({out.stderr.strip().splitlines()[-1][:120]}): "
                                           "update it with `claude update`")
                error = run_error(out)
                if error is None:
                    failures = 0
                    continue  # it stopped short of complete_phase: nudge it on
                failures += 1
                log.warning("%s: claude run failed: %s", phase, error)
                if failures >= MAX_FAILED_RUNS:
                    raise ClaudeCodeFailed(f"claude failed {failures} times in a row; the last: {error}")
                convo.add_user_text(prompts.resume_note(phase, [], order))

    def argv(self, system_file: Path, mcp_config: Path, session_id: str | None, turns_left: int) -> list[str]:
        argv = [self.executable, "-p", "--output-format", "stream-json", "--verbose",
                "--append-system-prompt-file", str(system_file),
                "--mcp-config", str(mcp_config), "--strict-mcp-config",
                "--max-turns", str(max(1, turns_left))]
        if self.model:
            argv += ["--model", self.model]
        if session_id:
            argv += ["--resume", session_id]
        if self.permissions == "skip":
            argv.append("--dangerously-skip-permissions")
        else:
            argv += ["--allowedTools", ",".join(ALLOWED_TOOLS)]
        return argv

    def environment(self, timeout: float) -> dict[str, str]:
        env = dict(os.environ)  # Claude Code needs its own login; nothing is scrubbed here
        env.setdefault("MCP_TOOL_TIMEOUT", str(int((timeout + 300) * 1000)))
        if self.permissions == "skip" and hasattr(os, "geteuid") and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # Claude Code refuses to bypass permissions as root otherwise
        return env

    # -- one run ---------------------------------------------------------------------------

    def run_once(self, toolbox: ToolBox, convo: Conversation, inbox: queue.Queue, argv: list[str],
                 prompt: str, session_id: str | None, deadline: float) -> Outcome:
        phase = toolbox.phase.key
        n, transcript = new_transcript(convo.path.parent)
        convo.append({"kind": "reply", "stop_reason": None, "usage": Usage().model_dump(),
                      "content": [{"type": "text", "text": f"[claude run {n}: "
                                   + (f"resuming session {session_id}]" if session_id else "new session]")}],
                      "claude": {"run": n, "event": "start", "resume": session_id, "transcript": transcript.name}})
        write_line(transcript, {"type": "labrun", "event": "start", "run": n, "at": _now(),
                                "argv": argv, "prompt": redact(prompt)})
        log.info("%s · claude run %d · %s", phase, n, f"resuming session {session_id}" if session_id else "new session")
        out = Outcome()
        stderr_path = transcript.with_suffix(".stderr")
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(argv, cwd=toolbox.root, env=self.environment(deadline - time.monotonic()),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                    start_new_session=True)
        threading.Thread(target=_feed, args=(proc, prompt), daemon=True).start()
        threading.Thread(target=_read, args=(proc, transcript, inbox), daemon=True).start()

        def stop(why: str) -> None:
            if out.stopped is None and proc.poll() is None:
                out.stopped = why
                kill_group(proc.pid)

        timers = [threading.Timer(max(0.0, deadline - time.monotonic()), stop, ["timeout"])]
        timers[0].start()
        calls = 0
        try:
            while True:
                try:
                    kind, item = inbox.get(timeout=1.0)
                except queue.Empty:
                    if proc.poll() is not None:  # exited, yet something holds its stdout open
                        kill_group(proc.pid)
                    continue
                if kind == "eof":
                    break
                if kind == "tool":
                    calls += 1
                    self.serve(toolbox, convo, item, f"claude-{n}-{calls}")
                    if toolbox.completed is not None and len(timers) == 1:
                        grace = float(os.environ.get("LABRUN_CLAUDE_GRACE_S", "120"))
                        timers.append(threading.Timer(grace, stop, ["completed"]))
                        timers[-1].start()
                    continue
                event = item
                kind = event.get("type")
                if kind == "system" and event.get("subtype") == "init":
                    convo.append({"kind": "claude_session", "run": n, "session_id": event.get("session_id")})
                    for server in event.get("mcp_servers") or []:
                        if server.get("name") == "labrun" and server.get("status") != "connected":
                            log.warning("%s: claude could not connect to labrun's MCP server (%s)",
                                        phase, server.get("status"))
                elif kind == "assistant":
                    for block in (event.get("message") or {}).get("content") or []:
                        if block.get("type") == "tool_use" and not block.get("name", "").startswith("mcp__labrun"):
                            log.info("%s · claude run %d · %s", phase, n, block.get("name"))
                elif kind == "rate_limit_event":
                    info = event.get("rate_limit_info") or {}
                    if info.get("status") == "rejected":
                        out.rejected = info
                    elif info.get("status") == "allowed_warning":
                        log.warning("%s: Claude usage window (%s) nearly spent; it resets at %s", phase,
                                    info.get("rateLimitType", "?"),
                                    clock(info["resetsAt"]) if info.get("resetsAt") else "?")
                elif kind == "result":
                    out.result = event
        except BaseException:
            stop("engine")
            raise
        finally:
            for timer in timers:
                timer.cancel()
            try:
                out.exit_code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # its output ended but it does not exit
                stop("engine")
                out.exit_code = proc.wait()
            kill_group(proc.pid)  # nothing it started outlives it
        stderr_text = stderr_path.read_text(errors="replace")
        if redact(stderr_text) != stderr_text:
            stderr_path.write_text(redact(stderr_text))
        out.stderr = redact(stderr_text[-2000:])
        if out.result is not None:
            note = "billed as its result event says"
        else:
            why = {"timeout": "killed at the phase timeout", "completed": "stopped after complete_phase",
                   "engine": "stopped by the engine"}.get(out.stopped or "", f"exited with code {out.exit_code}")
            note = f"claude {why} before its result event: this run has no billed figure to record"
        write_line(transcript, {"type": "labrun", "event": "end", "run": n, "at": _now(),
                                "exit_code": out.exit_code, "stopped": out.stopped, "note": note})
        return out

    def serve(self, toolbox: ToolBox, convo: Conversation, call: ToolCall, call_id: str) -> None:
        """One MCP tool call, journaled like a model's: the call before it runs, its result
        after, so that a call cut off by a crash is answered as interrupted on resume."""

        def before(c: ToolCall) -> None:
            convo.append({"kind": "reply", "stop_reason": "tool_use", "usage": Usage().model_dump(),
                          "content": [{"type": "tool_use", "id": call_id, "name": c.name, "input": c.arguments}],
                          "claude": {"event": "tool"}})

        def after(c: ToolCall, result: ToolResult) -> None:
            convo.add_tool_result(call_id, c.name, result.content, result.is_error)
            log.info("%s · %s%s", toolbox.phase.key, c.name, " (error)" if result.is_error else "")

        run_call(toolbox, call, before, after)


# -- the journal ---------------------------------------------------------------------------


def pending_texts(convo: Conversation) -> list[str]:
    """User messages written since the last run started: the next run's prompt."""
    texts: list[str] = []
    for r in convo.records:
        if r["kind"] == "reply" and (r.get("claude") or {}).get("event") == "start":
            texts = []
        elif r["kind"] == "user":
            texts += [b["text"] for b in r["content"] if b.get("type") == "text"]
    return texts


def current_session(convo: Conversation) -> str | None:
    found = None
    for r in convo.records:
        if r["kind"] == "claude_session":
            found = r.get("session_id")
    return found


def claude_turns(convo: Conversation) -> int:
    return sum(int((r.get("claude") or {}).get("num_turns") or 0) for r in convo.records
               if r["kind"] == "reply" and (r.get("claude") or {}).get("event") == "result")


def record_result(convo: Conversation, result: dict[str, Any]) -> Usage:
    """What a run was billed, as a "reply" record (so `labrun status` counts it)."""
    u = result.get("usage") or {}
    usage = Usage(**{k: int(u.get(k) or 0) for k in ("input_tokens", "output_tokens",
                                                     "cache_read_input_tokens", "cache_creation_input_tokens")},
                  cost_usd=float(result.get("total_cost_usd") or 0.0))
    subtype = result.get("subtype")
    turns = int(result.get("num_turns") or 0)
    convo.append({"kind": "reply", "stop_reason": subtype, "usage": usage.model_dump(),
                  "content": [{"type": "text", "text": f"[claude result: {subtype}, {turns} turns, "
                               f"${usage.cost_usd:.4f}]"}],
                  "claude": {"event": "result", "subtype": subtype, "is_error": bool(result.get("is_error")),
                             "num_turns": turns, "session_id": result.get("session_id")}})
    return usage


# -- reading how a run ended ----------------------------------------------------------------


def result_text(out: Outcome) -> str:
    r = out.result or {}
    parts = [str(r.get("result") or "")] + [str(e) for e in r.get("errors") or []]
    if out.result is None:
        parts.append(out.stderr)
    return " ".join(p for p in parts if p)


def window_spent(out: Outcome) -> UsageWindowSpent | None:
    """A spent usage window: a rejected `rate_limit_event`, or a result that reports the
    usage limit (older versions: `Claude AI usage limit reached|<epoch>`)."""
    said = result_text(out)
    failed = out.result is None or (bool(out.result.get("is_error"))
                                    and out.result.get("subtype") != "error_max_turns")
    if not failed or not (out.rejected or USAGE_LIMIT.search(said)):
        return None
    resets_at = (out.rejected or {}).get("resetsAt")
    if resets_at is None and (m := RESET_EPOCH.search(said)):
        resets_at = int(m.group(1))
    resets_at = float(resets_at) if resets_at is not None else time.time()
    kind = (out.rejected or {}).get("rateLimitType", "usage")
    return UsageWindowSpent(f"Claude Code's {kind} limit is reached until {clock(resets_at)}",
                            resets_at=resets_at)


def run_error(out: Outcome) -> str | None:
    """Why a run failed, or None when it ended normally (short of complete_phase or not)."""
    if out.result is not None:
        if not out.result.get("is_error") or out.result.get("subtype") == "error_max_turns":
            return None
        return f"{out.result.get('subtype')}: {result_text(out)[:300] or 'no message'}"
    last = out.stderr.strip().splitlines()[-1:] or ["no output on stderr"]
    return f"claude exited with code {out.exit_code} before its result event ({last[0][:300]})"


# -- transcripts ---------------------------------------------------------------------------


def new_transcript(phase_dir: Path) -> tuple[int, Path]:
    """The next `claude-run-NNN.jsonl`, created here: a transcript is never overwritten."""
    phase_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(phase_dir.glob("claude-run-*.jsonl"))) + 1
    while True:
        path = phase_dir / f"claude-run-{n:03d}.jsonl"
        try:
            with open(path, "x"):
                return n, path
        except FileExistsError:
            n += 1


def close_orphaned_transcript(phase_dir: Path) -> None:
    """A run the engine died in has no end line: say there what is known."""
    runs = sorted(phase_dir.glob("claude-run-*.jsonl"))
    if not runs:
        return
    lines = runs[-1].read_text(errors="replace").splitlines()
    if lines and '"event": "end"' not in lines[-1] and '"event":"end"' not in lines[-1]:
        ended = any('"type":"result"' in x.replace(" ", "") for x in lines)
        write_line(runs[-1], {"type": "labrun", "event": "end", "at": _now(), "note":
                              "the engine stopped during this run" + ("" if ended else
                              "; claude never reported a result: this run has no billed figure to record")})


def write_line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _feed(proc: subprocess.Popen, prompt: str) -> None:
    try:
        proc.stdin.write(prompt.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _read(proc: subprocess.Popen, transcript: Path, inbox: queue.Queue) -> None:
    """Every line of the stream into the transcript (redacted) and, parsed, to the engine."""
    with open(transcript, "a", encoding="utf-8") as f:
        for raw in proc.stdout:
            line = redact(raw.decode(errors="replace").rstrip("\r\n"))
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError
            except ValueError:
                event = {"type": "labrun", "event": "not-json", "text": line[:2000]}
                line = json.dumps(event, ensure_ascii=False)
            f.write(line + "\n")
            f.flush()
            inbox.put(("event", event))
        os.fsync(f.fileno())
    inbox.put(("eof", None))

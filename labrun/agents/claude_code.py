"""The Claude Code backend (`--agent claude-code`): each phase as `claude -p` runs in the
workspace, on labrun's shared CLI base (`labrun.agents.cli_agent`: the phase loop, retries,
process lifetime, the journal, the MCP tool server). This module holds what is Claude's:

- **The command line.** `-p --output-format stream-json --verbose`; the phase's system
  prompt with `--append-system-prompt-file` (appended, it keeps Claude Code's own
  instructions for its tools; a file has no size limit as an argument has), and
  `--system-prompt-snapshot off`: by default Claude Code records a conversation's system
  prompt on its first request and sends that record on every `--resume`, ignoring the file
  given again (seen in 2.1.328's requests to a scripted API), so a resumed phase would not
  see labrun's current prompt and STATE.md digest. The engine's tools with `--mcp-config`
  (labrun's stdio relay, `labrun.mcp_tools`: no URL, no token) and `--strict-mcp-config`; `--max-turns`, `--model`, `--resume <session>`; tools granted
  with `--allowedTools` rules, built from the names the `system/init` event lists
  (`MultiEdit`, `LS`, `TodoWrite` are gone in 2.1.x, and Claude Code ignores unknown names
  silently), `WebSearch` and `WebFetch` in a phase declared `web`, or
  `--dangerously-skip-permissions` when asked.
- **The events.** `system/init` (session id, tools, MCP servers), `assistant` (one event per
  content block, the message's usage so far repeated), `system/api_retry` (its own retries
  of 429, 529 and 5xx), `rate_limit_event` (a subscription's window), `result` (this run's
  `usage`, the session's running `total_cost_usd`, restored on `--resume` without the runs
  that were killed, `num_turns`, `is_error`, `api_error_status`, `terminal_reason`).
- **How a run ended** reads the structured fields first (a rejected `rate_limit_event`,
  `api_error_status`, `api_error_type`, `terminal_reason`, `errors`) and the text only as a
  fallback (`You've hit your 5-hour limit · resets 6:19am (UTC)`; older versions:
  `Claude AI usage limit reached|<epoch>`). A spent window waits for its reset. An API-key
  429 that Claude Code gave up on is transient: it passes on no reset time (it does not
  retry at all when `retry-after` is long), so labrun's back-off waits it out.
- **The environment.** `claude` gets what it needs to run and log in (paths, locale,
  proxies, certificates, `ANTHROPIC_*`, `CLAUDE_*`, its switches) and `LABRUN_PASS_ENV`,
  nothing else. `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1` keeps its credentials out of the
  commands its Bash runs; Claude Code then runs them in its sandbox, which needs bubblewrap
  and socat (without them it refuses every command, so labrun sets it only when both are
  there; `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=0` turns it off). Its sandbox leaves the commands
  the network namespace `claude` runs in, so with it on labrun runs `claude` in a network
  namespace of its own, as Codex (`in_network_namespace`): its Bash reaches the internet
  through the session's egress proxy, `claude` its API as an endpoint the engine names,
  and none of them the machine's loopback. A subscription login (`CLAUDE_CODE_OAUTH_TOKEN` or `claude
  /login`) is used when there is one: an exported `ANTHROPIC_API_KEY` would take precedence
  in Claude Code and bill the key, so it is not passed on unless `LABRUN_CLAUDE_AUTH=api-key`.
- **Its transcripts.** `tool_runs` reads the `WebFetch` and `Bash` calls of a phase's
  `claude-run-NNN.jsonl` for the rules that ask what the phase fetched (`labrun.toollog`).
- **The tools.** `ENABLE_TOOL_SEARCH=false` (unless set): Claude Code otherwise lists MCP
  tools by name only, and the model spends a turn per run on `ToolSearch` before it can
  call `complete_phase`. `bench/claude_tools.py` measured a six-phase session at 20 requests
  and $1.03 with the tools offered at once, against 26 requests and $1.38 with them
  deferred (loading them changes the tool list, so the prompt cache is written again). The
  tools note says how to load them should they be deferred anyway.

Why not `claude-agent-sdk` (evaluated at 0.2.184): it starts the CLI with the caller's whole
environment merged under its options (nothing can be removed, so no scrubbing and no
keeping `ANTHROPIC_API_KEY` from a subscription user), with no parent-death signal or PID
namespace (its cleanup is an `atexit` SIGTERM, which a `kill -9` never runs); its API is
async while phases are synchronous Prefect tasks, and its in-process MCP tools run on its
event loop, so calls would still be handed to the phase's thread as here; it keeps parsed
messages, not the raw lines a transcript needs; and its wheel carries a 160 MB CLI of its
own. Adopting it would add code around it, not remove the driver.

Settings from the environment: `LABRUN_CLAUDE` (the executable, default `claude`),
`LABRUN_CLAUDE_PERMISSIONS` (`default`: `--allowedTools` rules; `skip`:
`--dangerously-skip-permissions`), `LABRUN_CLAUDE_AUTH` (`auto`, `subscription` or
`api-key`), `LABRUN_PHASE_TIMEOUT_S` (6 hours unless set),
`LABRUN_CLI_GRACE_S` (how long `claude` may go on after `complete_phase` succeeded,
default 120), `LABRUN_CLI_PIDNS=off` (no PID namespace).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator
from zoneinfo import ZoneInfo

from labrun.agents.registry import AgentUnavailable, web_tools
from labrun.agents.cli_agent import (CliAgent, Finished, Outcome, Retrying, RunPlan, Started, Streamed,
                                     ToolUsed, Verdict, Window, installed, transcripts)
from labrun.agents.cli_process import passed_env
from labrun.settings import settings
from labrun.toollog import ToolRun, records
from labrun.usage import Usage, count
from labrun.windows import clock

TOOLS_NOTE = "claude_code.md.j2"
DEFAULT_API = "https://api.anthropic.com"
"""Where Claude Code sends its requests, unless ANTHROPIC_BASE_URL names another."""
WANTED_TOOLS = ("Bash", "Read", "Edit", "Write", "Glob", "Grep", "NotebookEdit")
NO_CONVERSATION = "no conversation found with session id"
LOGGED_OUT = re.compile(r"/login|invalid api key|not logged in|oauth token|authentication", re.I)
USAGE_LIMIT = re.compile(r"usage limit|hit your (\S+ )?limit|limit reached|limit will reset", re.I)
RESET_EPOCH = re.compile(r"\|(\d{9,11})\b")
RESET_CLOCK = re.compile(r"resets (?:at )?(\d{1,2})(?::(\d{2}))?\s*([ap]m)?(?:\s*\(([^)]+)\))?", re.I)
OVERLOADED = re.compile(r"overloaded|\b529\b|\b5\d\d\b.*server", re.I)
TRANSIENT_TYPES = {"overloaded_error", "rate_limit_error", "api_error", "timeout_error"}
SCRUB = "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"
ON = ("1", "true", "yes", "on")
SUBSCRIPTION_KEY = "ANTHROPIC_API_KEY"  # takes precedence over a subscription in Claude Code
# Set by a Claude Code that runs labrun itself: they would mark our claude as its child.
PARENT_MARKS = ("CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SESSION_ID", "CLAUDE_CODE_CHILD_SESSION",
                "CLAUDE_CODE_CHILD_NOTES_DIR", "CLAUDE_CODE_MESSAGING_SOCKET", "CLAUDE_CODE_MESSAGING_TOKEN",
                "CLAUDE_CODE_EXECPATH", "CLAUDE_CODE_SESSION_ATTENDED", "CLAUDE_PID")

MISSING = ("Claude Code is not installed (no `{exe}` on PATH): install it with "
           "`npm install -g @anthropic-ai/claude-code`, then log in with `claude /login` "
           "(or `claude setup-token`)")
NOT_LOGGED_IN = ("Claude Code is not logged in ({said}): run `claude /login` (or `claude "
                 "setup-token` where no browser opens), then `labrun resume {root}`")


class ClaudeCodeAgent(CliAgent):
    name = "claude"
    product = "Claude Code"
    tools_note = TOOLS_NOTE

    def __init__(self, model: str | None = None, workspace: str | Path | None = None):
        super().__init__(installed(settings().claude, MISSING), model, workspace)
        self.permissions = settings().claude_permissions
        if self.permissions not in ("default", "skip"):
            raise AgentUnavailable(
                f"LABRUN_CLAUDE_PERMISSIONS={self.permissions!r}: use `default` (allowed-tool "
                "rules) or `skip` (--dangerously-skip-permissions)")
        self.auth = settings().claude_auth
        if self.auth not in ("auto", "subscription", "api-key"):
            raise AgentUnavailable(f"LABRUN_CLAUDE_AUTH={self.auth!r}: use `auto`, `subscription` or `api-key`")
        options = help_text(self.executable)  # asked once, before any phase
        self.snapshot_off = "--system-prompt-snapshot" in options
        self.user_settings_only = "--setting-sources" in options

    # -- the command line and the environment ---------------------------------------------------

    def argv(self, plan: RunPlan) -> list[str]:
        argv = [self.executable, "-p", "--output-format", "stream-json", "--verbose",
                "--append-system-prompt-file", str(plan.system_file),
                "--mcp-config", str(plan.mcp_config), "--strict-mcp-config",
                "--max-turns", str(max(1, plan.turns_left))]
        if self.snapshot_off:
            argv += ["--system-prompt-snapshot", "off"]
        if self.user_settings_only:  # the workspace's .claude/settings*.json are the agent's: their hooks would run
            argv += ["--setting-sources", "user"]
        if self.model:
            argv += ["--model", self.model]
        if plan.session_id:
            argv += ["--resume", plan.session_id]
        if self.permissions == "skip":
            argv.append("--dangerously-skip-permissions")
        else:
            argv += ["--allowedTools", ",".join(self.allowed_tools(plan.web))]
        return argv

    def allowed_tools(self, web: bool = False) -> list[str]:
        """labrun's MCP server, and the tools it wants that this Claude Code has: its web
        search and fetch too in a phase that offers them."""
        known = self.known_tools
        wanted = WANTED_TOOLS + (web_tools("claude-code") if web else ())
        return ["mcp__labrun"] + [t for t in wanted if known is None or t in known]

    def environment(self, plan: RunPlan) -> dict[str, str]:
        login, dropped = choose_login(self.auth)
        prefixes = ["ANTHROPIC_", "CLAUDE_", "DISABLE_", "VERTEX_REGION_"]
        if os.environ.get("CLAUDE_CODE_USE_BEDROCK"):
            prefixes.append("AWS_")
        if os.environ.get("CLAUDE_CODE_USE_VERTEX"):
            prefixes += ["GOOGLE_", "CLOUDSDK_", "CLOUD_ML_"]
        env = passed_env(names=("IS_SANDBOX", "ENABLE_TOOL_SEARCH", "MAX_THINKING_TOKENS", "API_TIMEOUT_MS",
                                "BASH_DEFAULT_TIMEOUT_MS", "BASH_MAX_TIMEOUT_MS", "MCP_TIMEOUT",
                                "MCP_TOOL_TIMEOUT", "USE_BUILTIN_RIPGREP", "NODE_OPTIONS"),
                         prefixes=prefixes, drop=set(dropped) | set(PARENT_MARKS))
        if can_sandbox():
            env.setdefault(SCRUB, "1")  # no credentials in its Bash
        env.setdefault("ENABLE_TOOL_SEARCH", "false")  # the MCP tools offered at once, no ToolSearch turn
        env.setdefault("MCP_TOOL_TIMEOUT", str(int((plan.timeout_s + 300) * 1000)))
        if self.permissions == "skip" and hasattr(os, "geteuid") and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # Claude Code refuses to bypass permissions as root otherwise
        return env

    def homes(self) -> tuple[Path, ...]:
        config = os.environ.get("CLAUDE_CONFIG_DIR")
        return (Path(config),) if config else (Path.home() / ".claude", Path.home() / ".claude.json")

    def needs_namespace(self, env: dict[str, str]) -> bool:
        """Claude Code's sandbox (on with the scrub) runs each Bash command in a PID namespace
        of its own that ends with the command and with claude, and it cannot make one inside
        labrun's; without it, labrun's namespace ends what its commands leave running."""
        return env.get(SCRUB, "").lower() not in ON

    def api_url(self) -> str:
        return os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_API

    @property
    def own_network(self) -> bool:
        """With its sandbox on, claude runs in a network namespace of labrun's, as Codex does:
        its sandbox leaves its Bash commands the network namespace it runs in."""
        return sandbox_on()

    @property
    def confines(self) -> str:
        if sandbox_on():
            return ("(Bash) run in Claude Code's own sandbox (bubblewrap, no credentials), inside labrun's network "
                    "namespace: egress through labrun's proxy, none of the machine's loopback, writes only in the "
                    "workspace (not its .labrun/), a /tmp of the session's and claude's own home")
        return "(Bash) run with Claude Code's permission rules only: install bubblewrap and socat for its sandbox"

    def announce(self) -> str:
        login, _ = choose_login(self.auth)
        said = f"claude-code: {self.version_said()} ({self.executable}); login: {login}"
        if not can_sandbox():
            said += ("; its Bash commands can read that login: install bubblewrap and socat so that "
                     "Claude Code sandboxes them without it")
        return said

    # -- the events ------------------------------------------------------------------------------

    def read(self, event: dict[str, Any]) -> Iterator[Any]:
        kind, subtype = event.get("type"), event.get("subtype")
        if kind == "system" and subtype == "init":
            problem = None
            for server in event.get("mcp_servers") or []:
                if server.get("name") == "labrun" and server.get("status") != "connected":
                    problem = f"claude could not connect to labrun's MCP server ({server.get('status')})"
            yield Started(event.get("session_id"), event.get("tools"), problem)
        elif kind == "system" and subtype == "api_retry":
            delay = event.get("retry_delay_ms")
            yield Retrying(event.get("attempt"), event.get("max_retries"),
                           delay / 1000 if isinstance(delay, (int, float)) else None,
                           event.get("error_status"), str(event.get("error") or ""))
        elif kind == "assistant":
            message = event.get("message") or {}
            if event.get("error") or message.get("model") == "<synthetic>" or not message.get("id"):
                return  # Claude Code's own error text, not a model reply: nothing was billed
            yield Streamed(message["id"], message.get("model") or self.model or "", tokens(message.get("usage")))
            for block in message.get("content") or []:
                if block.get("type") == "tool_use" and not block.get("name", "").startswith("mcp__labrun"):
                    yield ToolUsed(block.get("name", "?"))
        elif kind == "rate_limit_event":
            info = event.get("rate_limit_info") or {}
            status = {"allowed_warning": "warning"}.get(info.get("status"), info.get("status") or "")
            resets = info.get("resetsAt")
            yield Window(status, float(resets) if resets else None, info.get("rateLimitType") or "usage")
        elif kind == "result":
            total = event.get("total_cost_usd")
            yield Finished(event.get("session_id"), tokens(event.get("usage")),
                           float(total) if isinstance(total, (int, float)) else None,
                           int(event.get("num_turns") or 0), subtype, bool(event.get("is_error")),
                           event=event)

    # -- how a run ended -------------------------------------------------------------------------

    def judge(self, out: Outcome) -> Verdict:
        result = out.finished.event if out.finished is not None else None
        said = said_by(out)
        root = self.workspace or "."
        if result is None:
            if out.rejected is not None:
                return window(out, said)
            if "unknown option" in out.stderr:
                last = out.stderr.strip().splitlines()[-1][:120]
                return Verdict("unusable", f"this Claude Code is too old for labrun ({last}): update it "
                                           "with `claude update`")
            if LOGGED_OUT.search(said):
                return Verdict("logged_out", NOT_LOGGED_IN.format(said=said.strip()[:120], root=root))
            last = (out.stderr.strip().splitlines() or ["no output on stderr"])[-1]
            return Verdict("failed", f"claude exited with code {out.exit_code} before its result ({last[:300]})")
        if not result.get("is_error") or result.get("subtype") == "error_max_turns":
            return Verdict("ok")
        status = result.get("api_error_status")
        status = int(status) if isinstance(status, (int, float)) else None
        if out.rejected is not None or (status == 429 and USAGE_LIMIT.search(said)):
            return window(out, said)
        if NO_CONVERSATION in said.lower():
            return Verdict("lost_session", said)
        if status in (401, 403) or (status is None and LOGGED_OUT.search(said)):
            return Verdict("logged_out", NOT_LOGGED_IN.format(said=said.strip()[:120], root=root))
        error_type = result.get("api_error_type")
        if status in (408, 409, 429) or (status or 0) >= 500 or error_type in TRANSIENT_TYPES or (
                status is None and result.get("terminal_reason") == "api_error" and OVERLOADED.search(said)):
            retried = f" after {len(out.retries)} retries of its own" if out.retries else ""
            return Verdict("transient", f"the API is busy or limiting ({status or error_type}){retried}: "
                                        f"{said.strip()[:200]}")
        if USAGE_LIMIT.search(said):  # the text alone, for versions without the fields
            return window(out, said)
        return Verdict("failed", f"{result.get('subtype')}: {said[:300] or 'no message'}")


# -- reading Claude Code ------------------------------------------------------------------------


def tool_runs(phase_dir: Path) -> Iterator[ToolRun]:
    """The `WebFetch` and `Bash` calls of the phase's transcripts (`claude-run-NNN.jsonl`, its
    stream-json events): an `assistant` event's `tool_use` block, answered by a `user` event's
    `tool_result` (an error when it failed)."""
    calls: dict[str, tuple[str, dict]] = {}
    for event in records(transcripts(phase_dir, ClaudeCodeAgent.name)):
        content = (event.get("message") or {}).get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[block.get("id")] = (block.get("name") or "", block.get("input") or {})
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                ok = not block.get("is_error")
                name, asked = calls[block["tool_use_id"]]
                if name == "WebFetch" and asked.get("url"):
                    yield ToolRun("fetch", str(asked["url"]), ok)
                elif name == "Bash":
                    yield ToolRun("shell", str(asked.get("command") or ""), ok)



def tokens(usage: dict[str, Any] | None) -> Usage:
    u = usage or {}
    return Usage(**{k: count(u.get(k)) for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                                  "cache_creation_input_tokens")})


def said_by(out: Outcome) -> str:
    r = out.finished.event if out.finished is not None else {}
    parts = [str(r.get("result") or "")] + [str(e) for e in r.get("errors") or []]
    if out.finished is None:
        parts.append(out.stderr)
    return " ".join(p for p in parts if p)


def window(out: Outcome, said: str) -> Verdict:
    """A spent usage window: its reset from the rejected `rate_limit_event`, else from the text."""
    resets_at = out.rejected.resets_at if out.rejected is not None else None
    if resets_at is None:
        resets_at = reset_from_text(said)
    kind = out.rejected.kind if out.rejected is not None else "usage"
    until = f"until {clock(resets_at)}" if resets_at else "(no reset time given)"
    return Verdict("window", f"Claude Code's {kind} limit is reached {until}", resets_at)


def reset_from_text(said: str, now: float | None = None) -> float | None:
    """`...|1767225600` (older versions), or `resets 6:19am (UTC)`: the next such time."""
    if m := RESET_EPOCH.search(said):
        return float(m.group(1))
    m = RESET_CLOCK.search(said)
    if not m:
        return None
    hour, minute, half, zone = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").lower(), m.group(4)
    if half:
        hour = hour % 12 + (12 if half == "pm" else 0)
    try:
        tz = ZoneInfo(zone) if zone else None
    except (KeyError, ValueError):
        tz = None
    base = datetime.fromtimestamp(time.time() if now is None else now, tz)
    at = base.replace(hour=hour % 24, minute=minute, second=0, microsecond=0)
    if at <= base:
        at += timedelta(days=1)
    return at.timestamp()


def choose_login(mode: str) -> tuple[str, list[str]]:
    """Which login `claude` uses, said in words, and the variables not to pass it."""
    env = os.environ
    config = Path(env.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")
    token = bool(env.get("CLAUDE_CODE_OAUTH_TOKEN"))
    subscription = token or (config / ".credentials.json").exists()
    key = next((n for n in (SUBSCRIPTION_KEY, "ANTHROPIC_AUTH_TOKEN") if env.get(n)), None)
    if mode == "api-key" or (mode == "auto" and key and not subscription):
        if key is None:
            return "API key asked for (LABRUN_CLAUDE_AUTH=api-key), but ANTHROPIC_API_KEY is not set", []
        return f"API key ({key}): usage is billed to that key", []
    how = "CLAUDE_CODE_OAUTH_TOKEN" if token else f"`claude /login` in {config}"
    said = f"Claude subscription ({how})" if subscription else \
        "none found (no CLAUDE_CODE_OAUTH_TOKEN, no `claude /login`, no ANTHROPIC_API_KEY)"
    dropped = [SUBSCRIPTION_KEY] if env.get(SUBSCRIPTION_KEY) else []
    if dropped:
        said += ("; ANTHROPIC_API_KEY is set but not passed on, as Claude Code would bill it instead "
                 "(LABRUN_CLAUDE_AUTH=api-key uses it)")
    return said, dropped


def sandbox_on() -> bool:
    """Whether Claude Code runs its Bash in its sandbox: it can, and the user did not turn the
    scrub, which turns it on, off."""
    return can_sandbox() and os.environ.get(SCRUB, "1").lower() in ON


def can_sandbox() -> bool:
    """Claude Code keeps its credentials out of its Bash (CLAUDE_CODE_SUBPROCESS_ENV_SCRUB)
    only inside its own sandbox, which on Linux needs bubblewrap and socat."""
    return bool(shutil.which("bwrap") and shutil.which("socat"))


@lru_cache(maxsize=8)
def help_text(executable: str) -> str:
    """What `claude --help` says (the options this version has); empty when it says nothing."""
    try:
        return subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""

"""The Gemini CLI backend (`--agent gemini`): each phase as headless `gemini` runs in the
workspace, on labrun's shared CLI base (`labrun.agents.cli_agent`). This module holds what
is Gemini CLI's; docs/agent-clis.md has what the real Gemini CLI 0.61 was seen to do.

- **The command line.** `--output-format stream-json --skip-trust --approval-mode yolo`
  (headless, every tool offered: the default mode offers none that writes), `-m` always
  (no model-router call first, and labrun knows the price), `--resume <session>` to
  continue; the prompt on stdin (with stdin not a terminal it runs headless).
- **Its home.** `GEMINI_CLI_HOME` is the workspace's `.labrun/gemini/`, never the user's:
  labrun writes its `.gemini/settings.json` before every run (the login's auth type, no
  self-update, no usage statistics, the credentials stripped from its shell's environment,
  labrun's MCP server, trusted, with a call timeout above the phase's: its stdio relay,
  `labrun.mcp_tools`, no URL and no token, reaching the engine's socket bound in at
  `/run/labrun/mcp.sock`) and the phase's system prompt as its context file
  (`context.fileName`), which Gemini CLI appends to its own system prompt and reads anew on
  every run, so a resumed session gets labrun's current prompt and STATE.md digest. Its
  sessions are kept there too, so a resume finds them.
- **Confinement.** Gemini CLI has no sandbox of its own on Linux without docker or podman,
  and its shell commands lead process groups of their own. So the whole CLI runs in the
  session's bubblewrap sandbox (`labrun.sandbox`): the workspace and its home writable, the
  rest read-only, a private /tmp, its own PID namespace that dies with the engine (its
  lifeline: a watcher inside that ends it all when the engine's end of a pipe closes), and
  its own network namespace, whose egress proxy lets exactly its API's endpoint through
  besides the internet. The CLI needs it, so `--no-network` cannot be kept for its
  commands: labrun says so. Its key reaches the CLI alone (`Secrets`, and `sealed`: an
  execute-only node, whose environment its shell commands cannot read).
- **The events.** `init` (the session id), `message`, `tool_use`, `tool_result`, `result`
  (`status`, `error`, `stats`: this run's tokens alone, also after `--resume`).
- **Cost.** Gemini CLI reports tokens only: labrun prices them (labrun/prices.py) and marks
  them estimated. A run killed before its `result` is counted from its session file, where
  Gemini CLI records each response's tokens as it ends.
- **How a run ended** (the exit code, `result.error.message`): a daily quota spent: the
  window, waited out until the quota's reset (midnight Pacific time); another 429 after its
  own retries (`LABRUN_GEMINI_MAX_ATTEMPTS`, default its 10), a 5xx, a lost connection:
  transient, backed off by labrun; an invalid key or exit 41: not logged in; an unknown
  session (exit 42 on `--resume`): a new session.
- **Login.** `GEMINI_API_KEY` bills an API key; otherwise a Google login (`gemini` once,
  interactively), whose `oauth_creds.json` in `~/.gemini` (or `$GEMINI_CLI_HOME/.gemini`)
  labrun copies into its home before each run.

Settings from the environment: `LABRUN_GEMINI` (the executable, default `gemini`),
`GEMINI_API_KEY`, `GOOGLE_GEMINI_BASE_URL` (another endpoint of the Gemini API),
`LABRUN_GEMINI_MAX_ATTEMPTS`, `LABRUN_PHASE_TIMEOUT_S`, `LABRUN_CLI_GRACE_S`.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import shutil
import stat
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterator
from zoneinfo import ZoneInfo

from labrun.agents.registry import AgentUnavailable, model_of
from labrun.agents.cli_agent import (CliAgent, Finished, Outcome, RunPlan, Started, ToolUsed, Verdict, installed,
                                     shorten)
from labrun.agents.cli_process import passed_env, version
from labrun.mcp_tools import relay
from labrun.sandbox import bubblewrap
from labrun.settings import settings
from labrun.usage import Usage, count
from labrun.windows import clock
from labrun.workspace import Workspace
from labrun.wsfs import Beneath

log = logging.getLogger("labrun")
DEFAULT_API = "https://generativelanguage.googleapis.com"
"""The Gemini API, where GOOGLE_GEMINI_BASE_URL names no other."""

TOOLS_NOTE = "gemini.md.j2"
CONTEXT_FILE = "labrun-phase.md"
MCP_SOCKET = "/run/labrun/mcp.sock"
"""Where the engine's MCP socket is bound in the sandbox (whose /run is its own)."""
OAUTH_FILES = ("oauth_creds.json", "google_accounts.json")
QUOTA_RESETS_IN = ZoneInfo("America/Los_Angeles")  # the Gemini API's per-day quotas reset at midnight there
TRANSIENT = re.compile(r"\b(429|5\d\d)\b|quota|rate limit|RESOURCE_EXHAUSTED|UNAVAILABLE|overloaded|high demand|"
                       r"fetch failed|ECONN|ETIMEDOUT|socket hang up|timed? ?out", re.I)
KEY_REFUSED = re.compile(r"API_KEY_INVALID|API key not valid|PERMISSION_DENIED|\b40[13]\b", re.I)
# The exit code of an API error is its HTTP status mod 256.
EXIT_RATE_LIMITED, EXIT_AUTH, EXIT_INPUT, EXIT_UNTRUSTED = 429 % 256, 41, 42, 55
EXIT_SERVER = {status % 256 for status in range(500, 600)}

MISSING = ("Gemini CLI is not installed (no `{exe}` on PATH): install it with `npm install -g @google/gemini-cli`, "
           "then log in by running `gemini` once, or export GEMINI_API_KEY")
NOT_LOGGED_IN = ("Gemini CLI is not logged in{said}: export GEMINI_API_KEY (a key from Google AI Studio), or run "
                 "`gemini` once and choose \"Login with Google\"{then}")


class GeminiAgent(CliAgent):
    name = "gemini"
    product = "Gemini CLI"
    tools_note = TOOLS_NOTE
    in_sandbox = True

    def __init__(self, model: str | None = None, workspace: str | Path | None = None):
        super().__init__(installed(settings().gemini, MISSING), model_of("gemini", model), workspace)
        self.login = login()
        if self.login is None:
            raise AgentUnavailable(NOT_LOGGED_IN.format(said=" (no GEMINI_API_KEY, no Google login in ~/.gemini)",
                                                        then=""))
        attempts = settings().gemini_max_attempts
        if attempts and not (attempts.isdigit() and 1 <= int(attempts) <= 10):
            raise AgentUnavailable(f"LABRUN_GEMINI_MAX_ATTEMPTS={attempts}: give a whole number from 1 to 10 "
                                   "(Gemini CLI's own attempts at each request), or unset it")
        self.max_attempts = int(attempts) if attempts else None
        self.session: str | None = None  # of the run being read
        self.turns = 0
        self.in_reply = False

    # -- the command line, the home and the environment -------------------------------------------

    def home(self, plan: RunPlan) -> Path:
        return Workspace(plan.workspace or self.workspace or ".").agent_home("gemini")

    def argv(self, plan: RunPlan) -> list[str]:
        home = self.home(plan)
        self.write_settings(plan, home)
        cli = ["--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo", "-m", self.model]
        if plan.session_id:
            cli += ["--resume", plan.session_id]
        if plan.sandbox is None or plan.lifeline is None:
            return [self.executable, *cli]
        launcher = sealed(self.executable)
        cli = [*launcher, *cli]
        if plan.secrets is not None:
            cli = plan.secrets.handed_to(cli)
        # Shown wherever they lie, since the sandbox covers the homes (where nvm and npm's user
        # prefix install): the CLI's package with its dependencies (the node_modules it lies in),
        # the folder it was named in, and the node copy's.
        script = Path(launcher[-1])
        installed = script.resolve()
        shown = dict.fromkeys([next((p for p in installed.parents if p.name == "node_modules"), installed.parent),
                               script.parent, *(Path(p).parent for p in launcher[:-1])])
        # The engine's MCP socket, for its relay, at the path its settings name.
        socket = ((plan.server.socket, Path(MCP_SOCKET)),) if plan.server is not None else ()
        # no_proxy: none, so that its calls to its API on the loopback go through the proxy too
        return replace(plan.sandbox, readonly=(*plan.sandbox.readonly, *shown), shown=(*plan.sandbox.shown, *socket),
                       writable=(*plan.sandbox.writable, home), no_proxy="").wrap(cli, plan.lifeline)

    def api_url(self) -> str:
        return os.environ.get("GOOGLE_GEMINI_BASE_URL") or DEFAULT_API

    def write_settings(self, plan: RunPlan, home: Path) -> None:
        """Its settings and labrun's phase prompt in its home, before every run (the MCP
        socket changes with each phase, the prompt's digest with each engine)."""
        general: dict[str, Any] = {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
        if self.max_attempts:
            general["maxAttempts"] = self.max_attempts
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key" if self.login.startswith("API key")
                                  else "oauth-personal"},
                         "environmentVariableRedaction": {"enabled": True}},  # no credentials in its shell
            "general": general,
            "privacy": {"usageStatisticsEnabled": False},
            "advanced": {"ignoreLocalEnv": True},  # the workspace's .env (the experiments' keys) stays out of it
            "context": {"fileName": CONTEXT_FILE},
        }
        if plan.server is not None:
            inside = plan.sandbox is not None and plan.lifeline is not None  # as `argv` runs it
            command, *args = relay(MCP_SOCKET if inside else plan.server.socket)
            settings["mcpServers"] = {"labrun": {"command": command, "args": args, "trust": True,
                                                 "timeout": int(plan.timeout_s + 300) * 1000}}
        # Its shell writes its home, in the workspace: written through the workspace's file API,
        # which replaces a link planted there and never follows one.
        files = Beneath(home.parent.parent.resolve())
        config = home.relative_to(home.parent.parent) / ".gemini"
        # It loads variables it has not got from the first of these it finds (GOOGLE_GEMINI_BASE_URL
        # would send its key elsewhere); each is the shell's to write, so none is left for it.
        for env_file in (".gemini/.env", config / ".env", config.parent / ".env"):
            folder = Path(env_file).parent
            try:  # a folder on the way that is a link (it would follow it) goes aside whole
                st = files.lstat(folder)
                gone = files.set_aside(folder if st and stat.S_ISLNK(st.st_mode) else env_file, "set-aside-by-labrun")
            except (OSError, ValueError):
                continue
            if gone is not None:
                log.warning("%s: set aside as %s (Gemini CLI would load it into its own environment)", env_file, gone)
        files.write(config / "settings.json", json.dumps(settings, indent=2))
        files.write(config / CONTEXT_FILE, plan.system_file.read_text())
        if not self.login.startswith("API key"):
            copy_google_login(files, config)

    def environment(self, plan: RunPlan) -> dict[str, str]:
        names = ["GOOGLE_GEMINI_BASE_URL", "NO_COLOR"]
        if self.login.startswith("API key"):
            names.append("GEMINI_API_KEY")
        env = passed_env(names=names)
        env["GEMINI_CLI_HOME"] = str(self.home(plan))
        env["GEMINI_CLI_NO_RELAUNCH"] = "true"  # one process, not a relaunched child with a larger heap
        return env

    def needs_namespace(self, env: dict[str, str]) -> bool:
        return bubblewrap() is None  # the sandbox it runs in has its PID namespace

    def write_mcp_config(self, server, phase_dir: Path) -> None:
        return None  # in its settings, written before each run

    confines = ("run, with the CLI itself, in labrun's sandbox: writes in the workspace, egress through "
                "labrun's proxy, none of the CLI's environment (its key)")

    def version_said(self) -> str:  # its --version says the number alone
        return f"{self.product} {version(self.executable) or 'version unknown'}"

    # -- the events ------------------------------------------------------------------------------

    def read(self, event: dict[str, Any]) -> Iterator[Any]:
        kind = event.get("type")
        if kind == "init":  # the first event of every run
            self.turns, self.in_reply = 0, False
            self.session = event.get("session_id")
            yield Started(self.session)
        elif kind in ("message", "tool_use") and (kind == "tool_use" or event.get("role") == "assistant"):
            self.turns += not self.in_reply  # a model reply: its text and calls
            self.in_reply = True
            if kind == "tool_use" and (said := tool_line(event)):
                yield ToolUsed(said)
        elif kind in ("tool_result", "message"):
            self.in_reply = False
        elif kind == "result":
            stats = event.get("stats") or {}
            models = list(stats.get("models") or {})
            yield Finished(self.session, tokens(stats), None, self.turns, event.get("status"),
                           event.get("status") != "success", model=models[0] if len(models) == 1 else self.model,
                           event=event)

    def recover(self, session_id: str | None, since: float) -> Finished | None:
        """What a run that ended without its `result` was billed: the tokens of each response
        Gemini CLI recorded in the session's file since the run began."""
        if not session_id or self.workspace is None:
            return None
        replies = session_replies(Workspace(self.workspace).agent_home("gemini"), session_id, since)
        if not replies:
            return None
        usage = sum((tokens_of_reply(r["tokens"]) for r in replies), Usage())
        return Finished(session_id, usage, None, len(replies), "recovered", False,
                        model=replies[-1].get("model") or self.model)

    # -- how a run ended -------------------------------------------------------------------------

    def judge(self, out: Outcome) -> Verdict:
        root = self.workspace or "."
        then = f"; then `labrun resume {root}`"
        if out.finished is None:
            last = (out.stderr.strip().splitlines() or ["no output on stderr"])[-1]
            if out.exit_code == EXIT_INPUT and "resuming session" in out.stderr:
                return Verdict("lost_session", last[:300])
            if out.exit_code == EXIT_AUTH:
                return Verdict("logged_out", NOT_LOGGED_IN.format(said=f" ({last[:160]})", then=then))
            if out.exit_code == EXIT_UNTRUSTED:
                return Verdict("unusable", f"gemini refused the workspace as untrusted ({last[:200]})")
            return Verdict("failed", f"gemini exited with code {out.exit_code} before its result ({last[:300]})")
        if not out.finished.is_error:
            return Verdict("ok")
        said = str((out.finished.event.get("error") or {}).get("message") or "")
        if "daily quota" in said:
            resets_at = next_quota_reset()
            return Verdict("window", f"the Gemini API's daily quota of this login is spent until {clock(resets_at)}",
                           resets_at)
        if out.exit_code == EXIT_RATE_LIMITED or out.exit_code in EXIT_SERVER or TRANSIENT.search(said):
            if not KEY_REFUSED.search(said):
                return Verdict("transient", f"the API is busy or limiting after gemini's own retries: "
                                            f"{' '.join(said.split())[:200]}")
        if KEY_REFUSED.search(said):
            return Verdict("logged_out", NOT_LOGGED_IN.format(said=f" ({' '.join(said.split())[:120]})", then=then))
        return Verdict("failed", said[:300] or f"gemini failed (exit code {out.exit_code}) with no message")


# -- reading Gemini CLI ---------------------------------------------------------------------------


def tokens(stats: dict[str, Any]) -> Usage:
    """A run's `result.stats` in labrun's fields: its `input_tokens` include the cached ones,
    which labrun counts apart; what `total_tokens` has beyond input and output is the
    model's thinking, billed as output."""
    prompt, cached = count(stats.get("input_tokens")), count(stats.get("cached"))
    output = max(count(stats.get("output_tokens")), count(stats.get("total_tokens")) - prompt)
    return Usage(input_tokens=max(0, prompt - cached), output_tokens=output, cache_read_input_tokens=cached)


def tokens_of_reply(counts: dict[str, Any]) -> Usage:
    """One response's `tokens` in the session file (`input` includes `cached`)."""
    cached = count(counts.get("cached"))
    return Usage(input_tokens=max(0, count(counts.get("input")) - cached),
                 output_tokens=count(counts.get("output")) + count(counts.get("thoughts")),
                 cache_read_input_tokens=cached)


def session_replies(home: Path, session_id: str, since: float) -> list[dict[str, Any]]:
    """The model's responses recorded in the session's file (`.gemini/tmp/<project>/chats/`,
    JSON lines: messages, and `$set` updates that may hold them too) from `since` on. Its
    shell writes its home: read as the agent's files are (no link, no FIFO)."""
    files = Beneath(home)
    pattern = f".gemini/tmp/*/chats/session-*-{session_id[:8]}.jsonl"
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(f for f, _ in files.files(".gemini/tmp") if fnmatch.fnmatch(f, pattern)):
        for line in files.lines(path):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut off by a kill
            if not isinstance(record, dict):
                continue
            if record.get("sessionId") not in (None, session_id):
                break
            for message in (record.get("$set") or {}).get("messages") or [record]:
                if isinstance(message, dict) and message.get("type") == "gemini" and message.get("tokens"):
                    found[message.get("id") or str(len(found))] = message
    return [m for m in found.values() if _epoch(m.get("timestamp")) >= since]


def _epoch(stamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def tool_line(event: dict[str, Any]) -> str | None:
    """A progress line for one of its tools (labrun's own are logged by the engine)."""
    name, params = str(event.get("tool_name") or "?"), event.get("parameters") or {}
    if name.startswith("mcp_labrun_"):
        return None
    if name == "run_shell_command":
        return f"$ {shorten(params.get('command'))}"
    if params.get("file_path"):
        return f"{name} {Path(str(params['file_path'])).name}"
    return name


def next_quota_reset(now: float | None = None) -> float:
    """The next midnight, Pacific time, when per-day quotas reset."""
    here = datetime.now(QUOTA_RESETS_IN) if now is None else datetime.fromtimestamp(now, QUOTA_RESETS_IN)
    midnight = (here + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.timestamp()


# -- its login ----------------------------------------------------------------------------------


def user_config() -> Path:
    return Path(os.environ.get("GEMINI_CLI_HOME") or Path.home()) / ".gemini"


def login() -> str | None:
    """Which login Gemini CLI uses, in words (None: none)."""
    if os.environ.get("GEMINI_API_KEY"):
        return "API key (GEMINI_API_KEY): usage is billed to that key"
    if (user_config() / "oauth_creds.json").is_file():
        return f"Google login ({user_config() / 'oauth_creds.json'}, copied into the workspace's .labrun/gemini)"
    return None


def sealed(executable: str) -> list[str]:
    """How to start Gemini CLI so that its shell commands cannot read its environment (its
    key): its script run by an execute-only copy of node. The kernel
    marks a process that runs a program it may not read as not dumpable, and other processes
    of the same user then cannot open its `/proc/<pid>/environ` (nor its memory) without
    CAP_SYS_PTRACE, which nothing in the sandbox has. A launcher that is not a node script
    is run as it is."""
    script = Path(executable).resolve()
    try:
        with open(script, "rb") as f:
            node_script = b"node" in f.readline()
    except OSError:
        node_script = False
    node = shutil.which("node")
    if not node_script or node is None:
        return [executable]
    source = Path(node).resolve()
    facts = source.stat()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "labrun"
    copy = cache / f"node-{facts.st_size}-{facts.st_mtime_ns}"
    if not copy.exists():
        cache.mkdir(parents=True, exist_ok=True)
        part = copy.with_name(f"{copy.name}.{os.getpid()}.part")
        shutil.copyfile(source, part)
        part.chmod(0o111)
        part.replace(copy)
    return [str(copy), str(script)]


def copy_google_login(files: Beneath, config: Path) -> None:
    """The user's Google login into labrun's home (`config`, beneath `files`), unless the copy
    there is newer (Gemini CLI refreshes its access token in place)."""
    for name in OAUTH_FILES:
        source, target = user_config() / name, files.lstat(config / name)
        if source.is_file() and (target is None or source.stat().st_mtime > target.st_mtime):
            files.write(config / name, source.read_bytes(), mode=0o600)

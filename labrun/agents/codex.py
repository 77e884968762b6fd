"""The Codex backend (`--agent codex`): each phase as `codex exec` runs in the workspace, on
labrun's shared CLI base (`labrun.agents.cli_agent`). This module holds what is Codex's;
docs/agent-clis.md has what the real Codex 0.169 was seen to do.

- **The executable** is Codex's native binary, not its npm launcher: on node < 22.15 the
  launcher cannot replace itself, stays the parent and forwards signals, so a SIGKILL of it
  (a parent-death signal, a killed engine) leaves the native process running. The binary
  is found from `codex` on PATH (or `LABRUN_CODEX`) through the launcher's package.
- **The command line.** `exec --json --skip-git-repo-check --ignore-user-config
  --ignore-rules`, `resume <thread>` to continue, `-m` always (so labrun knows the price),
  the prompt on stdin (`-`). Everything else is `-c` overrides, given on every run (`exec
  resume` has no `--sandbox`): the `workspace-write` sandbox (the workspace writable, and
  nothing else: not /tmp, not `$TMPDIR`; the network on, research needs it), commands get
  only the core environment (`shell_environment_policy.inherit="core"`), no analytics, no
  update check, labrun's MCP server (its stdio relay, `labrun.mcp_tools`: no URL, no
  token) approved in advance (`exec` never asks, so an unapproved call fails), with a call
  timeout above the phase's. The phase's prompt is
  `developer_instructions`, which Codex fixes when the thread starts: a resumed phase gets
  labrun's current prompt and STATE.md digest in its first resume prompt instead.
- **The events.** `thread.started` (the thread id), `item.started`/`item.completed`
  (commands, file changes, MCP calls, messages), `error` ("Reconnecting... N/5 (...)": its
  own retries), `turn.completed` (the **thread's** running token total), `turn.failed`.
- **Cost.** Codex reports tokens only: labrun prices them (labrun/prices.py) and marks them
  estimated. A run's tokens are the change in the thread's total. A run killed before
  `turn.completed` is counted from the thread's rollout file (`$CODEX_HOME/sessions/...`),
  where Codex writes the running total after every response.
- **How a run ended** (`turn.failed`'s message, exit 1): "exceeded retry limit, last status
  429", a cut stream, 5xx: transient, backed off by labrun; "You've hit your usage limit
  ... try again at 1:46 PM": the window, waited out until then (`TZ=UTC` makes the time
  UTC); without a time: backed off; "Quota exceeded": billing, the session stops saying
  so; 401: not logged in; "no rollout found for thread id": a new thread.
- **The environment**: paths, locale, proxies, certificates, `CODEX_HOME`, the key when
  billing an API key, `LABRUN_PASS_ENV`; `TMPDIR` inside the workspace's `.labrun/` (Codex
  refuses to set up its sandbox helper when `CODEX_HOME` lies under `TMPDIR`).
- **Login.** `CODEX_API_KEY` (or `OPENAI_API_KEY`, passed on as `CODEX_API_KEY`, which is
  what `codex exec` reads) bills an API key; otherwise `codex login` (a ChatGPT plan, or a
  stored key). `CODEX_HOME` is the user's (`~/.codex` unless set): a copy of its login
  would rotate its refresh token away, so labrun uses it in place, for the login and the
  sessions, and leaves its config out (`--ignore-user-config`).
- **Processes and the network.** Codex's sandbox runs each command in a PID namespace of its
  own that dies with Codex; with the network on, its commands share Codex's network
  namespace. So labrun runs Codex in a network namespace of its own
  (`in_network_namespace`, with the session's egress proxy; its sandbox cannot nest in a PID
  namespace of labrun's, and needs none): its commands reach the internet through the proxy (HTTP(S)_PROXY set for them by
  `shell_environment_policy.set`), Codex reaches its API as an endpoint the engine names,
  and none of them the machine's loopback.

Settings from the environment: `LABRUN_CODEX` (the executable, default `codex`),
`OPENAI_BASE_URL` (passed to Codex as `openai_base_url`, which it reads instead of the
variable), `CODEX_HOME`, `LABRUN_PHASE_TIMEOUT_S`, `LABRUN_CLI_GRACE_S`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from labrun import prompts
from labrun.agents.registry import AgentUnavailable, model_of
from labrun.agents.cli_agent import (CliAgent, Finished, Outcome, Retrying, RunPlan, Started, ToolUsed, Verdict,
                                     installed, shorten)
from labrun.agents.cli_process import passed_env
from labrun.egress import PROXY_URL, PROXY_VARIABLES
from labrun.mcp_tools import relay
from labrun.sandbox import Sandbox
from labrun.settings import settings
from labrun.usage import Usage, count
from labrun.wsfs import Beneath
from labrun.windows import clock
from labrun.workspace import Workspace

TOOLS_NOTE = "codex.md.j2"
RESUME_NOTE = "codex_resume.md.j2"
DEFAULT_API = "https://api.openai.com/v1"
"""Where `codex exec` sends an API key's requests, unless OPENAI_BASE_URL names another."""
RECONNECTING = re.compile(r"^Reconnecting\.\.\. (\d+)/(\d+)(?: \((.*)\))?", re.S)
STATUS = re.compile(r"last status: (\d{3})|unexpected status (\d{3})")
USAGE_LIMIT = re.compile(r"hit your usage limit", re.I)
RESET_AT = re.compile(r"try again at (?:(\w{3}) (\d{1,2})(?:st|nd|rd|th)?, (\d{4}) )?(\d{1,2}):(\d{2}) ([AP]M)", re.I)
TRANSIENT = re.compile(r"exceeded retry limit|stream disconnected|high demand|try again later|timed out|"
                       r"connection|overloaded|\b5\d\d\b", re.I)
MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                      "dec"), start=1)}
STEPS = {"command_execution", "file_change", "mcp_tool_call", "agent_message", "web_search"}

MISSING = ("Codex is not installed (no `{exe}` on PATH): install it with `npm install -g @openai/codex`, "
           "then log in with `codex login`")
NO_BINARY = ("found Codex's npm launcher at {launcher} but not its native binary (the package "
             "@openai/codex-<platform>): reinstall it with `npm install -g @openai/codex`")
NOT_LOGGED_IN = ("Codex is not logged in{said}: run `codex login` (a ChatGPT plan), or "
                 "`printenv OPENAI_API_KEY | codex login --with-api-key`, or export CODEX_API_KEY{then}")


class CodexAgent(CliAgent):
    name = "codex"
    product = "Codex"
    tools_note = TOOLS_NOTE

    def __init__(self, model: str | None = None, workspace: str | Path | None = None):
        super().__init__(native_binary(settings().codex), model_of("codex", model), workspace)
        self.home = codex_home()
        self.login = login(self.executable, str(self.home))
        if self.login is None:
            raise AgentUnavailable(NOT_LOGGED_IN.format(said=f" (no login in {self.home})", then=""))
        self.thread: str | None = None  # of the run being read
        self.steps = 0

    # -- the command line and the environment ---------------------------------------------------

    def argv(self, plan: RunPlan) -> list[str]:
        argv = [self.executable, "exec", "--json", "--skip-git-repo-check", "--ignore-user-config", "--ignore-rules"]
        if plan.session_id:
            argv += ["resume", plan.session_id]
        config: dict[str, Any] = {
            "sandbox_mode": "workspace-write",
            "sandbox_workspace_write.network_access": True,
            "sandbox_workspace_write.exclude_slash_tmp": True,
            "sandbox_workspace_write.exclude_tmpdir_env_var": True,
            "shell_environment_policy.inherit": "core",  # no credentials in its commands
            "analytics.enabled": False,
            "check_for_update_on_startup": False,
        }
        if plan.server is not None:
            command, *args = relay(plan.server.socket)
            config.update({
                "mcp_servers.labrun.command": command,
                "mcp_servers.labrun.args": args,
                "mcp_servers.labrun.default_tools_approval_mode": "approve",
                "mcp_servers.labrun.tool_timeout_sec": int(plan.timeout_s) + 300,
            })
        if base_url := os.environ.get("OPENAI_BASE_URL"):
            config["openai_base_url"] = base_url
        if self.egress(plan) is not None:  # its commands' way out: the bridge, like its own
            for name in PROXY_VARIABLES:
                config[f"shell_environment_policy.set.{name}"] = PROXY_URL
        if not plan.session_id:  # fixed when the thread starts; a resume gets it in its prompt
            config["developer_instructions"] = plan.system_file.read_text()
        for key, value in config.items():
            argv += ["-c", f"{key}={json.dumps(value)}"]
        return argv + ["-m", self.model, "-"]

    def api_url(self) -> str:
        return os.environ.get("OPENAI_BASE_URL") or DEFAULT_API

    def prompt(self, plan: RunPlan, text: str) -> str:
        if not plan.renewed:
            return text
        renewed = prompts.env.get_template(RESUME_NOTE).render(system=plan.system_file.read_text().strip())
        return renewed.strip() + "\n\n" + text

    def environment(self, plan: RunPlan) -> dict[str, str]:
        env = passed_env(names=("CODEX_API_KEY", "CODEX_CA_CERTIFICATE", "RUST_LOG"))
        env["CODEX_HOME"] = str(self.home)
        if "CODEX_API_KEY" not in env and os.environ.get("OPENAI_API_KEY") and self.login.startswith("API key"):
            env["CODEX_API_KEY"] = os.environ["OPENAI_API_KEY"]  # what `codex exec` reads
        tmp = Workspace(plan.workspace or self.workspace or ".").tmp
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env["TZ"] = "UTC"  # its usage-limit message gives the reset in local time
        return env

    def needs_namespace(self, env: dict[str, str]) -> bool:
        return False  # its sandbox ends what its commands start, and cannot nest in labrun's

    def homes(self) -> tuple[Path, ...]:
        return (self.home,)

    def sandbox(self, session, proxy: Path | None = None) -> Sandbox:
        """The session's, with the temp folder it gives Codex (TMPDIR) writable inside the
        read-only `.labrun/`."""
        sandbox = super().sandbox(session, proxy)
        return replace(sandbox, writable=(*sandbox.writable, session.ws.tmp))

    def write_mcp_config(self, server, phase_dir: Path) -> None:
        return None  # on the command line

    own_network = True
    confines = ("run in Codex's own workspace-write sandbox (no keys), inside labrun's network namespace: egress "
                "through labrun's proxy, none of the machine's loopback, writes only in the workspace (not its "
                ".labrun/), a /tmp of the session's and Codex's own home")

    # -- the events ------------------------------------------------------------------------------

    def read(self, event: dict[str, Any]) -> Iterator[Any]:
        kind = event.get("type")
        if kind == "thread.started":  # the first event of every run
            self.thread, self.steps = event.get("thread_id"), 0
            yield Started(self.thread)
        elif kind == "item.started":
            item = event.get("item") or {}
            if item.get("type") == "command_execution":
                yield ToolUsed(f"$ {shorten(item.get('command'))}")
        elif kind == "item.completed":
            item = event.get("item") or {}
            self.steps += item.get("type") in STEPS
            if item.get("type") == "file_change":
                yield ToolUsed("edit " + ", ".join(Path(c.get("path", "?")).name for c in item.get("changes") or []))
            elif item.get("type") == "mcp_tool_call" and item.get("server") != "labrun":
                yield ToolUsed(f"{item.get('server')}.{item.get('tool')}")
        elif kind == "error":
            if m := RECONNECTING.match(str(event.get("message") or "")):
                said = m.group(3) or ""
                status = STATUS.search(said)
                yield Retrying(int(m.group(1)), int(m.group(2)), None,
                               int(status.group(1) or status.group(2)) if status else None, said[:200])
        elif kind == "turn.completed":
            yield Finished(self.thread, tokens(event.get("usage")), None, self.steps, "success", False,
                           model=self.model, event=event, usage_total=True)
        elif kind == "turn.failed":  # no usage in it: the rollout has the thread's total
            yield self.from_rollout(self.thread, "error", self.steps, event, True) or Finished(
                self.thread, Usage(), None, self.steps, "error", True, model=self.model, event=event)

    def recover(self, session_id: str | None, since: float) -> Finished | None:
        return self.from_rollout(session_id, "recovered", 0, {}, False)

    def from_rollout(self, thread: str | None, subtype: str, steps: int, event: dict[str, Any],
                     is_error: bool) -> Finished | None:
        """A run that ended without `turn.completed`, counted from the thread's rollout file:
        Codex records each response's usage there (`token_usage_record`, with the thread's
        total), also in a run killed before its end."""
        totals = rollout_totals(self.home, thread) if thread else None
        if totals is None:
            return None
        billed, restored = totals
        return Finished(thread, billed, None, steps, subtype, is_error, model=self.model, event=event,
                        usage_total=True, counted_from=restored)

    # -- how a run ended -------------------------------------------------------------------------

    def judge(self, out: Outcome) -> Verdict:
        root = self.workspace or "."
        then = f"; then `labrun resume {root}`"
        if out.finished is None:
            last = (out.stderr.strip().splitlines() or ["no output on stderr"])[-1]
            if "no rollout found" in out.stderr:
                return Verdict("lost_session", last[:300])
            if "unexpected status 401" in out.stderr:
                return Verdict("logged_out", NOT_LOGGED_IN.format(said=" (the API answered 401)", then=then))
            return Verdict("failed", f"codex exited with code {out.exit_code} before its result ({last[:300]})")
        if not out.finished.is_error:
            return Verdict("ok")
        said = str((out.finished.event.get("error") or {}).get("message") or "")
        if USAGE_LIMIT.search(said):
            resets_at = reset_from_text(said)
            if resets_at is not None:
                return Verdict("window", f"Codex's usage limit is reached until {clock(resets_at)}", resets_at)
            return Verdict("transient", f"Codex's usage limit is reached (no reset time given): {said[:200]}")
        if said.startswith("Quota exceeded"):
            return Verdict("unusable", f"OpenAI says the quota of this login is spent ({said[:120]}): add credit "
                                       f"or change the plan, then `labrun resume {root}`")
        if "unexpected status 401" in said or "unexpected status 403" in said:
            return Verdict("logged_out", NOT_LOGGED_IN.format(said=f" ({said[:120]})", then=then))
        if TRANSIENT.search(said):
            retried = f" after {len(out.retries)} retries of its own" if out.retries else ""
            return Verdict("transient", f"the API is busy or limiting{retried}: {said[:200]}")
        return Verdict("failed", said[:300] or "turn failed with no message")


# -- reading Codex ------------------------------------------------------------------------------


def tokens(usage: dict[str, Any] | None) -> Usage:
    """Codex's counts in labrun's fields: its `input_tokens` include the cached and the
    cache-written ones, which labrun counts apart (as the Messages API does)."""
    u = usage or {}
    cached, written = count(u.get("cached_input_tokens")), count(u.get("cache_write_input_tokens"))
    return Usage(input_tokens=max(0, count(u.get("input_tokens")) - cached - written),
                 output_tokens=count(u.get("output_tokens")), cache_read_input_tokens=cached,
                 cache_creation_input_tokens=written)


def rollout_totals(home: Path, thread: str) -> tuple[Usage, Usage] | None:
    """The thread's token totals in its rollout file: as billed (the last response's
    `token_usage_record`), and as Codex restores it on resume (the last `token_count`
    event, written just after the record: a run killed between them restores less than it
    billed, and its next total counts on from there)."""
    billed = restored = None
    files = Beneath(home)  # a CLI's home: read as the agent's files are (no link, no FIFO, bounded)
    rollouts = sorted(f for f, _ in files.files("sessions") if fnmatch.fnmatch(f.rsplit("/", 1)[-1],
                                                                                f"rollout-*-{thread}.jsonl"))
    for path in rollouts:
        for line in files.lines(path):
            if '"token_count"' not in line and '"token_usage_record"' not in line:
                continue
            try:
                record = json.loads(line)
                payload = record["payload"]
                if record.get("type") == "token_usage_record":
                    billed = tokens(payload["thread_token_usage"])
                elif payload.get("type") == "token_count" and payload.get("info"):
                    restored = tokens(payload["info"]["total_token_usage"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    if billed is None and restored is None:
        return None
    return billed or restored, restored or Usage()


def reset_from_text(said: str, now: float | None = None) -> float | None:
    """`try again at 1:46 PM` (today, or tomorrow once past) or `try again at Dec 4th, 2026
    12:44 PM`, in UTC; given to the minute, so the minute's end."""
    m = RESET_AT.search(said)
    if not m:
        return None
    month, day, year, hour, minute, half = m.groups()
    hour = int(hour) % 12 + (12 if half.upper() == "PM" else 0)
    base = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    if month:
        if month.lower()[:3] not in MONTHS:
            return None
        at = datetime(int(year), MONTHS[month.lower()[:3]], int(day), hour, int(minute), tzinfo=timezone.utc)
    else:
        at = base.replace(hour=hour, minute=int(minute), second=0, microsecond=0)
        if at + timedelta(minutes=1) <= base:
            at += timedelta(days=1)
    return (at + timedelta(minutes=1)).timestamp()


# -- finding Codex and its login ----------------------------------------------------------------


def native_binary(exe: str) -> str:
    """The native `codex` behind `exe` (the npm launcher, or the binary itself)."""
    found = installed(exe, MISSING)
    real = Path(found).resolve()
    if real.suffix != ".js":
        return str(real)
    package = real.parent.parent  # .../@openai/codex/bin/codex.js
    for pattern in ("node_modules/@openai/codex-*/vendor/*/bin/codex", "../codex-*/vendor/*/bin/codex",
                    "vendor/*/bin/codex"):
        if binaries := sorted(package.glob(pattern)):
            return str(binaries[0].resolve())
    raise AgentUnavailable(NO_BINARY.format(launcher=found))


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


@lru_cache(maxsize=8)
def login(executable: str, home: str) -> str | None:
    """Which login Codex uses, in words (None: none)."""
    if os.environ.get("CODEX_API_KEY"):
        return "API key (CODEX_API_KEY): usage is billed to that key"
    try:
        status = subprocess.run([executable, "login", "status"], capture_output=True, text=True, timeout=60,
                                env={**passed_env(), "CODEX_HOME": home})
    except (OSError, subprocess.TimeoutExpired):
        status = None
    if status is not None and status.returncode == 0:
        said = (status.stdout + status.stderr).strip().splitlines()
        return f"`codex login` in {home} ({said[0] if said else 'logged in'})"
    if os.environ.get("OPENAI_API_KEY"):
        return "API key (OPENAI_API_KEY, passed on as CODEX_API_KEY): usage is billed to that key"
    return None

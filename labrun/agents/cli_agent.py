"""What labrun's coding-CLI backends share: Claude Code, Codex and Gemini CLI.

A phase is one or more runs of the agent's CLI in the workspace. The CLI brings its own
shell and editor; labrun's `run_experiment` and `complete_phase` reach it over MCP from a
server in this process (`labrun.mcp_tools.ToolServer`), so attempts stay Prefect subtasks
and the engine alone writes STATE.md. The CLI's MCP server is labrun's stdio relay, whose
one connection per run is the only one the engine accepts. The phase ends when
`complete_phase` succeeds.

The base does, for every CLI:

- **The phase loop** (`run_phase`): turn limit, budget and disk checks before each run; the
  next run's prompt from the journal (the kickoff, a nudge when a run stopped short of
  `complete_phase`, the resume note after an interruption); a session the CLI no longer
  has is started afresh; three failed runs in a row stop the phase.
- **The retry layer**: each run is a Prefect task (`agent_run`) with the same retry policy
  as a model call (`labrun.turns.RETRY_POLICY`), so a run that ends on a transient API
  error (persistent 429, 529, overload) is run again after back-off, never counted as a
  failure. A spent usage window raises `UsageWindowSpent`, which the flow waits out
  (`labrun.windows`).
- **Process lifetime** (`labrun.sandbox.spawn`): nothing the CLI starts outlives the
  engine. The CLI gets a parent-death signal and stays in the engine's process group; with
  bubblewrap it also runs in its own PID namespace tied to the engine (`--unshare-pid
  --die-with-parent`), so a `kill -9` of the engine, or of its process group, ends every
  process inside, even those that left the CLI's session, unless the backend says its CLI's
  own sandbox does that (`needs_namespace`). A CLI with no sandbox of its own runs inside
  the session's (`in_sandbox`: `labrun.sandbox`, with its lifeline held by the engine).
  Timeouts kill its tree.
- **The event journal**: every event of run N goes, redacted, into `<name>-run-NNN.jsonl`
  beside the phase's journal. The journal (`Conversation`) gets, as records the rest of
  the engine reads: a "reply" when a run starts (a crash is then resumed, not restarted);
  a "reply" with the usage of each assistant message as it streams, priced from labrun's
  table and marked estimated; when the run's result comes, a "reply" that corrects those
  estimates to what the run was billed, so a run killed before its result still counts
  what it streamed and a finished run counts exactly its bill; a "reply" and a
  "tool_result" for each MCP tool call; a "cli_session" record with the CLI's session id
  and the tools it offers. What those records say a run used: `labrun.agents.cli_usage`.
- **Progress**: the CLI's own tools, its API retries (attempt, status, delay) and usage
  window warnings as log lines.

The seam. A backend subclasses `CliAgent` and gives what differs between CLIs:

- `name` (prefix of its files), `tools_note` (a template appended to the system prompt
  that maps labrun's tool names to the CLI's);
- `argv(plan)`: the command line of one run (`RunPlan`: prompt file, MCP config file, the
  session to resume or None, the turns left, the workspace, the tool server); the prompt
  goes on stdin;
- `write_mcp_config(server, phase_dir)`: the MCP server in the CLI's config format (the
  default writes the `mcpServers` JSON that `server.mcp_config()` gives: the relay's
  command, no secret; None: the CLI takes it on its command line or in its settings);
- `environment(plan)`: the scrubbed environment of a run (`labrun.agents.cli_process.passed_env`
  helps);
- `read(event)`: one parsed JSON line of its output as `Started`, `Streamed`, `ToolUsed`,
  `Retrying`, `Window` or `Finished` (any number, none for events that do not matter);
  a `Finished` whose CLI reports the session's running token total, not the run's, says
  so (`usage_total`), and labrun counts the change (from `counted_from` next time, when
  the CLI will count on from another total);
- `judge(outcome)`: how a run ended, as a `Verdict` (ok, transient, window, lost_session,
  logged_out, failed);
- `announce()`: one line, said once per engine, on which login the CLI uses (by default
  the CLI and its version, the model and `login`);
- optionally `prompt(plan, text)` (what goes on stdin; a CLI that keeps a resumed
  session's first instructions is given labrun's current ones here when `plan.renewed`)
  and `recover(session_id, since)`: what a run that ended without its result was billed,
  read from the CLI's own session records, as a `Finished` (None: unknown; what the run
  streamed, if anything, then stands as estimated).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from prefect import task
from prefect.cache_policies import NO_CACHE

from labrun import prompts
from labrun.agents.cli_process import feed_stdin, read_stdout, version
from labrun.agents.cli_usage import cli_turns, current_session, cut_run, known_tools, record_result
from labrun.agents.registry import AgentUnavailable
from labrun.journal import CliEvent, CliSessionRecord, Conversation, ReplyRecord, UserRecord
from labrun.mcp_tools import ToolCall, ToolServer, run_call
from labrun.model import FatalModelError, TransientModelError, UsageWindowSpent
from labrun.prices import cost_usd
from labrun.egress import EgressProxy
from labrun.sandbox import Lifeline, Sandbox, Secrets, bubblewrap, kill_tree, pid_namespaces, spawn
from labrun.secrets import declared, is_secret_name, redact
from labrun.settings import settings
from labrun.tools import ToolBox, ToolResult
from labrun.turns import RETRY_POLICY, PhaseStopped, back_off
from labrun.usage import Budget, BudgetSpent, Usage
from labrun.windows import clock
from labrun.workspace import write_atomic

log = logging.getLogger("labrun")

MAX_FAILED_RUNS = 3


class CliFailed(FatalModelError):
    """The CLI kept failing; the message gives its last error."""


class PhaseTimeout(PhaseStopped):
    pass


# -- what a backend reads from its CLI's events ----------------------------------------------


@dataclass
class Started:
    """The CLI's session began (or was resumed)."""

    session_id: str | None
    tools: list[str] | None = None
    problem: str | None = None
    """Something to warn about (an MCP server that did not connect)."""


@dataclass
class Streamed:
    """An assistant message, with its usage so far (tokens only)."""

    message_id: str
    model: str
    usage: Usage


@dataclass
class ToolUsed:
    name: str


def shorten(command: Any, width: int = 80) -> str:
    """A shell command as one short line for the terminal (a CLI's `sh -lc '…'` unwrapped)."""
    text = str(command or "?")
    if m := re.match(r"^/bin/(?:ba)?sh -lc '(.*)'$", text, re.S):
        text = m.group(1)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


@dataclass
class Retrying:
    """The CLI retries an API call itself."""

    attempt: int | None
    max_retries: int | None
    delay_s: float | None
    status: int | None
    error: str = ""


@dataclass
class Window:
    """The usage window: status "allowed", "warning" or "rejected"."""

    status: str
    resets_at: float | None
    kind: str = "usage"


@dataclass
class Finished:
    """The run's result: its own tokens, and the session's running cost when the CLI
    reports one (None: labrun prices the tokens)."""

    session_id: str | None
    usage: Usage
    total_cost_usd: float | None
    turns: int
    subtype: str | None
    is_error: bool
    model: str | None = None
    event: dict[str, Any] = field(default_factory=dict)
    """The CLI's own result event, for its backend's `judge`."""
    usage_total: bool = False
    """`usage` is the session's running total (tokens), not this run's: the run used the
    change since the session's last total."""
    counted_from: Usage | None = None
    """The running total the session's next result counts from, when it is not `usage` (a
    CLI killed mid-run restores a total that misses what it billed last)."""


@dataclass
class Outcome:
    """How one run ended."""

    finished: Finished | None = None
    rejected: Window | None = None
    retries: list[Retrying] = field(default_factory=list)
    stopped: str | None = None
    """"timeout", "completed", "budget" or "engine" when labrun stopped the process."""
    session_id: str | None = None
    exit_code: int | None = None
    stderr: str = ""


@dataclass
class Verdict:
    kind: str
    """ok (ended normally, complete or not), transient, window, lost_session, logged_out,
    unusable (the CLI cannot run: too old, misconfigured) or failed."""
    message: str = ""
    resets_at: float | None = None


@dataclass
class RunPlan:
    system_file: Path
    mcp_config: Path | None
    session_id: str | None
    turns_left: int
    timeout_s: float = 0.0
    """What is left of the phase's timeout when the run is planned."""
    workspace: Path | None = None
    server: ToolServer | None = None
    """labrun's MCP tool server (its `socket`, which the CLI's relay reaches)."""
    renewed: bool = False
    """The session is resumed by an engine that rendered the phase's system prompt anew
    (the STATE.md digest as it is now), and this is that engine's first run of it."""
    web: bool = False
    """The phase offers the CLI's own web search and fetch tools (`Phase.web`)."""
    sandbox: Sandbox | None = None
    """The session's sandbox of agent commands, for a CLI that runs inside it."""
    lifeline: int | None = None
    """For a CLI run inside the sandbox: the read end of its lifeline (`Sandbox.wrap`)."""
    secrets: Secrets | None = None
    """For a CLI run inside the sandbox: its environment's secrets, for it alone (`argv` hands
    them over)."""


# -- the base ---------------------------------------------------------------------------------


def installed(exe: str, missing: str) -> str:
    """The path of the CLI that `exe` names; else AgentUnavailable, saying `missing` (how to
    install it, with `{exe}`)."""
    found = shutil.which(exe)
    if found is None:
        raise AgentUnavailable(missing.format(exe=exe))
    return found


class CliAgent:
    name = "cli"
    product = "the CLI"
    """The CLI's name, as the announcement says it."""
    tools_note = ""
    announced = False
    confines = "run as the CLI confines them"
    """What confines the commands the CLI runs itself, in a few words (said once, at the start)."""
    own_network = False
    """The CLI confines its commands itself, but not their network: labrun runs it in a network
    namespace of its own whose one way out is the session's egress proxy (`egress`)."""
    in_sandbox = False
    """The CLI runs inside the session's sandbox (`argv` wraps it with `plan.sandbox` and
    `plan.lifeline`, given when bubblewrap works here)."""

    def __init__(self, executable: str, model: str | None, workspace: str | Path | None):
        self.executable = executable
        self.model = model
        self.workspace = workspace
        self.warned_network = False
        self.known_tools: list[str] | None = None

    # what a backend gives

    def homes(self) -> tuple[Path, ...]:
        """What the CLI itself writes outside the workspace (its configuration, logins and
        sessions): writable in the namespace of labrun's it runs in (`labrun.sandbox.guarded`),
        with what `LABRUN_CLI_WRITABLE` names (paths separated by `:`)."""
        return ()

    def sandbox(self, session, proxy: Path | None = None) -> Sandbox:
        """The session's sandbox, with the CLI's own homes writable; for a CLI that runs
        inside it or in a network namespace of labrun's, with the network, which the CLI
        needs (its API) whatever the session says, through `proxy`, its own (`own_proxy`)."""
        sandbox = session.confinement.sandbox()
        extra = [Path(p) for p in settings().cli_writable.split(os.pathsep) if p.strip()]
        homes = [h for h in (*self.homes(), *extra) if h.exists()]
        sandbox = replace(sandbox, writable=(*sandbox.writable, *homes))
        if (self.in_sandbox or self.own_network) and not sandbox.network and not self.warned_network:
            log.warning("%s runs inside the sandbox and needs the network (its API), so its shell commands keep "
                        "it despite --no-network", self.name)
            self.warned_network = True
        if proxy is not None:
            sandbox = replace(sandbox, network=True, egress=proxy)
        return sandbox

    def own_proxy(self, session, stack: ExitStack) -> Path | None:
        """For a CLI in a network namespace of labrun's: an egress proxy of its own, which
        lets its model API through whatever its address (a gateway or a test's API on the
        loopback), gone when `stack` closes. The session's commands never get this one: theirs
        reaches global addresses alone."""
        if not (self.in_sandbox or self.own_network) or bubblewrap() is None:
            return None
        proxy = EgressProxy(session.idea.constraints.allowed_domains, endpoints=[self.api_url()])
        stack.callback(proxy.stop)
        return proxy.start()

    def egress(self, plan: RunPlan) -> Path | None:
        """For a CLI of `own_network`: the egress proxy's socket, when bubblewrap can give it
        the namespaces (else it runs on the machine's network, as it would alone)."""
        if self.own_network and plan.sandbox is not None and bubblewrap() is not None:
            return plan.sandbox.egress
        return None

    def api_url(self) -> str:
        """Where the CLI sends its model requests: the endpoint the egress proxy lets a CLI in
        a network namespace of labrun's reach, loopback or not."""
        raise NotImplementedError

    def argv(self, plan: RunPlan) -> list[str]:
        raise NotImplementedError

    def environment(self, plan: RunPlan) -> dict[str, str]:
        raise NotImplementedError

    def read(self, event: dict[str, Any]) -> Iterable[Any]:
        raise NotImplementedError

    def judge(self, out: Outcome) -> Verdict:
        raise NotImplementedError

    def announce(self) -> str:
        return f"{self.name}: {self.version_said()} ({self.executable}); model {self.model}; login: {self.login}"

    def version_said(self) -> str:
        """The CLI and its version as the announcement names them."""
        return version(self.executable) or f"{self.product} (version unknown)"

    def needs_namespace(self, env: dict[str, str]) -> bool:
        """Whether runs need labrun's PID namespace to end all they start (a CLI whose own
        sandbox ends its commands' processes, and cannot nest in one, says no)."""
        return True

    def prompt(self, plan: RunPlan, text: str) -> str:
        return text

    def recover(self, session_id: str | None, since: float) -> Finished | None:
        return None

    def write_mcp_config(self, server: ToolServer, phase_dir: Path) -> Path | None:
        path = phase_dir / f"{self.name}-mcp.json"
        write_atomic(path, json.dumps(server.mcp_config(), indent=2))
        return path

    def system_text(self, toolbox: ToolBox, convo: Conversation, system: str) -> str:
        """The phase's system prompt for this engine's runs: as the phase began, or, when a
        phase already run resumes, rendered again with the STATE.md digest as it is now."""
        if convo.of(CliSessionRecord):
            system = prompts.phase_system_prompt(toolbox.session, toolbox.phase.key)
        note = prompts.env.get_template(self.tools_note).render() if self.tools_note else ""
        return system.rstrip() + "\n\n" + note + "\n"

    # the phase

    def run_phase(self, toolbox: ToolBox, convo: Conversation, system: str, max_turns: int,
                  budget: Budget) -> None:
        phase, root = toolbox.phase.key, toolbox.root
        phase_dir = convo.path.parent
        order = list(toolbox.session.state.phases)
        if not CliAgent.announced and (said := self.announce()):
            log.info("%s", said)
            log.info("%s: its own commands %s; run_experiment runs in labrun's sandbox", self.name, self.confines)
            CliAgent.announced = True
        system_file = phase_dir / f"{self.name}-system-prompt.md"
        toolbox.session.ws.write(system_file, self.system_text(toolbox, convo, system))
        timeout = settings().phase_timeout_s
        deadline = time.monotonic() + timeout
        close_orphaned_transcript(phase_dir, self.name)
        if (cut := cut_run(convo)) is not None:  # the engine died in it: what the CLI recorded
            self.settle(convo, budget, *cut)
        self.known_tools = known_tools(convo) or self.known_tools
        inbox: queue.Queue = queue.Queue()
        failures = 0
        renew = True
        with ToolServer(inbox) as server, ExitStack() as stack:
            proxy = self.own_proxy(toolbox.session, stack)
            mcp_config = self.write_mcp_config(server, phase_dir)
            while toolbox.completed is None:
                turns = cli_turns(convo)
                if turns >= max_turns:
                    raise PhaseStopped(
                        f"phase {phase} reached its limit of {max_turns} turns; raise it with "
                        f"`labrun resume {root} --max-turns {max_turns * 2}`")
                budget.check()
                toolbox.session.ws.check_disk()
                if not pending_texts(convo):
                    convo.add_user_text(prompts.nudge(phase, "; ".join(toolbox.missing()), order))
                session_id = current_session(convo)
                plan = RunPlan(system_file, mcp_config, session_id, max_turns - turns,
                               timeout_s=deadline - time.monotonic(), workspace=root, server=server,
                               renewed=renew and session_id is not None, web=toolbox.phase.web,
                               sandbox=self.sandbox(toolbox.session, proxy))
                renew = False
                out, verdict = agent_run(self, toolbox, convo, inbox, plan, budget, deadline,
                                         phase=phase, number=len(transcripts(phase_dir, self.name)) + 1)
                if toolbox.completed is not None:
                    break
                if out.stopped == "timeout":
                    raise PhaseTimeout(f"it ran past its timeout of {timeout:g} s and {self.name} was "
                                       "stopped; a resume continues the same session")
                if out.stopped == "budget":
                    budget.check()
                if verdict.kind == "ok":
                    failures = 0
                elif verdict.kind == "window":
                    raise UsageWindowSpent(verdict.message, resets_at=verdict.resets_at or time.time())
                elif verdict.kind == "lost_session":
                    log.warning("%s: %s has no session %s here; starting a new one", phase, self.name, plan.session_id)
                    convo.append(CliSessionRecord(session_id=None, note=verdict.message[:300]))
                    convo.add_user_text(prompts.resume_note(phase, [], order))
                elif verdict.kind in ("logged_out", "unusable"):
                    raise AgentUnavailable(verdict.message)
                else:
                    failures += 1
                    log.warning("%s: %s run failed: %s", phase, self.name, verdict.message)
                    if failures >= MAX_FAILED_RUNS:
                        raise CliFailed(f"{self.name} failed {failures} times in a row; the last: {verdict.message}")
                    convo.add_user_text(prompts.resume_note(phase, [], order))

    # one run

    def run_once(self, toolbox: ToolBox, convo: Conversation, inbox: queue.Queue, plan: RunPlan,
                 budget: Budget, deadline: float) -> Outcome:
        phase, phase_dir = toolbox.phase.key, convo.path.parent
        prompt = self.prompt(plan, next_prompt(convo, phase, plan.session_id, list(toolbox.session.state.phases)))
        n, transcript = new_transcript(phase_dir, self.name)
        resume = f"resuming session {plan.session_id}" if plan.session_id else "new session"
        started_at = time.time()
        convo.append(ReplyRecord(stop_reason=None, usage=Usage(),
                                 content=[{"type": "text", "text": f"[{self.name} run {n}: {resume}]"}],
                                 cli=CliEvent(run=n, event="start", resume=plan.session_id, transcript=transcript.name,
                                              at=started_at)))
        log.info("%s · %s run %d · %s", phase, self.name, n, resume)
        out = Outcome()
        stderr_path = transcript.with_suffix(".stderr")
        env = self.environment(plan)
        sandboxed = self.in_sandbox and plan.sandbox is not None and bubblewrap() is not None
        egress = self.egress(plan)
        # What the CLI and its commands may not change or see, kept by a namespace of labrun's:
        # one it gets anyway, or, for a sealed evaluation's files, one it must get.
        guard = plan.sandbox if plan.sandbox is not None and not sandboxed else None
        if guard is not None and plan.server is not None:  # its relay's way to the engine, under /tmp
            guard = replace(guard, shown=(*guard.shown, (plan.server.socket, plan.server.socket)))
        namespace = (self.needs_namespace(env) and pid_namespaces()) or bool(
            guard and guard.hidden and egress is None and bubblewrap())
        lifeline = Lifeline() if namespace or sandboxed or egress else None
        secrets = Secrets({k: env.pop(k) for k in list(env) if k in declared or is_secret_name(k)}) if sandboxed else None
        argv = self.argv(replace(plan, lifeline=lifeline.fd, secrets=secrets) if sandboxed else plan)
        # The run's one connection to labrun's tools: its relay's, taken before its model's first turn.
        tools = ExitStack()
        if plan.server is not None:
            tools.enter_context(plan.server.listening())
        try:
            with open(stderr_path, "wb") as stderr:
                proc = spawn(argv, cwd=toolbox.root, env=env, stderr=stderr, namespace=namespace, lifeline=lifeline,
                             keep=(secrets.fd,) if secrets else (), egress=egress, guard=guard)
        except BaseException:
            tools.close()
            raise
        finally:
            if secrets:
                secrets.close()
        write_line(transcript, {"type": "labrun", "event": "start", "run": n, "at": _now(),
                                "argv": [redact(a) for a in argv],
                                "prompt": redact(prompt), "pid": proc.pid, "engine_pid": os.getpid()})
        threading.Thread(target=feed_stdin, args=(proc, prompt), daemon=True).start()
        threading.Thread(target=read_stdout, args=(proc, transcript, inbox), daemon=True).start()

        def stop(why: str) -> None:
            if out.stopped is None and proc.poll() is None:
                out.stopped = why
                kill_tree(proc)

        timers = [threading.Timer(max(0.0, deadline - time.monotonic()), stop, ["timeout"])]
        timers[0].start()
        calls = 0
        streamed: dict[str, Usage] = {}
        try:
            while True:
                try:
                    kind, item = inbox.get(timeout=1.0)
                except queue.Empty:
                    if proc.poll() is not None:  # exited, yet something holds its stdout open
                        kill_tree(proc)
                    continue
                if kind == "eof":
                    break
                if kind == "tool":
                    calls += 1
                    self.serve(toolbox, convo, item, f"{self.name}-{n}-{calls}")
                    if toolbox.completed is not None and len(timers) == 1:
                        grace = settings().cli_grace_s
                        timers.append(threading.Timer(grace, stop, ["completed"]))
                        timers[-1].start()
                    continue
                for happening in self.read(item):
                    self.note(happening, toolbox, convo, budget, out, streamed, n, stop)
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
            kill_tree(proc)  # nothing it started outlives it
            tools.close()
            if lifeline:
                lifeline.cut()
        stderr_text = stderr_path.read_text(errors="replace")
        if redact(stderr_text) != stderr_text:
            stderr_path.write_text(redact(stderr_text))
        out.stderr = redact(stderr_text[-2000:])
        if out.finished is None and self.settle(convo, budget, n, out.session_id or plan.session_id, started_at):
            note = "billed as the CLI's own session records say"
        elif out.finished is not None:
            note = "billed as its result says"
        else:
            why = {"timeout": "killed at the phase timeout", "completed": "stopped after complete_phase",
                   "budget": "stopped: the session budget is spent",
                   "engine": "stopped by the engine"}.get(out.stopped or "", f"exited with code {out.exit_code}")
            note = f"{self.name} {why} before its result: its streamed messages count as estimated usage"
        write_line(transcript, {"type": "labrun", "event": "end", "run": n, "at": _now(),
                                "exit_code": out.exit_code, "stopped": out.stopped, "note": note})
        return out

    def note(self, happening: Any, toolbox: ToolBox, convo: Conversation, budget: Budget, out: Outcome,
             streamed: dict[str, Usage], n: int, stop) -> None:
        """Act on one thing the CLI reported."""
        phase = toolbox.phase.key
        if isinstance(happening, Started):
            out.session_id = happening.session_id
            record = CliSessionRecord(run=n, session_id=happening.session_id)
            if happening.tools is not None:
                record.tools = happening.tools
                self.known_tools = happening.tools
            convo.append(record)
            if happening.problem:
                log.warning("%s: %s", phase, happening.problem)
        elif isinstance(happening, Streamed):
            if happening.message_id in streamed:
                return  # the same message again, one event per content block
            estimate = happening.usage.model_copy()
            estimate.cost_usd = estimate.estimated_usd = cost_usd(happening.model, estimate)
            streamed[happening.message_id] = estimate
            convo.append(ReplyRecord(stop_reason=None, usage=estimate,
                                     content=[{"type": "text", "text": f"[{self.name} message {happening.message_id}]"}],
                                     cli=CliEvent(run=n, event="message", id=happening.message_id, model=happening.model)))
            budget.spend(estimate)
            try:
                budget.check()
            except BudgetSpent:
                stop("budget")
        elif isinstance(happening, ToolUsed):
            log.info("%s · %s run %d · %s", phase, self.name, n, happening.name)
        elif isinstance(happening, Retrying):
            out.retries.append(happening)
            delay = f" in {happening.delay_s:.1f} s" if happening.delay_s is not None else ""
            of = f" of {happening.max_retries}" if happening.max_retries else ""
            log.warning("%s · %s run %d · API error %s (%s): %s retries%s, attempt %s%s", phase, self.name, n,
                        happening.status or "?", happening.error or "error", self.name, delay,
                        happening.attempt or "?", of)
        elif isinstance(happening, Window):
            if happening.status == "rejected":
                out.rejected = happening
            elif happening.status == "warning":
                log.warning("%s: usage window (%s) nearly spent; it resets at %s", phase, happening.kind,
                            clock(happening.resets_at) if happening.resets_at else "?")
        elif isinstance(happening, Finished):
            out.finished = happening
            budget.spend(record_result(convo, happening, n))

    def settle(self, convo: Conversation, budget: Budget, n: int, session_id: str | None, since: float) -> bool:
        """Run `n` ended without its result: count what the CLI's own records say it was
        billed, if they say. True when they did."""
        found = self.recover(session_id, since)
        if found is None:
            return False
        budget.spend(record_result(convo, found, n))
        return True

    def serve(self, toolbox: ToolBox, convo: Conversation, call: ToolCall, call_id: str) -> None:
        """One MCP tool call, journaled like a model's: the call before it runs, its result
        after, so that a call cut off by a crash is answered as interrupted on resume."""

        def before(c: ToolCall) -> None:
            convo.append(ReplyRecord(stop_reason="tool_use", usage=Usage(),
                                     content=[{"type": "tool_use", "id": call_id, "name": c.name, "input": c.arguments}],
                                     cli=CliEvent(event="tool")))

        def after(c: ToolCall, result: ToolResult) -> None:
            convo.add_tool_result(call_id, c.name, result.content, result.is_error)
            log.info("%s · %s%s", toolbox.phase.key, c.name, " (error)" if result.is_error else "")

        run_call(toolbox, call, before, after)


@task(name="agent-run", task_run_name="{phase} run {number}", cache_policy=NO_CACHE, persist_result=False,
      **RETRY_POLICY)
def agent_run(agent: CliAgent, toolbox: ToolBox, convo: Conversation, inbox: queue.Queue, plan: RunPlan,
              budget: Budget, deadline: float, phase: str, number: int) -> tuple[Outcome, Verdict]:
    """One run of the CLI, retried with back-off when it ended on a transient API error (its
    own retries were spent); the retried run resumes the session with the resume note."""
    out = agent.run_once(toolbox, convo, inbox, plan, budget, deadline)
    verdict = agent.judge(out) if out.stopped is None else Verdict("ok")
    if verdict.kind == "transient" and toolbox.completed is None:
        convo.add_user_text(prompts.resume_note(phase, [], list(toolbox.session.state.phases)))
        back_off(TransientModelError(verdict.message), f"{phase} · {agent.name} run {number}")
    return out, verdict


# -- the journal -------------------------------------------------------------------------------


def pending_texts(convo: Conversation) -> list[str]:
    """User messages written since the last run started: the next run's prompt."""
    texts: list[str] = []
    for r in convo.records:
        if isinstance(r, ReplyRecord) and r.event == "start":
            texts = []
        elif isinstance(r, UserRecord):
            texts += r.texts()
    return texts


def next_prompt(convo: Conversation, phase: str, session_id: str | None, order: list[str]) -> str:
    texts = list(dict.fromkeys(pending_texts(convo)))  # a restarted phase repeats its kickoff
    if session_id is None:  # a new session starts from the kickoff
        kickoff = prompts.kickoff(phase, order)
        texts = [kickoff] + [t for t in texts if t != kickoff]
    return "\n\n".join(texts)


# -- transcripts -------------------------------------------------------------------------------


def transcripts(phase_dir: Path, name: str) -> list[Path]:
    return sorted(phase_dir.glob(f"{name}-run-*.jsonl"))


def new_transcript(phase_dir: Path, name: str) -> tuple[int, Path]:
    """The next `<name>-run-NNN.jsonl`, created here: a transcript is never overwritten."""
    phase_dir.mkdir(parents=True, exist_ok=True)
    n = len(transcripts(phase_dir, name)) + 1
    while True:
        path = phase_dir / f"{name}-run-{n:03d}.jsonl"
        try:
            with open(path, "x"):
                return n, path
        except FileExistsError:
            n += 1


def close_orphaned_transcript(phase_dir: Path, name: str) -> None:
    """A run the engine died in has no end line: say there what is known."""
    runs = transcripts(phase_dir, name)
    if not runs:
        return
    lines = runs[-1].read_text(errors="replace").splitlines()
    if lines and '"event": "end"' not in lines[-1]:
        write_line(runs[-1], {"type": "labrun", "event": "end", "at": _now(), "note":
                              "the engine stopped during this run; what it streamed before counts as "
                              "estimated usage unless its result came"})


def write_line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

"""The parser of labrun's command line (DESIGN.md, contract): every command and option, each
with its help and default, and the environment labrun reads."""

from __future__ import annotations

import argparse

from labrun import __version__
from labrun.agents import AGENTS
from labrun.cli.common import DEFAULT_AGENT, DEFAULT_MODEL
from labrun.serving import (DEFAULT_CRASH_AFTER_S, DEFAULT_HOST, DEFAULT_PORT,
                            DEFAULT_SESSION_SLOTS, SESSION_DEPLOYMENT, SESSION_QUEUE)

ENVIRONMENT = f"""\
environment:
  ANTHROPIC_API_KEY        the anthropic agent's key (or ANTHROPIC_AUTH_TOKEN)
  ANTHROPIC_BASE_URL       another endpoint for the Messages API (a proxy, a gateway)
  LABRUN_MODEL             the model when --model is not given (default {DEFAULT_MODEL})
  LABRUN_CLAUDE            the claude executable of the claude-code agent (default claude)
  LABRUN_CLAUDE_PERMISSIONS=skip   claude-code with --dangerously-skip-permissions
  LABRUN_CODEX             the codex executable of the codex agent (default codex)
  CODEX_HOME               Codex's login and sessions (default ~/.codex); CODEX_API_KEY an API key
  LABRUN_GEMINI            the gemini executable of the gemini agent (default gemini)
  GEMINI_API_KEY           the gemini agent's API key (else the Google login of `gemini`)
  LABRUN_PHASE_TIMEOUT_S   a coding-CLI phase's time limit (default: the idea's time_limit)
  LABRUN_PASS_ENV          NAME,... environment variables passed on to the agent's commands and
                           to a coding CLI itself (--pass-env: to the experiments' commands only)
  LABRUN_MIN_FREE_MB       free disk below which a session stops before its next step (100)
  LABRUN_CONTEXT_MANAGEMENT=off    no server-side context editing (anthropic agent)
  LABRUN_PRICES            a JSON file of model prices (USD per million tokens)
  LABRUN_MODEL_API_SLOTS   model calls at once over all sessions in server mode (4)
  LABRUN_SCRIPTED_FAULTS   the scripted agent's fault injection (tests)
  LABRUN_KEEP_API          minutes the Prefect API a run starts, and an engine with Prefect
                           imported, stay up for later runs once unused (default 10; 0:
                           each run starts and stops its own API and imports Prefect itself)
  PREFECT_API_URL          a Prefect server to run on; without one labrun uses the one
                           `labrun server` started, else the one an earlier run kept, or
                           starts one
  PREFECT_HOME             Prefect's database and labrun's server logs (default ~/.prefect)
"""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Every option shows its default (an unset or empty one says in its help what happens then);
    the epilog keeps its lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, "", argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


def parser() -> argparse.ArgumentParser:
    from labrun.cli import branches, reading, running, serving

    p = argparse.ArgumentParser(prog="labrun", description="Durable autonomous research sessions on Prefect.",
                                epilog=ENVIRONMENT, formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"labrun {__version__}")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, help: str, handler) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help, epilog=ENVIRONMENT, formatter_class=_Help)
        c.set_defaults(handler=handler)
        return c

    run = command("run", "start (or continue) a session for an idea", running.cmd_run)
    run.add_argument("idea", help="the idea file (YAML, NeuriCo's schema v1.1)")
    run.add_argument("--workspace", required=True, help="the session's folder (made if missing)")
    run.add_argument("--agent", choices=AGENTS, default=None,
                     help=f"who does the research (default: {DEFAULT_AGENT} for a new session; "
                     "a resumed one keeps its own)")
    run.add_argument("--model", default=None,
                     help=f"the model (default: for anthropic $LABRUN_MODEL, else {DEFAULT_MODEL}; for "
                     "claude-code, claude's own; for codex, gpt-5.5; for gemini, gemini-2.5-pro; a resumed "
                     "session keeps its own)")
    run.add_argument("--with", dest="with_phases", default="", metavar="PHASE,...",
                     help="optional phases to run besides the six research phases: resources, paper "
                     "(default: those the idea asks for)")
    run.add_argument("--paper-style", default=None, metavar="STYLE",
                     help="the paper phase's LaTeX style: plain (default), neurips, icml, acl or ams")
    _limits(run)
    _verbose(run)

    resume = command("resume", "continue a session; finished phases are skipped", running.cmd_resume)
    resume.add_argument("workspace", help="the session's folder")
    resume.add_argument("--model", default=None,
                        help="the model of the phases still to run (default: the session's)")
    _limits(resume)
    _verbose(resume)

    status = command("status", "phases, attempts, tokens and cost", reading.cmd_status)
    status.add_argument("workspace", help="the session's folder")
    status.add_argument("--json", action="store_true", help="one JSON object (DESIGN.md) instead of tables")
    status.add_argument("--branch", type=int, default=None, metavar="N",
                        help="one branch as it stood (`labrun branches` lists them; default: the current one)")

    state = command("state", "print STATE.md", reading.cmd_state)
    state.add_argument("workspace", help="the session's folder")

    check = command("check", "validate an idea file: exit 0, or 2 with the reasons", reading.cmd_check)
    check.add_argument("idea", help="the idea file")

    demo = command("demo", "the whole flow offline, with the scripted agent", running.cmd_demo)
    demo.add_argument("workspace", nargs="?", default="labrun-demo", help="the demo session's folder")
    _verbose(demo)

    server = command("server", "a local Prefect server and a worker for the labrun pool", serving.cmd_server)
    server.add_argument("--host", default=DEFAULT_HOST, help="address the server listens on")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the API and the UI")
    server.add_argument("--sessions", type=int, default=DEFAULT_SESSION_SLOTS,
                        help=f"sessions that run at once (the {SESSION_QUEUE} work queue's limit)")
    server.add_argument("--model-api-slots", type=int, default=None,
                        help="model calls at once over all sessions, the labrun-model-api limit "
                        "(default: an existing limit is kept; a new one is $LABRUN_MODEL_API_SLOTS or 4)")
    server.add_argument("--crash-after", type=int, default=DEFAULT_CRASH_AFTER_S, metavar="SECONDS",
                        help="mark a run Crashed after this long without a heartbeat")
    server.add_argument("--no-worker", action="store_true", help="start the server only")

    rerun = command("rerun", "run a finished session again from a phase, as a new branch",
                    branches.cmd_rerun)
    rerun.add_argument("workspace", help="the session's folder")
    rerun.add_argument("--from", dest="from_phase", required=True, metavar="PHASE",
                       help="the first phase to run again; the earlier ones are reused")
    rerun.add_argument("--agent", choices=AGENTS, default=None, help="the new branch's agent (default: the session's)")
    rerun.add_argument("--model", default=None, help="the new branch's model (default: the session's)")
    rerun.add_argument("--note", default="", help="why this branch, shown by `labrun branches` (default: none)")
    _limits(rerun)
    _verbose(rerun)

    listing = command("branches", "a session's branches: start phase, model, time, cost, note",
                      branches.cmd_branches)
    listing.add_argument("workspace", help="the session's folder")
    listing.add_argument("--json", action="store_true", help="one JSON list instead of a table")

    diff = command("diff", "two branches' metrics and key outputs, side by side", branches.cmd_diff)
    diff.add_argument("workspace", help="the session's folder")
    diff.add_argument("a", type=int, metavar="A", help="a branch number")
    diff.add_argument("b", type=int, metavar="B", help="another branch number")
    diff.add_argument("--json", action="store_true", help="one JSON object instead of tables")

    queue = command("queue", "submit one session run per idea to the server", serving.cmd_queue)
    queue.add_argument("ideas", nargs="+", metavar="IDEA|DIR", help="idea files, or folders of them")
    queue.add_argument("--agent", choices=AGENTS, default=None,
                       help=f"the agent of new sessions (default: {DEFAULT_AGENT}; a resumed session keeps its own)")
    queue.add_argument("--model", default=None, help="the model of new sessions (default: the agent's own)")
    queue.add_argument("--workspaces", default="workspaces", metavar="ROOT",
                       help="one workspace per idea is made under ROOT")
    queue.add_argument("--with", dest="with_phases", default="", metavar="PHASE,...",
                       help="optional phases each new session runs too: resources, paper "
                       "(default: those each idea asks for)")
    queue.add_argument("--paper-style", default=None, metavar="STYLE",
                       help="the paper phase's LaTeX style: plain (default), neurips, icml, acl or ams")
    queue.add_argument("--deployment", default=SESSION_DEPLOYMENT, help="the session deployment to run")
    _pass_env(queue)
    return p


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-usd", type=float, default=None,
                   help="the agent's own budget in USD, for its model use (default: the idea's "
                        "constraints.agent_budget, else none; constraints.budget is the experiments')")
    p.add_argument("--max-turns", type=int, default=None,
                   help="turn limit of every phase (default: each phase's own, 30 to 60)")
    p.add_argument("--no-network", dest="network", action="store_const", const=False, default=None,
                   help="run the agent's commands without network (default: as the session and "
                   "the idea's constraints.network say)")
    _pass_env(p)


def _pass_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pass-env", action="append", default=None, metavar="NAME",
                   help="an environment variable (an API key) for the experiments' commands only; "
                   "repeat it for more; the session keeps the names (default: the idea's "
                   "constraints.api_keys alone)")


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="show Prefect's own log lines too")


"""The parser of labrun's command line: every command and option, each
with its help and default, and the environment labrun reads."""

from __future__ import annotations

import argparse
import textwrap

from labrun import __version__, suggest
from labrun.agents.registry import BACKENDS, DEFAULT_AGENT, names
from labrun.serving import (DEFAULT_CRASH_AFTER_S, DEFAULT_HOST, DEFAULT_PORT,
                            DEFAULT_SESSION_SLOTS, SESSION_DEPLOYMENT, SESSION_QUEUE)
from labrun.settings import described

OTHER_VARIABLES = {
    **{name: line for b in BACKENDS.values() for name, line in b.variables.items() if line},
    "PREFECT_API_URL": "a Prefect server to run on; without one labrun uses the one `labrun server` "
                       "started, else starts one for the run alone",
    "PREFECT_HOME": "Prefect's database and labrun's server logs (default ~/.prefect)",
}
"""The variables of other programs that labrun reads (the agent backends' from their registry
entries); its own (LABRUN_*) are `labrun.settings`'."""
AGENT_VARIABLES = (*(name for b in BACKENDS.values() for name in b.variables),
                   "LABRUN_PHASE_TIMEOUT_S", "LABRUN_PASS_ENV", "LABRUN_MIN_FREE_MB", "LABRUN_PRICES")
ENGINE_VARIABLES = ("PREFECT_API_URL", "PREFECT_HOME")
LABRUN_VARIABLES = described()
"""labrun's own variables (`labrun.settings`), each with its field's docstring."""
VARIABLES = {name: OTHER_VARIABLES.get(name) or LABRUN_VARIABLES[name]
             for name in (*AGENT_VARIABLES, "LABRUN_MODEL_API_SLOTS", *ENGINE_VARIABLES)}
"""The variables `--help` names, each with its line of help (a LABRUN_* one's is its field's
docstring); each command's help lists those it reads."""


def environment(names=tuple(VARIABLES), after: str = "") -> str | None:
    """The epilog of a command that reads `names`."""
    if not names:
        return None
    width = max(len(n) for n in names) + 2
    lines = [textwrap.fill(VARIABLES[n], 92, initial_indent="  " + n.ljust(width),
                           subsequent_indent=" " * (width + 2)) for n in names]
    return "\n".join(["environment:", *lines, *([after] if after else [])]) + "\n"


class _Help(argparse.RawDescriptionHelpFormatter):
    """Every option shows its default (an unset or empty one says in its help what happens then);
    the epilog keeps its lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, "", argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


def parser() -> argparse.ArgumentParser:
    from labrun.cli import branches, reading, review, running, serving, study
    from labrun.cli.examples import cmd_examples

    p = argparse.ArgumentParser(prog="labrun", description="Durable autonomous research sessions on Prefect.",
                                epilog=environment(), formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"labrun {__version__}")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, help: str, handler, reads=(), after: str = "") -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help, epilog=environment(reads, after),
                           formatter_class=_Help)
        c.set_defaults(handler=handler)
        return c

    run = command("run", "start (or continue) a session for an idea", running.cmd_run,
                  AGENT_VARIABLES + ENGINE_VARIABLES)
    run.add_argument("idea", help="the idea file (YAML, NeuriCo's schema v1.1)")
    run.add_argument("--workspace", required=True, help="the session's folder (made if missing)")
    run.add_argument("--agent", type=_agent, metavar="AGENT", default=None,
                     help=f"who does the research: {', '.join(names())} (default: {DEFAULT_AGENT} for a new "
                     "session; a resumed one keeps its own)")
    run.add_argument("--model", default=None,
                     help=f"the model (default: {_default_models()}; a resumed session keeps its own)")
    _optional_phases(run, "to run besides the six research phases", "those the idea asks for")
    _review_after(run)
    _experiments_pool(run)
    _limits(run)
    _verbose(run)

    resume = command("resume", "continue a session; finished phases are skipped", running.cmd_resume,
                     AGENT_VARIABLES + ENGINE_VARIABLES)
    resume.add_argument("workspace", help="the session's folder")
    resume.add_argument("--model", default=None,
                        help="the model of the phases still to run (default: the session's)")
    _review_after(resume)
    _experiments_pool(resume)
    _limits(resume)
    _verbose(resume)

    review_cmd = command("review", "show a phase that awaits review, and approve, revise or stop it",
                         review.cmd_review, AGENT_VARIABLES + ENGINE_VARIABLES)
    review_cmd.add_argument("workspace", help="the session's folder")
    decide = review_cmd.add_argument_group("the decision (without one, the phase's outputs are shown)")
    decide.add_argument("--approve", action="store_true", help="go on to the next phase")
    decide.add_argument("--comment", default=None, metavar="TEXT",
                        help="with --approve: a note every later phase's prompt shows")
    decide.add_argument("--revise", default=None, metavar="TEXT",
                        help="send the phase back to the agent with TEXT; it is reviewed again")
    decide.add_argument("--stop", action="store_true", help="end the session here")
    _verbose(review_cmd)

    status = command("status", "phases, attempts, tokens and cost", reading.cmd_status)
    status.add_argument("workspace", help="the session's folder")
    status.add_argument("--json", action="store_true",
                        help="one JSON object instead of tables (its fields: docs/design.md, status --json)")
    status.add_argument("--branch", type=int, default=None, metavar="N",
                        help="one branch as it stood (`labrun branches` lists them; default: the current one)")

    state = command("state", "print STATE.md", reading.cmd_state)
    state.add_argument("workspace", help="the session's folder")

    results = command("results", "a table of the sessions under a folder: state, criteria met, reproduced, "
                      "cost, key results", study.cmd_results)
    results.add_argument("folder", help="the folder of the sessions' workspaces (`labrun queue --workspaces`)")
    machine = results.add_mutually_exclusive_group()
    machine.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    machine.add_argument("--csv", action="store_true", help="CSV, one line per session, instead of a table")

    export = command("export", "bundle a session's study (code, results, figures, report, STATE.md, "
                     "environment file, idea) as a .tar.gz to share", study.cmd_export)
    export.add_argument("workspace", help="the session's folder")
    export.add_argument("--to", default=None, metavar="FILE.tar.gz",
                        help="the bundle to write, never overwritten (default: the workspace's name "
                        "with .tar.gz, in this folder)")

    check = command("check", "validate an idea file: exit 0, or 2 with the reasons", reading.cmd_check)
    check.add_argument("idea", help="the idea file")
    check.add_argument("--strict", action="store_true",
                       help="the file's warnings (an unknown or duplicate key, an unknown domain) are errors: exit 2")

    examples = command("examples", "copy the bundled example ideas to a folder", cmd_examples)
    examples.add_argument("folder", nargs="?", default=".", help="where to copy them (made if missing)")

    demo = command("demo", "the whole flow offline, with the scripted agent", running.cmd_demo,
                   ("LABRUN_MIN_FREE_MB", *ENGINE_VARIABLES))
    demo.add_argument("workspace", nargs="?", default="labrun-demo", help="the demo session's folder")
    _verbose(demo)

    server = command("server", "a local Prefect server and a worker for the labrun pool", serving.cmd_server,
                     ("LABRUN_MODEL_API_SLOTS", "PREFECT_HOME"),
                     "  and, for the sessions its worker runs, those of `labrun run --help`")
    server.add_argument("--host", default=DEFAULT_HOST, help="address the server listens on")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help="port of the API and the UI")
    server.add_argument("--sessions", type=int, default=DEFAULT_SESSION_SLOTS,
                        help=f"sessions that run at once (the {SESSION_QUEUE} work queue's limit)")
    server.add_argument("--model-api-slots", type=int, default=None,
                        help="model calls at once over all sessions, the labrun-model-api limit "
                        "(default: an existing limit is kept; a new one is $LABRUN_MODEL_API_SLOTS or 4)")
    server.add_argument("--crash-after", type=int, default=DEFAULT_CRASH_AFTER_S, metavar="SECONDS",
                        help="mark a run Crashed after this long without a heartbeat")
    server.add_argument("--notify", metavar="URL", help="post a JSON message ({subject, body}) to this webhook "
                        "when a session completes, fails or awaits review (a Prefect automation; kept until changed)")
    server.add_argument("--no-worker", action="store_true", help="start the server only")

    rerun = command("rerun", "run a finished session again from a phase, as a new branch",
                    branches.cmd_rerun, AGENT_VARIABLES + ENGINE_VARIABLES)
    rerun.add_argument("workspace", help="the session's folder")
    rerun.add_argument("--from", dest="from_phase", required=True, metavar="PHASE",
                       help="the first phase to run again, one of the session's: "
                       f"{', '.join(_phase_order())}; the earlier ones are reused")
    rerun.add_argument("--agent", type=_agent, metavar="AGENT", default=None,
                       help=f"the new branch's agent: {', '.join(names())} (default: the session's)")
    rerun.add_argument("--model", default=None, help="the new branch's model (default: the session's)")
    rerun.add_argument("--note", default="", help="why this branch, shown by `labrun branches`, and a note "
                       "for the prompts of the phases it runs (default: none)")
    _review_after(rerun)
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

    queue = command("queue", "submit one session run per idea to the server", serving.cmd_queue,
                    ("PREFECT_API_URL", "PREFECT_HOME"))
    queue.add_argument("ideas", nargs="+", metavar="IDEA|DIR", help="idea files, or folders of them")
    queue.add_argument("--agent", type=_agent, metavar="AGENT", default=None,
                       help=f"the agent of new sessions: {', '.join(names())} (default: {DEFAULT_AGENT}; a resumed "
                       "session keeps its own)")
    queue.add_argument("--model", default=None, help="the model of new sessions (default: the agent's own)")
    queue.add_argument("--workspaces", default="workspaces", metavar="ROOT",
                       help="one workspace per idea is made under ROOT")
    _optional_phases(queue, "each new session runs too", "those each idea asks for")
    _review_after(queue)
    queue.add_argument("--deployment", default=SESSION_DEPLOYMENT, help="the session deployment to run")
    _pass_env(queue)
    _experiments_pool(queue)
    return p


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-usd", type=_at_least(0, float), default=None,
                   help="the agent's own budget in USD, for its model use (default: the idea's "
                        "constraints.agent_budget, else none; constraints.budget is the experiments')")
    p.add_argument("--max-turns", type=_at_least(1, int), default=None,
                   help="turn limit of every phase (default: each phase's own, 30 to 60)")
    p.add_argument("--parallel-attempts", type=_at_least(1, int), default=None, metavar="N",
                   help="experiment attempts that may run at once (default: the idea's "
                        "constraints.parallel_attempts, else 4; never more than the CPUs)")
    p.add_argument("--no-network", dest="network", action="store_const", const=False, default=None,
                   help="run the agent's commands without network (default: as the session and "
                   "the idea's constraints.network say)")
    _pass_env(p)


def _optional_phases(p: argparse.ArgumentParser, which: str, default: str) -> None:
    p.add_argument("--with", dest="with_phases", default="", metavar="PHASE,...",
                   help=f"optional phases {which}: resources, paper (default: {default})")
    p.add_argument("--paper-style", default=None, metavar="STYLE",
                   help="the paper phase's LaTeX style: plain (default), neurips, icml, acl or ams")


def _review_after(p: argparse.ArgumentParser) -> None:
    p.add_argument("--review-after", default=None, metavar="PHASE,...",
                   help="phases a person reviews once they complete, before the session goes on "
                   "(`labrun review`); a resumed session keeps its own unless given (default: the idea's "
                   "metadata.review_after, else none)")


def _experiments_pool(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiments-pool", default=None, metavar="POOL",
                   help="run every experiment attempt as a flow run of its own on this Prefect work pool "
                   "(its workers see the workspace's path, or get its files through --experiments-storage); a resumed session keeps its own (default: "
                   "the idea's constraints.experiments_pool, else where the session runs)")
    p.add_argument("--experiments-storage", default=None, metavar="URL",
                   help="with --experiments-pool whose workers cannot see the workspace: a path on storage "
                   "both sides reach, or an fsspec URL (s3://bucket/prefix), through which each attempt's files "
                   "go there and its outputs come back, by content; a resumed session keeps its own (default: "
                   "LABRUN_EXPERIMENTS_STORAGE)")


def _pass_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pass-env", action="append", default=None, metavar="NAME",
                   help="an environment variable (an API key) for the experiments' commands only; "
                   "repeat it for more; the session keeps the names (default: the idea's "
                   "constraints.api_keys alone)")


def _phase_order() -> list[str]:
    from labrun.phase_registry import BY_KEY, phase_list

    return list(phase_list(BY_KEY))  # every phase, in the order they run


def _agent(name: str) -> str:
    """An agent's name, or the near one it misses."""
    if name not in names():
        raise argparse.ArgumentTypeError(suggest.unknown("agent", name, names()))
    return name


def _default_models() -> str:
    """Each backend's model when `--model` names none, as its registry entry says."""
    said = []
    for b in BACKENDS.values():
        if b.stand_in:
            continue  # plays no model
        model = f"$LABRUN_MODEL, else {b.default_model}" if b.model_variable else b.default_model or "its own"
        said.append(f"for {b.name}, {model}")
    return "; ".join(said)


def _at_least(low, kind):
    """`kind` (int or float), refused below `low`: a negative budget, no turns."""
    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"{text}: must be {low} or more")
        return value
    return check


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="show Prefect's own log lines too")


"""Where labrun's tokens go: per-phase prompts, the prompt cache, and interruptions.

Runs real `labrun` sessions (agent `anthropic`, the real SDK) against the fake Messages API
of `tests/fake_messages_api.py` with its prompt-cache accounting on, the model's part played
by `tests/auto_responder.py`. No real API is called and nothing is paid; the dollar figures
are what the same usage would cost at the list price of labrun's default model.

Prints three tables, all measured in this one run:

1. input tokens of each phase's prompt (system + tools) against one prompt that holds all six
   phases' instructions, as NeuriCo's single session prompt does;
2. the share of prompt tokens read from the cache over a whole session, phase by phase;
3. the tokens spent again when a session is killed (`kill -9`) in the middle of each phase
   and resumed, against restarting from the first phase (NeuriCo's behaviour).

    python bench/tokens.py [--jobs 3]

Token counts are the fake server's: ceil(len(JSON of a block) / 4), per prompt block.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


def prepare_environment(tmp: Path) -> None:
    """A throwaway Prefect home and fast retries; set before Prefect is imported."""
    os.environ["PREFECT_HOME"] = str(tmp / "prefect")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ["LABRUN_RETRY_BASE_S"] = "0.05"
    os.environ["ANTHROPIC_API_KEY"] = "bench-key"
    for name in ("PREFECT_API_URL", "ANTHROPIC_AUTH_TOKEN", "LABRUN_MODEL", "LABRUN_PRICES",
                 "LABRUN_CONTEXT_MANAGEMENT"):
        os.environ.pop(name, None)


# -- running sessions -------------------------------------------------------------------------


@dataclass
class Run:
    """One session against its own fake server (so its own prompt cache)."""

    api: object
    workspace: Path
    killed_at: int | None = None
    """Requests billed before the kill."""

    def billed(self, since: int = 0) -> dict[str, int]:
        total = dict.fromkeys(FIELDS, 0)
        for b in self.api.billed[since:]:
            for f in FIELDS:
                total[f] += b["usage"][f]
        return total


def labrun(args: list[str], api_url: str, check: bool = True, wait: bool = True):
    env = {**os.environ, "ANTHROPIC_BASE_URL": api_url}
    cmd = [sys.executable, "-m", "labrun.cli", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise RuntimeError(f"labrun {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def full_session(idea: Path, root: Path) -> Run:
    from auto_responder import AutoResearcher
    from fake_messages_api import FakeMessagesAPI

    api = FakeMessagesAPI(default=AutoResearcher(), cache_accounting=True).start()
    ws = root / "full"
    try:
        labrun(["run", str(idea), "--workspace", str(ws), "--agent", "anthropic"], api.url)
    finally:
        api.stop()
    return Run(api, ws)


def interrupted_session(idea: Path, root: Path, phase: str, turn: int, cold: bool) -> Run:
    """Kill -9 `labrun run` while the model call of (phase, turn) is in flight (it is never
    answered, so never billed), then `labrun resume`; `cold`: the prompt cache expired in
    between (a resume after more than 5 minutes, e.g. after a usage window)."""
    from auto_responder import AutoResearcher, phase_and_turn
    from fake_messages_api import FakeMessagesAPI

    api = FakeMessagesAPI(default=AutoResearcher({(phase, turn): [{"hang": True}]}), cache_accounting=True).start()
    ws = root / f"{phase}-{turn}-{'cold' if cold else 'warm'}"
    try:
        proc = labrun(["run", str(idea), "--workspace", str(ws), "--agent", "anthropic"], api.url, wait=False)
        deadline = time.monotonic() + 300
        while not any(phase_and_turn(r["body"]) == (phase, turn) for r in list(api.requests)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the session never reached {phase} turn {turn}")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = len(api.billed)
        if cold:
            api.cache.entries.clear()
        labrun(["resume", str(ws)], api.url)
    finally:
        api.stop()
    return Run(api, ws, killed_at)


# -- the tables -------------------------------------------------------------------------------


def tokens_of(text_or_blocks) -> int:
    from fake_messages_api import count_tokens

    if isinstance(text_or_blocks, str):
        return count_tokens(json.dumps({"type": "text", "text": text_or_blocks}, separators=(",", ":")))
    return sum(count_tokens(json.dumps({k: v for k, v in b.items() if k != "cache_control"}, separators=(",", ":")))
               for b in text_or_blocks)


def all_phases_prompt(system: str, idea_dict: dict, domain: str) -> str:
    """One system prompt with every phase's instructions and domain guidance, then the idea
    and digest of `system` (a phase's prompt as sent), as NeuriCo's single prompt has it."""
    from labrun import prompts

    preamble = prompts._tidy(prompts.env.get_template("preamble.md.j2").render(total=len(prompts.DEFAULT))).strip()
    parts = ["# Research session: all six phases", preamble]
    for n, key in enumerate(prompts.DEFAULT, 1):
        rendered = prompts.system_prompt(key, idea_dict, domain, "")
        start = rendered.index(preamble) + len(preamble)
        parts.append(f"# Phase {n} of 6: {key}\n\n" + rendered[start:rendered.index("## The research idea")].strip())
    parts.append(system[system.index("## The research idea"):].strip())
    return "\n\n".join(parts) + "\n"


def prompt_table(full: Run, idea_path: Path):
    from rich.table import Table

    from auto_responder import phase_and_turn
    from labrun.idea import load_idea

    idea = load_idea(idea_path)
    table = Table(title="1. Input tokens of the prompt (system + tools) each turn sends",
                  caption="tokens: the fake server's count, ceil(len(JSON)/4) per block. 'all six phases': "
                          "one prompt with every phase's instructions and domain guidance (NeuriCo), "
                          "with the same idea and STATE.md digest.")
    for column in ("phase", "turns", "this phase's prompt", "all six phases", "saved", "saved over its turns"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    firsts: dict[str, dict] = {}
    turns: dict[str, int] = {}
    for r in full.api.requests:
        phase, _ = phase_and_turn(r["body"])
        firsts.setdefault(phase, r["body"])
        turns[phase] = turns.get(phase, 0) + 1
    total_own = total_all = 0
    for phase, body in firsts.items():
        system = body["system"][0]["text"]
        tools = tokens_of(body["tools"])
        own = tokens_of(body["system"]) + tools
        every = tokens_of(all_phases_prompt(system, idea.as_prompt_dict(), idea.guidance_domain)) + tools
        total_own += own * turns[phase]
        total_all += every * turns[phase]
        table.add_row(phase, str(turns[phase]), f"{own:,}", f"{every:,}", f"{1 - own / every:.0%}",
                      f"{(every - own) * turns[phase]:,}")
    table.add_row("session", str(sum(turns.values())), f"{total_own:,}", f"{total_all:,}",
                  f"{1 - total_own / total_all:.0%}", f"{total_all - total_own:,}", style="bold")
    return table


def cache_table(full: Run):
    from rich.table import Table

    from auto_responder import phase_and_turn
    from labrun.prices import cost_usd
    from labrun.usage import Usage

    table = Table(title="2. Prompt tokens read from the cache over a session",
                  caption="The fake server's prompt-cache model (5-minute TTL, 20-block lookback, 1,024-token "
                          "minimum). Each turn reads all that its previous turn sent and writes only what is new, "
                          "so the read share grows with a phase's turns (the stand-in model needs only 2-3). "
                          "'no cache': the same prompts with no breakpoints, all at the input price.")
    for column in ("phase", "turns", "input", "cache write", "cache read", "output", "read share", "cost", "no cache"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    phase_of = {r["n"]: phase_and_turn(r["body"])[0] for r in full.api.requests}
    rows: dict[str, list[dict]] = {}
    for b in full.api.billed:
        rows.setdefault(phase_of[b["n"]], []).append(b)
    rows["session"] = list(full.api.billed)
    for phase, bills in rows.items():
        u = {f: sum(b["usage"][f] for b in bills) for f in FIELDS}
        model = bills[0]["model"]
        prompt = u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
        cost = sum(cost_usd(b["model"], Usage(**{f: b["usage"][f] for f in FIELDS})) for b in bills)
        plain = sum(cost_usd(b["model"], Usage(input_tokens=sum(b["usage"][f] for f in FIELDS[:3]),
                                                 output_tokens=b["usage"]["output_tokens"])) for b in bills)
        table.add_row(phase, str(len(bills)), f"{u['input_tokens']:,}", f"{u['cache_creation_input_tokens']:,}",
                      f"{u['cache_read_input_tokens']:,}", f"{u['output_tokens']:,}",
                      f"{u['cache_read_input_tokens'] / prompt:.0%}", f"${cost:.4f}", f"${plain:.4f}",
                      style="bold" if phase == "session" else None)
    table.caption += f" Model priced: {model}."
    return table


def interruption_table(full: Run, runs: dict[tuple[str, str], Run]):
    from rich.table import Table

    from labrun.prices import cost_usd
    from labrun.usage import Usage

    def tokens(u: dict) -> int:
        return sum(u.values())

    def signed(dollars: float) -> str:
        return f"{'-' if dollars < 0 else '+'}${abs(dollars):.4f}"

    model = full.api.billed[0]["model"]
    baseline = full.billed()
    table = Table(title="3. Tokens spent again after kill -9 mid-phase, then resume",
                  caption="Killed while the phase's second model call was in flight (never answered, never "
                          "billed). labrun: tokens billed beyond an uninterrupted session (resume within "
                          "the cache TTL, or after it expired). Restart: NeuriCo starts again from the first "
                          "phase and pays again for everything done before the kill. Costs are per-call "
                          f"rounded list prices of {model}.")
    for column in ("killed in", "calls before the kill", "labrun: extra tokens", "extra $ (warm)",
                   "extra $ (cold)", "restart: tokens again", "restart: $ again"):
        table.add_column(column, justify="left" if column == "killed in" else "right")
    for (phase, label), warm in runs.items():
        if label != "warm":
            continue
        cold = runs[(phase, "cold")]
        before = {f: sum(b["usage"][f] for b in warm.api.billed[:warm.killed_at]) for f in FIELDS}
        extra_warm = {f: warm.billed()[f] - baseline[f] for f in FIELDS}
        cost_warm = sum(cost_usd(b["model"], Usage(**b["usage"])) for b in warm.api.billed) - \
            sum(cost_usd(b["model"], Usage(**b["usage"])) for b in full.api.billed)
        cost_cold = sum(cost_usd(b["model"], Usage(**b["usage"])) for b in cold.api.billed) - \
            sum(cost_usd(b["model"], Usage(**b["usage"])) for b in full.api.billed)
        restart = sum(cost_usd(b["model"], Usage(**b["usage"])) for b in warm.api.billed[:warm.killed_at])
        table.add_row(f"{phase}, turn 2", str(warm.killed_at), f"{tokens(extra_warm):+,}",
                      signed(cost_warm), signed(cost_cold), f"{tokens(before):,}", f"${restart:.4f}")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3, help="interrupted sessions run at once (default 3)")
    parser.add_argument("--keep", help="keep the workspaces in this directory")
    parser.add_argument("--phases", default="", metavar="KEY,...",
                        help="the phases to interrupt (default: all six; CI's smoke run names one)")
    args = parser.parse_args(argv)

    root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="labrun-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    prepare_environment(root)
    from rich.console import Console

    from auto_responder import IDEA
    from labrun.phase_registry import PHASES

    console = Console()
    if not console.is_terminal:
        console = Console(width=150)  # a report piped to a file keeps whole columns
    idea = root / "idea.yaml"
    idea.write_text(IDEA)
    started = time.monotonic()
    with console.status("starting a Prefect server"):
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        server.start(timeout=120)
        os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with console.status("an uninterrupted session"):
            full = full_session(idea, root)
        chosen = [k for k in args.phases.split(",") if k] or [p.key for p in PHASES]
        scenarios = [(key, cold) for key in chosen for cold in (False, True)]
        runs: dict[tuple[str, str], Run] = {}
        with console.status(f"{len(scenarios)} sessions killed mid-phase and resumed ({args.jobs} at a time)"):
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                futures = {pool.submit(interrupted_session, idea, root, key, 2, cold): (key, cold)
                           for key, cold in scenarios}
                done = {futures[f]: f.result() for f in concurrent.futures.as_completed(futures)}
        for key, cold in scenarios:
            runs[(key, "cold" if cold else "warm")] = done[(key, cold)]
        console.print(prompt_table(full, idea))
        console.print(cache_table(full))
        console.print(interruption_table(full, runs))
        console.print(f"[dim]measured in {time.monotonic() - started:.0f} s"
                      + (f"; workspaces in {root}" if args.keep else "") + "[/dim]")
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

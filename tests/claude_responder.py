"""A competent stand-in for the model behind the fake Messages API, for the real `claude` CLI.

`ClaudeResearcher()` is a callable `f(body) -> reply` for `FakeMessagesAPI(default=...)`, as
`auto_responder.AutoResearcher` is for the Anthropic backend, but it answers with Claude
Code's tools (`Write`, `Bash`) and labrun's over MCP (`mcp__labrun__run_experiment`,
`mcp__labrun__complete_phase`). It reads the phase from the system prompt (labrun appends
the phase's prompt, `# Phase N of 6: key`, to Claude Code's own) and its next step from the
conversation: the steps whose tool calls have succeeded are done, so a resumed or retried
conversation goes on where it stopped and a step that failed or was cut off is done again.
Should the MCP tools be deferred (not in the request's `tools`), it first loads them with
`ToolSearch`, as a model must.

`faults={("setup", 0): [reply, ...]}` answers the first requests made at setup's step 0 with
those replies (a 429 storm, a spent window), the next ones normally. `headers` go on every
normal reply (a subscription's `anthropic-ratelimit-unified-*`). `slow_experiment_s` makes
the first experiment attempt sleep that long, so a test can kill the engine during it.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from auto_responder import EXPERIMENT, PLAN

HEADING = re.compile(r"# Phase (\d) of 6: (\w+)")
MCP = "mcp__labrun__"


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system") or ""
    return system if isinstance(system, str) else "".join(b.get("text", "") for b in system)


def phase_of(body: dict[str, Any]) -> str:
    found = HEADING.search(system_text(body))
    if not found:
        raise ValueError("no labrun phase in the system prompt")
    return found.group(2)


def claims(body: dict[str, Any] | None) -> dict[str, Any]:
    """The slope as the successful attempts the model was told of recorded it (their tool
    results, in whichever API's format the body is), as `complete_phase`'s claims."""
    said = json.dumps(body or {})
    ran = {int(n): float(v) for n, v in re.findall(r"Attempt (\d+): SUCCESS.{0,600}?Metrics: .{0,200}?\bslope=(-?[\d.]+)",
                                                   said)}
    if not ran:
        return {}
    return {"claims": [{"id": "K1", "statement": "The fitted log-log slope of RMSE against k", "metric": "slope",
                        "attempts": sorted(ran), "value": round(sum(ran.values()) / len(ran), 6)}]}


def succeeded(body: dict[str, Any]) -> list[str]:
    """The names of the tool calls in the conversation that succeeded, oldest first."""
    names, done = {}, []
    for m in body.get("messages", []):
        for b in m["content"] if isinstance(m.get("content"), list) else []:
            if b.get("type") == "tool_use":
                names[b["id"]] = b["name"]
            elif b.get("type") == "tool_result" and not b.get("is_error") and b.get("tool_use_id") in names:
                done.append(names[b["tool_use_id"]])
    return [n for n in done if n != "ToolSearch"]


MCP_PROBE = """import glob, json, socket, sys
paths = set(sys.argv[1:])
for f in [] if paths else glob.glob("/tmp/labrun-mcp-*/mcp.sock") + glob.glob("/run/labrun/mcp.sock"):
    paths.add(f)
for f in [] if sys.argv[1:] else glob.glob(".labrun/phases/*/*-mcp.json") + glob.glob(".labrun/gemini/.gemini/settings.json"):
    try:
        paths |= {s["args"][-1] for s in json.load(open(f)).get("mcpServers", {}).values() if s.get("args")}
    except Exception:
        pass
for f in [] if sys.argv[1:] else glob.glob("/proc/[0-9]*/cmdline"):
    try:
        paths |= {a for a in open(f, "rb").read().decode(errors="replace").split(chr(0)) if a.endswith("mcp.sock")}
    except Exception:
        pass
said = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
         "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "complete_phase",
         "arguments": {"summary": "the probe"}}}]
for path in sorted(paths):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        s.sendall("".join(json.dumps(m) + chr(10) for m in said).encode())
        answers, rest = {}, b""
        while 2 not in answers:
            data = s.recv(65536)
            if not data:
                break
            *lines, rest = (rest + data).split(chr(10).encode())
            answers.update((m.get("id"), m) for m in map(json.loads, lines))
        print("MCP", path, "REACHED" if 2 in answers else "REFUSED: no answer")
    except Exception as e:
        print("MCP", path, "REFUSED:", e)
"""
"""A command of the agent's that finds labrun's MCP socket (where it lies under /tmp, where
the sandbox binds it, in the CLIs' MCP settings and command lines) and calls complete_phase
through it: `MCP <path> REACHED` when a tool answered. Given paths, it tries those alone. No
single quote in it."""

HOSTILE = ("awk 'NR > 1 && $NF ~ /^@/ {print \"ABSTRACT \" $NF}' /proc/net/unix; "
           "touch .labrun/escaped /var/tmp/labrun-cli-escaped 2>&1 | sed 's/^/WRITE /'; "
           f"python3 -c '{MCP_PROBE}'")
"""What a hostile agent tries from the CLI's own shell at setup besides `env` and the
listeners (`support.assert_shell_contained`): the abstract Unix sockets it sees, a write into
the engine's `.labrun/` and one outside the workspace, a call of labrun's tools through its
MCP socket. No `$(…)`: Gemini CLI refuses it."""


class ClaudeResearcher:
    def __init__(self, faults: dict[tuple[str, int], list[dict]] | None = None,
                 headers: dict[str, str] | None = None, slow_experiment_s: float = 0):
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.headers = dict(headers or {})
        self.slow_experiment_s = slow_experiment_s
        self._lock = threading.Lock()

    def steps(self, phase: str, body: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
        def done(summary: str, parts: dict[str, Any] | None = None, **sections: str) -> tuple[str, dict[str, Any]]:
            return MCP + "complete_phase", {"summary": summary, "sections": sections, **(parts or {})}

        plan = {"run_list": [{"id": "R1", "purpose": "RMSE per k and the log-log slope", "conditions": "sigma 0.5, "
                              "k = 1..64, 400 trials per k", "seeds": [0], "criteria": []}],
                "analysis_outputs": ["results/metrics.json"]}

        command = "python3 src/experiment.py"
        if self.slow_experiment_s:  # only the first attempt is slow
            command = (f"test -e results/.slow || (touch results/.slow && sleep {self.slow_experiment_s}); "
                       + command)
        return {
            "planning": [
                ("Write", {"file_path": "planning.md", "content": "# Plan\n\n" + PLAN}),
                done("Planned the study.", plan, research_specification="Does the RMSE of the mean of k noisy "
                     "measurements fall as 1/sqrt(k)? Fit the log-log slope; expect -0.5 within 0.05."),
            ],
            "setup": [
                ("Bash", {"command": "mkdir -p src results && python3 --version | sed 's/^/# /; s/$/: the standard library only, no packages to install/' > requirements.txt && env | sort && cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' "
                          "| sort -u; awk 'NR > 1 && $4 == \"0A\" {print \"LISTEN \" $2}' /proc/net/tcp /proc/net/tcp6; "
                          + HOSTILE, "description": "make the folders"}),
                done("Made the folders.", files_and_resources="- `src/` code\n- `results/` outputs",
                     workflow="Write src/experiment.py, smoke-test it, run it with run_experiment."),
            ],
            "implementation": [
                ("Write", {"file_path": "src/experiment.py", "content": EXPERIMENT}),
                ("Bash", {"command": "python3 src/experiment.py --smoke", "description": "smoke test"}),
                done("Wrote the simulation.", experiment_design="Monte Carlo, 400 trials per k, k in 1..64, "
                     "least-squares slope of log RMSE on log k."),
            ],
            "experiments": [
                (MCP + "run_experiment", {"command": command, "purpose": "measure the log-log slope", "run_id": "R1",
                                          "outputs": ["results/metrics.json"],
                                          "metrics_file": "results/metrics.json"}),
                done("Ran the experiment.", claims(body), experiment_results="See results/metrics.json (slope near -0.5)."),
            ],
            "analysis": [
                ("Bash", {"command": "cat results/metrics.json", "description": "read the metrics"}),
                done("Read the metrics.", learnings="The slope is close to -0.5, as theory says."),
            ],
            "documentation": [
                ("Write", {"file_path": "REPORT.md", "content": "# Report\n\nRun R1 is done: the RMSE of the mean falls "
                           "as 1/sqrt(k); see results/metrics.json.\n"}),
                ("Write", {"file_path": "README.md", "content": "# Averaging noisy measurements\n\n"
                           "Run `python3 src/experiment.py`.\n"}),
                done("Wrote the report and the readme."),
            ],
        }[phase]

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        phase = phase_of(body)
        steps = self.steps(phase, body)
        done = succeeded(body)
        step = 0
        for name in done:  # each success of the next step's tool moves on by one
            if step < len(steps) and name == steps[step][0]:
                step += 1
        with self._lock:
            queued = self.faults.get((phase, step))
            if queued:
                return queued.pop(0)
        n = len([m for m in body.get("messages", []) if m.get("role") == "assistant"]) + 1
        if step >= len(steps):
            return self._reply([{"type": "text", "text": f"Phase {phase} is complete."}])
        name, tool_input = steps[step]
        offered = {t.get("name") for t in body.get("tools") or []}
        if name.startswith(MCP) and name not in offered:  # deferred: load both tools first
            name, tool_input = "ToolSearch", {"query": f"select:{MCP}run_experiment,{MCP}complete_phase",
                                              "max_results": 5}
        return self._reply([{"type": "text", "text": f"Step {step + 1} of {phase}."},
                            {"type": "tool_use", "id": f"toolu_{phase[:4]}{n:02d}{step}", "name": name,
                             "input": json.loads(json.dumps(tool_input))}])

    def _reply(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        reply: dict[str, Any] = {"content": content}
        if self.headers:
            reply["headers"] = dict(self.headers)
        return reply

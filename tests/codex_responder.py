"""A competent stand-in for the model behind the fake Responses API, for the real `codex` CLI.

`CodexResearcher()` is a callable `f(body) -> reply` for `FakeResponsesAPI(default=...)`. It
does the research of `claude_responder.ClaudeResearcher` (the same steps, the same files),
with Codex's tools: `Write` becomes an `apply_patch` that adds the file, `Bash` an
`exec_command`; labrun's `mcp__labrun__*` tools stay as they are (the fake finds them
through `tool_search` when Codex defers them, as a model must). The phase is the last
`# Phase N of 6: key` heading in the request's messages (labrun's developer instructions,
or the current ones an engine restart puts into the resume prompt); the next step is read
from the conversation: a step whose call has a successful output is done, so a resumed or
retried thread goes on where it stopped and a step that failed or was cut off (on resume
Codex answers a call the engine's death cut short itself, not with labrun's result) is done
again.

`faults={("setup", 0): [reply, ...]}` answers the first requests made at setup's step 0 with
those replies (a rate-limit storm; a callable makes its reply when it is asked), the next
ones normally. `slow_experiment_s` makes the
first experiment attempt sleep that long, so a test can kill the engine during it.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from claude_responder import HEADING, ClaudeResearcher

MODEL = "gpt-5.5"  # function tools (no code mode), and a price in labrun's table


def texts(body: dict[str, Any]) -> list[str]:
    return [part.get("text") or "" for item in body.get("input") or [] if item.get("type") == "message"
            for part in item.get("content") or [] if isinstance(part, dict)]


def phase_of(body: dict[str, Any]) -> str:
    found = [m.group(2) for text in texts(body) for m in HEADING.finditer(text)]
    if not found:
        raise ValueError("no labrun phase in the request's messages")
    return found[-1]


def output_text(item: dict[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, list):
        return "\n".join(str(part.get("text") or "") for part in output if isinstance(part, dict))
    return str(output or "")


def succeeded(body: dict[str, Any]) -> list[str]:
    """The labrun step names (`Write`, `Bash`, `mcp__labrun__…`) of the calls in the
    conversation that succeeded, oldest first."""
    calls, done = {}, []
    for item in body.get("input") or []:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            namespace = item.get("namespace")
            calls[item["call_id"]] = f"{namespace}__{item['name']}" if namespace else item["name"]
        elif kind in ("function_call_output", "custom_tool_call_output") and item.get("call_id") in calls:
            name, said = calls[item["call_id"]], output_text(item)
            if name == "exec_command" and "Process exited with code 0" in said:
                done.append("Bash")
            elif name == "apply_patch" and "Exit code: 0" in said:
                done.append("Write")
            elif name == "mcp__labrun__run_experiment" and re.search(r"Attempt \d+: SUCCESS", said):
                done.append(name)
            elif name == "mcp__labrun__complete_phase" and re.search(r"Phase \w+ complete", said):
                done.append(name)
    return done


def as_codex(name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
    """A step of `ClaudeResearcher` as the call Codex's model makes."""
    if name == "Write":
        lines = "".join(f"+{line}\n" for line in arguments["content"].splitlines())
        return "apply_patch", f"*** Begin Patch\n*** Add File: {arguments['file_path']}\n{lines}*** End Patch\n"
    if name == "Bash":
        return "exec_command", {"cmd": arguments["command"]}
    return name, arguments


class CodexResearcher:
    def __init__(self, faults: dict[tuple[str, int], list[dict]] | None = None, slow_experiment_s: float = 0):
        self.plan = ClaudeResearcher(slow_experiment_s=slow_experiment_s)
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self._lock = threading.Lock()

    # What another CLI's researcher (gemini_responder) reads and calls in its own protocol.
    phase_of = staticmethod(phase_of)
    succeeded = staticmethod(succeeded)
    as_call = staticmethod(as_codex)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        phase = self.phase_of(body)
        steps = self.plan.steps(phase, body)
        step = 0
        for name in self.succeeded(body):  # each success of the next step's tool moves on by one
            if step < len(steps) and name == steps[step][0]:
                step += 1
        with self._lock:
            queued = self.faults.get((phase, step))
            if queued:
                fault = queued.pop(0)
                return fault() if callable(fault) else fault
        if step >= len(steps):
            return {"text": f"Phase {phase} is complete."}
        name, arguments = self.as_call(*steps[step])
        return {"text": f"Step {step + 1} of {phase}.", "tool": name, "arguments": json.loads(json.dumps(arguments))}

"""A competent stand-in for the model behind the fake Gemini API, for the real `gemini` CLI.

`GeminiResearcher()` is a callable `f(body) -> reply` for `FakeGeminiAPI(default=...)`. It
does the research of `claude_responder.ClaudeResearcher` (the same steps, the same files),
with Gemini CLI's tools: `Write` becomes `write_file`, `Bash` `run_shell_command`, and
labrun's `mcp__labrun__*` tools the `mcp_labrun_*` functions Gemini CLI declares for them.
The phase is the `# Phase N of 6: key` heading of the request's system instruction (labrun's
phase prompt, Gemini CLI's context file, read anew on every run); the next step is read from
the conversation: a step whose call has a successful response is done, so a resumed or
retried session goes on where it stopped and a step that failed or was cut off is done again.

`faults` and `slow_experiment_s` are `CodexResearcher`'s.
"""

from __future__ import annotations

import json
import re
from typing import Any

from claude_responder import HEADING, MCP
from codex_responder import CodexResearcher

MODEL = "gemini-2.5-pro"


def phase_of(body: dict[str, Any]) -> str:
    found = HEADING.search(json.dumps(body.get("systemInstruction") or {}))
    if not found:
        raise ValueError("no labrun phase in the system instruction")
    return found.group(2)


def succeeded(body: dict[str, Any]) -> list[str]:
    """The labrun step names (`Write`, `Bash`, `mcp__labrun__…`) of the calls in the
    conversation that succeeded, oldest first."""
    calls, done = {}, []
    for content in body.get("contents") or []:
        for part in content.get("parts") or []:
            if "functionCall" in part:
                calls[part["functionCall"].get("id")] = part["functionCall"]["name"]
            elif "functionResponse" in part and part["functionResponse"].get("id") in calls:
                name = calls[part["functionResponse"]["id"]]
                response = part["functionResponse"].get("response") or {}
                said = str(response.get("output") or "")
                if "error" in response:
                    continue
                if name == "run_shell_command" and "Exit Code:" not in said:
                    done.append("Bash")
                elif name == "write_file" and said.startswith("Successfully"):
                    done.append("Write")
                elif name == "mcp_labrun_run_experiment" and re.search(r"Attempt \d+: SUCCESS", said):
                    done.append(MCP + "run_experiment")
                elif name == "mcp_labrun_complete_phase" and re.search(r"Phase \w+ complete", said):
                    done.append(MCP + "complete_phase")
    return done


def as_gemini(name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A step of `ClaudeResearcher` as the call Gemini's model makes."""
    if name == "Write":
        return "write_file", {"file_path": arguments["file_path"], "content": arguments["content"]}
    if name == "Bash":
        return "run_shell_command", {"command": arguments["command"]}
    return name.removeprefix(MCP), arguments  # the fake calls the declared mcp_labrun_<name>


class GeminiResearcher(CodexResearcher):
    """The same research and faults as `CodexResearcher`, in the Gemini API's protocol."""

    phase_of = staticmethod(phase_of)
    succeeded = staticmethod(succeeded)
    as_call = staticmethod(as_gemini)

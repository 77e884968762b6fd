"""A backend added the way any new one is, as one module and one registry entry
(tests/test_agent_registry.py puts `ENTRY` in the registry): the scripted agent's moves under
another name and model, a check that asks for `TINY_KEY`, and transcripts of its own
(`tiny-run-NNN.jsonl`, one fetch a line) that it reads itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from labrun.agents.registry import AgentUnavailable, Backend, model_of
from labrun.agents.scripted import ScriptedModel
from labrun.model import ModelReply, ModelRequest
from labrun.toollog import ToolRun

MISSING = "No tiny key: export TINY_KEY=..."
ENTRY = Backend("tiny", "tiny_backend:make", "priced", default_model="tiny-1", check="tiny_backend:check",
                variables={"TINY_KEY": "the tiny agent's key"}, tool_runs="tiny_backend:tool_runs")


def check() -> None:
    if not os.environ.get("TINY_KEY"):
        raise AgentUnavailable(MISSING)


class TinyModel:
    def __init__(self, model: str | None, workspace: str | Path | None):
        self.name = model_of("tiny", model)
        self.moves = ScriptedModel(workspace, latency_s=0)

    def complete(self, request: ModelRequest) -> ModelReply:
        """The scripted move, its words signed with this model's name."""
        reply = self.moves.complete(request)
        said = reply.content[0]["text"].replace("[scripted agent]", f"[{self.name}]")
        return reply.model_copy(update={"model": self.name, "content": [{"type": "text", "text": said},
                                                                          *reply.content[1:]]})


def make(model: str | None, workspace: str | Path | None) -> TinyModel:
    return TinyModel(model, workspace)


def tool_runs(phase_dir: Path) -> Iterator[ToolRun]:
    for path in sorted(phase_dir.glob("tiny-run-*.jsonl")):
        for line in path.read_text().splitlines():
            fetch = json.loads(line)
            yield ToolRun("fetch", fetch["url"], fetch["ok"])

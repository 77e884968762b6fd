"""A phase's conversation, saved record by record so that a crash loses nothing finished.

Each record is one JSON line, flushed and fsynced before the engine moves on: the user's
messages, every model reply the moment it arrives, every tool result the moment its tool
finishes, and the phase's completion. The Messages-API conversation is rebuilt from the
records, byte for byte the same on every rebuild, so a resumed phase continues it (and a
prompt cache keeps hitting).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from labrun.secrets import redact_data
from labrun.usage import Usage


class JournalCorrupt(Exception):
    pass


class Conversation:
    def __init__(self, path: Path, repair: bool = True):
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            self.records = _read_records(path, repair)

    # -- opening ---------------------------------------------------------------------------

    @staticmethod
    def files(phase_dir: Path) -> list[Path]:
        return sorted(phase_dir.glob("conversation-*.jsonl"))

    @classmethod
    def latest(cls, phase_dir: Path) -> "Conversation | None":
        files = cls.files(phase_dir)
        return cls(files[-1]) if files else None

    @classmethod
    def start(cls, phase_dir: Path) -> "Conversation":
        n = len(cls.files(phase_dir)) + 1
        phase_dir.mkdir(parents=True, exist_ok=True)
        return cls(phase_dir / f"conversation-{n:03d}.jsonl")

    # -- writing ---------------------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> None:
        record = redact_data(record)
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)

    def add_user_text(self, text: str) -> None:
        self.append({"kind": "user", "content": [{"type": "text", "text": text}]})

    def add_call(self, turn: int) -> None:
        """A model call is about to be made (its reply follows, unless a crash cut it off)."""
        self.append({"kind": "call", "turn": turn})

    def cut_call(self) -> int | None:
        """The turn of a model call that a crash cut off before its reply was saved."""
        last = self.records[-1] if self.records else None
        return last["turn"] if last and last["kind"] == "call" else None

    def add_reply(self, content: list[dict], usage: Usage, stop_reason: str | None) -> None:
        self.append(
            {"kind": "reply", "content": content, "usage": usage.model_dump(), "stop_reason": stop_reason}
        )

    def add_tool_result(self, tool_use_id: str, name: str, content: str, is_error: bool) -> None:
        self.append(
            {"kind": "tool_result", "tool_use_id": tool_use_id, "name": name,
             "content": content, "is_error": is_error}
        )

    def complete(self, manifest: dict[str, Any]) -> None:
        self.append({"kind": "complete", "manifest": manifest})

    # -- reading ---------------------------------------------------------------------------

    def _since_revision(self) -> list[dict[str, Any]]:
        """The records since a reviewer last sent the phase back (`labrun.review`): a
        completion before that no longer stands."""
        marks = [i for i, r in enumerate(self.records) if r.get("revision")]
        return self.records[marks[-1]:] if marks else self.records

    @property
    def revising(self) -> bool:
        """The last record is a reviewer's revision, not answered yet."""
        return bool(self.records) and bool(self.records[-1].get("revision"))

    @property
    def completed(self) -> dict[str, Any] | None:
        """The manifest, once the phase completed in this conversation."""
        for r in reversed(self._since_revision()):
            if r["kind"] == "complete":
                return r["manifest"]
        return None

    def completion(self) -> dict[str, Any] | None:
        """The input of the `complete_phase` call that succeeded in this conversation."""
        calls = {}
        for r in self._since_revision():
            if r["kind"] == "reply":
                calls.update({b["id"]: b.get("input") or {} for b in r["content"]
                              if b.get("type") == "tool_use" and b.get("name") == "complete_phase"})
            elif r["kind"] == "tool_result" and r["name"] == "complete_phase" and not r["is_error"]:
                return calls.get(r["tool_use_id"])
        return None

    @property
    def turns(self) -> int:
        return sum(1 for r in self.records if r["kind"] == "reply")

    @property
    def usage(self) -> Usage:
        total = Usage()
        for r in self.records:
            if r["kind"] == "reply":
                total += Usage.model_validate(r["usage"])
        return total

    def unanswered_tool_uses(self) -> list[dict[str, Any]]:
        """Tool calls of the last reply that have no result: cut off by a crash."""
        replies = [i for i, r in enumerate(self.records) if r["kind"] == "reply" and not refused(r)]
        if not replies:
            return []
        last = replies[-1]
        answered = {r["tool_use_id"] for r in self.records[last:] if r["kind"] == "tool_result"}
        return [
            b for b in self.records[last]["content"]
            if b.get("type") == "tool_use" and b["id"] not in answered
        ]

    def messages(self) -> list[dict[str, Any]]:
        """The Messages-API conversation: alternating user and assistant messages."""
        messages: list[dict[str, Any]] = []
        for r in self.records:
            if r["kind"] == "reply":
                if r["content"] and not refused(r):  # the API asks to set a refused turn aside
                    messages.append({"role": "assistant", "content": r["content"]})
                continue
            if r["kind"] == "user":
                blocks = r["content"]
            elif r["kind"] == "tool_result":
                blocks = [{"type": "tool_result", "tool_use_id": r["tool_use_id"],
                           "content": r["content"], "is_error": r["is_error"]}]
            else:
                continue
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"] = messages[-1]["content"] + blocks
            else:
                messages.append({"role": "user", "content": list(blocks)})
        return messages


def refused(record: dict[str, Any]) -> bool:
    return record.get("stop_reason") == "refusal"


def _read_records(path: Path, repair: bool) -> list[dict[str, Any]]:
    """Read a journal; a record cut short by a crash while it was written is dropped (it was
    never acknowledged), anything else unreadable is reported with its line."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records = []
    good_bytes = 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "kind" not in record:
                raise ValueError("not a journal record")
            records.append(record)
            good_bytes += len(line) + 1
        except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if i == len(lines) - 1:  # torn final write: no newline was ever written
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(good_bytes)
                break
            raise JournalCorrupt(
                f"{path}:{i + 1}: corrupted journal record; move the file aside to restart "
                "this phase's conversation, or restore it from a backup"
            ) from None
    if repair and raw and not raw.endswith(b"\n") and len(records) and good_bytes > len(raw):
        with open(path, "ab") as f:  # a whole last record whose newline never came: end it
            f.write(b"\n")
    return records


def phase_usage(phase_dir: Path) -> Usage:
    """Everything a phase was billed for, interrupted conversations included."""
    total = Usage()
    for f in Conversation.files(phase_dir):
        total += Conversation(f, repair=False).usage
    return total

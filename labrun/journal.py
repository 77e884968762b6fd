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
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_serializer

from labrun.secrets import redact_data
from labrun.usage import Usage


class JournalCorrupt(Exception):
    pass


# -- records -----------------------------------------------------------------------------------
# Each kind is a model; a record is written as the fields it was given (`dump`), so the lines on
# disk are what they always were, and read back through `RECORD` whatever labrun wrote them.


class Record(BaseModel):
    """A journal record; fields it carries that this labrun does not know are kept."""

    model_config = ConfigDict(extra="allow")
    kind: str

    def dump(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.model_dump(mode="json", exclude_unset=True)}


R = TypeVar("R", bound=Record)


class UserRecord(Record):
    kind: Literal["user"] = "user"
    content: list[dict[str, Any]] = Field(default_factory=list)
    revision: str | None = None
    """The reviewer's revision this message asks for (`labrun.review`)."""

    def texts(self) -> list[str]:
        return [b["text"] for b in self.content if b.get("type") == "text"]


class CallRecord(Record):
    """A model call is about to be made (its reply follows, unless a crash cut it off)."""

    kind: Literal["call"] = "call"
    turn: int


class CliEvent(BaseModel):
    """What a reply of a coding CLI's stands for (`labrun.agents.cli_agent`): a run's start,
    a streamed message, a tool call, or a run's result and bill."""

    model_config = ConfigDict(extra="allow")
    event: str | None = None
    run: int | None = None
    resume: str | None = None
    transcript: str | None = None
    at: float | None = None
    id: Any = None
    model: str | None = None
    subtype: str | None = None
    is_error: bool | None = None
    num_turns: int | None = None
    session_id: str | None = None
    total_cost_usd: float | None = None
    billed: dict[str, Any] | None = None
    total_usage: dict[str, Any] | None = None


class ReplyRecord(Record):
    kind: Literal["reply"] = "reply"
    content: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    stop_reason: str | None = None
    cli: CliEvent | None = None

    @field_serializer("usage")
    def _whole_usage(self, usage: Usage) -> dict[str, Any]:
        return usage.model_dump()

    @property
    def refused(self) -> bool:
        return self.stop_reason == "refusal"

    @property
    def event(self) -> str | None:
        """The coding CLI's event it stands for; None for a model API's reply."""
        return self.cli.event if self.cli else None

    def tool_uses(self, name: str | None = None) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use" and name in (None, b.get("name"))]


class ToolResultRecord(Record):
    kind: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    name: str = ""
    content: Any = ""
    is_error: bool = False


class CompleteRecord(Record):
    kind: Literal["complete"] = "complete"
    manifest: dict[str, Any]


class SystemRecord(Record):
    """The phase's system prompt as it began, and the workspace it found."""

    kind: Literal["system"] = "system"
    text: str
    files_before: dict[str, str] | None = None
    prompt: str | None = None
    """The digest of the prompt's templates (`prompts.prompt_digest`)."""


class CliSessionRecord(Record):
    """A coding CLI's session for run `run`, and the tools it offered."""

    kind: Literal["cli_session"] = "cli_session"
    session_id: str | None = None
    run: int | None = None
    tools: list[str] | None = None
    note: str | None = None


class OtherRecord(Record):
    """A kind this labrun does not know: kept as it is."""


KINDS: dict[str, type[Record]] = {c.model_fields["kind"].default: c for c in (
    UserRecord, CallRecord, ReplyRecord, ToolResultRecord, CompleteRecord, SystemRecord, CliSessionRecord)}


def _kind(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else value.kind
    return kind if kind in KINDS else "other"


AnyRecord = Annotated[
    Union[Annotated[UserRecord, Tag("user")], Annotated[CallRecord, Tag("call")],
          Annotated[ReplyRecord, Tag("reply")], Annotated[ToolResultRecord, Tag("tool_result")],
          Annotated[CompleteRecord, Tag("complete")], Annotated[SystemRecord, Tag("system")],
          Annotated[CliSessionRecord, Tag("cli_session")], Annotated[OtherRecord, Tag("other")]],
    Discriminator(_kind),
]
RECORD: TypeAdapter[Record] = TypeAdapter(AnyRecord)


class Conversation:
    def __init__(self, path: Path, repair: bool = True):
        self.path = path
        self.records: list[Record] = []
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

    def append(self, record: Record) -> None:
        data = redact_data(record.dump())
        line = json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records.append(RECORD.validate_python(data))

    def add_user_text(self, text: str) -> None:
        self.append(UserRecord(content=[{"type": "text", "text": text}]))

    def add_call(self, turn: int) -> None:
        """A model call is about to be made (its reply follows, unless a crash cut it off)."""
        self.append(CallRecord(turn=turn))

    def cut_call(self) -> int | None:
        """The turn of a model call that a crash cut off before its reply was saved."""
        last = self.records[-1] if self.records else None
        return last.turn if isinstance(last, CallRecord) else None

    def add_reply(self, content: list[dict], usage: Usage, stop_reason: str | None) -> None:
        self.append(ReplyRecord(content=content, usage=usage, stop_reason=stop_reason))

    def add_tool_result(self, tool_use_id: str, name: str, content: str, is_error: bool) -> None:
        self.append(ToolResultRecord(tool_use_id=tool_use_id, name=name, content=content, is_error=is_error))

    def complete(self, manifest: dict[str, Any]) -> None:
        self.append(CompleteRecord(manifest=manifest))

    # -- reading ---------------------------------------------------------------------------

    def of(self, kind: type[R]) -> list[R]:
        """The records of one kind, in order."""
        return [r for r in self.records if isinstance(r, kind)]

    def _since_revision(self) -> list[Record]:
        """The records since a reviewer last sent the phase back (`labrun.review`): a
        completion before that no longer stands."""
        marks = [i for i, r in enumerate(self.records) if isinstance(r, UserRecord) and r.revision]
        return self.records[marks[-1]:] if marks else self.records

    @property
    def revising(self) -> bool:
        """The last record is a reviewer's revision, not answered yet."""
        last = self.records[-1] if self.records else None
        return isinstance(last, UserRecord) and bool(last.revision)

    @property
    def system(self) -> SystemRecord | None:
        """How the phase began in this conversation."""
        return next(iter(self.of(SystemRecord)), None)

    @property
    def completed(self) -> dict[str, Any] | None:
        """The manifest, once the phase completed in this conversation."""
        for r in reversed(self._since_revision()):
            if isinstance(r, CompleteRecord):
                return r.manifest
        return None

    def completion(self) -> dict[str, Any] | None:
        """The input of the `complete_phase` call that succeeded in this conversation."""
        calls = {}
        for r in self._since_revision():
            if isinstance(r, ReplyRecord):
                calls.update({b["id"]: b.get("input") or {} for b in r.tool_uses("complete_phase")})
            elif isinstance(r, ToolResultRecord) and r.name == "complete_phase" and not r.is_error:
                return calls.get(r.tool_use_id)
        return None

    @property
    def turns(self) -> int:
        return len(self.of(ReplyRecord))

    @property
    def usage(self) -> Usage:
        return sum((r.usage for r in self.of(ReplyRecord)), Usage())

    def unanswered_tool_uses(self) -> list[dict[str, Any]]:
        """Tool calls of the last reply that have no result: cut off by a crash."""
        replies = [i for i, r in enumerate(self.records) if isinstance(r, ReplyRecord) and not r.refused]
        if not replies:
            return []
        last = replies[-1]
        reply = self.records[last]
        assert isinstance(reply, ReplyRecord)
        answered = {r.tool_use_id for r in self.records[last:] if isinstance(r, ToolResultRecord)}
        return [b for b in reply.tool_uses() if b["id"] not in answered]

    def messages(self) -> list[dict[str, Any]]:
        """The Messages-API conversation: alternating user and assistant messages."""
        messages: list[dict[str, Any]] = []
        for r in self.records:
            if isinstance(r, ReplyRecord):
                if r.content and not r.refused:  # the API asks to set a refused turn aside
                    messages.append({"role": "assistant", "content": r.content})
                continue
            if isinstance(r, UserRecord):
                blocks = r.content
            elif isinstance(r, ToolResultRecord):
                blocks = [{"type": "tool_result", "tool_use_id": r.tool_use_id,
                           "content": r.content, "is_error": r.is_error}]
            else:
                continue
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"] = messages[-1]["content"] + blocks
            else:
                messages.append({"role": "user", "content": list(blocks)})
        return messages


def _read_records(path: Path, repair: bool) -> list[Record]:
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
            if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
                raise ValueError("not a journal record")
            records.append(RECORD.validate_python(record))
            good_bytes += len(line) + 1
        except ValueError:  # JSONDecodeError, UnicodeDecodeError and pydantic's ValidationError are
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

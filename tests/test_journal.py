"""Journal records are typed when read (a model per kind) and written as they always were: a
journal of an earlier labrun loads, and the lines this one writes are the same."""

from __future__ import annotations

import json

import pytest

from labrun.journal import (CallRecord, CliEvent, CliSessionRecord, CompleteRecord, Conversation, JournalCorrupt,
                            OtherRecord, ReplyRecord, SystemRecord, ToolResultRecord, UserRecord)
from labrun.usage import Usage

USAGE = {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
         "web_search_requests": 0, "web_fetch_requests": 0, "cost_usd": 0.5, "estimated_usd": 0.0}
OLD = [  # as labrun wrote them before records were typed, one of each kind
    {"kind": "system", "text": "You are", "files_before": {"a.py": "d1"}, "prompt": "p1"},
    {"kind": "user", "content": [{"type": "text", "text": "Start"}]},
    {"kind": "call", "turn": 1},
    {"kind": "reply", "content": [{"type": "tool_use", "id": "t1", "name": "complete_phase", "input": {"summary": "s"}}],
     "usage": USAGE, "stop_reason": "tool_use"},
    {"kind": "tool_result", "tool_use_id": "t1", "name": "complete_phase", "content": "done", "is_error": False},
    {"kind": "complete", "manifest": {"files": {}}},
    {"kind": "cli_session", "run": 1, "session_id": "abc", "tools": ["bash"]},
    {"kind": "reply", "stop_reason": None, "usage": USAGE, "content": [{"type": "text", "text": "[m]"}],
     "cli": {"run": 1, "event": "message", "id": "m1", "model": "x"}},
    {"kind": "user", "revision": "1-planning-1", "content": [{"type": "text", "text": "Again"}]},
    {"kind": "from_a_later_labrun", "anything": [1, 2]},
]


def write(path, records) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def test_an_earlier_journal_loads_typed(tmp_path):
    path = tmp_path / "conversation-001.jsonl"
    write(path, OLD)
    convo = Conversation(path)
    assert [type(r) for r in convo.records] == [SystemRecord, UserRecord, CallRecord, ReplyRecord, ToolResultRecord,
                                               CompleteRecord, CliSessionRecord, ReplyRecord, UserRecord, OtherRecord]
    assert convo.system.files_before == {"a.py": "d1"} and convo.system.prompt == "p1"
    assert convo.usage.cost_usd == 1.0 and convo.turns == 2
    assert convo.records[7].event == "message" and convo.records[7].cli.run == 1
    assert convo.completed is None  # the revision came after the completion
    assert convo.records[-1].anything == [1, 2]


def test_records_are_written_as_they_always_were(tmp_path):
    convo = Conversation(tmp_path / "conversation-001.jsonl")
    convo.append(SystemRecord(text="You are", files_before={"a.py": "d1"}, prompt="p1"))
    convo.add_user_text("Start")
    convo.add_call(1)
    convo.add_reply(OLD[3]["content"], Usage(**USAGE), "tool_use")
    convo.add_tool_result("t1", "complete_phase", "done", False)
    convo.complete({"files": {}})
    convo.append(CliSessionRecord(run=1, session_id="abc", tools=["bash"]))
    convo.append(ReplyRecord(stop_reason=None, usage=Usage(**USAGE), content=[{"type": "text", "text": "[m]"}],
                             cli=CliEvent(run=1, event="message", id="m1", model="x")))
    convo.append(UserRecord(revision="1-planning-1", content=[{"type": "text", "text": "Again"}]))
    lines = [json.loads(line) for line in convo.path.read_text().splitlines()]
    assert lines == OLD[:-1]
    assert Conversation(convo.path).records == convo.records


def test_a_record_of_a_known_kind_that_does_not_parse_is_reported_with_its_line(tmp_path):
    path = tmp_path / "conversation-001.jsonl"
    write(path, [OLD[0], {"kind": "call", "turn": "not a number"}, OLD[1]])
    with pytest.raises(JournalCorrupt, match=f"{path}:2: corrupted journal record"):
        Conversation(path)

"""What a phase's tools really fetched from the network, read from its tool log.

The tool log is what the engine kept of the phase: its journals (`conversation-NNN.jsonl`:
the Messages API's `web_fetch` results, `bash` calls and their results), its experiment
attempts, and Claude Code's own event logs beside them (`claude-run-NNN.jsonl`: its
`WebFetch` and `Bash` calls). A source counts as fetched when a fetch of its address
succeeded there; search results alone do not count. A fetch that was tried and failed is
kept too: it is what a claim that nothing could be fetched rests on.

Sources are compared by key, so that one paper cited by its abstract page and fetched as a
PDF is the same source: `arxiv:2201.11903`, `doi:10.1000/xyz`, or the address without its
scheme, `www.`, fragment and trailing slash.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

from labrun.journal import RECORD, Record, ReplyRecord, ToolResultRecord

URL = re.compile(r"https?://[^\s<>\"'`|\\^{}\[\]()]+")
ARXIV_ID = r"(\d{4}\.\d{4,5}|[a-z][a-z.\-]*/\d{7})(?:v\d+)?"
ARXIV_URL = re.compile(rf"arxiv\.org/(?:abs|pdf|html|format)/{ARXIV_ID}", re.I)
ARXIV_REF = re.compile(rf"\barxiv:\s*{ARXIV_ID}", re.I)
DOI_REF = re.compile(r"(?:\bdoi:\s*|doi\.org/)(10\.\d{4,9}/[^\s\"'<>]+)", re.I)
# A bash call counts as a download only when it runs a program that fetches.
DOWNLOADER = re.compile(r"\b(curl|wget|git\s+clone|aria2c|python3?|hf|huggingface-cli|gh)\b")


def source_key(ref: str) -> str:
    """The key a cited or fetched address is compared by."""
    ref = ref.strip().rstrip(".,;:!?*_")
    if found := ARXIV_URL.search(ref) or ARXIV_REF.search(ref):
        return f"arxiv:{found.group(1).lower().removesuffix('.pdf')}"
    if found := DOI_REF.search(ref):
        return f"doi:{found.group(1).rstrip('.,;:').lower()}"
    parts = urlsplit(ref)
    host = (parts.hostname or "").lower().removeprefix("www.")
    path = parts.path.rstrip("/")
    return host + path + (f"?{parts.query}" if parts.query else "")


def cited(text: str) -> set[str]:
    """The keys of every source `text` cites: addresses, `arXiv:` ids and `doi:` names."""
    refs = URL.findall(text) + [m.group(0) for m in ARXIV_REF.finditer(text)]
    refs += [m.group(0) for m in DOI_REF.finditer(text) if not m.group(0).lower().startswith("doi.org")]
    return {source_key(r) for r in refs}


def fetched(phase_dir: Path, attempts: Iterable[Any] = ()) -> set[str]:
    """The keys of every source a tool of this phase fetched successfully. `attempts`: the
    phase's experiment attempts (a download run as an attempt counts when it succeeded)."""
    return {source_key(url) for url, ok in fetches(phase_dir, attempts) if ok}


def failed(phase_dir: Path, attempts: Iterable[Any] = ()) -> set[str]:
    """The keys of every source a tool of this phase tried to fetch, and could not."""
    return {source_key(url) for url, ok in fetches(phase_dir, attempts) if not ok}


def fetches(phase_dir: Path, attempts: Iterable[Any] = ()) -> Iterator[tuple[str, bool]]:
    """Every fetch the phase's tools tried: (address, whether it succeeded)."""
    yield from _journal_fetches(phase_dir)
    yield from _claude_code_fetches(phase_dir)
    for a in attempts:
        if a.status in ("SUCCESS", "FAILED") and DOWNLOADER.search(a.command):
            yield from ((u, a.status == "SUCCESS") for u in URL.findall(a.command))


def _journal_fetches(phase_dir: Path) -> Iterator[tuple[str, bool]]:
    calls: dict[str, dict] = {}
    for record in _journal(phase_dir):
        if isinstance(record, ReplyRecord):
            for block in record.content:
                if block.get("type") == "web_fetch_tool_result":
                    content = block.get("content") or {}
                    if content.get("type") == "web_fetch_result" and content.get("url"):
                        yield content["url"], True
                    elif content.get("type") == "web_fetch_tool_result_error":
                        asked = calls.get(block.get("tool_use_id")) or {}
                        if asked.get("url"):
                            yield str(asked["url"]), False
                elif block.get("type") in ("tool_use", "server_tool_use") and block.get("name") in ("bash", "web_fetch"):
                    calls[block.get("id")] = block.get("input") or {}
        elif isinstance(record, ToolResultRecord) and record.tool_use_id in calls:
            command = str(calls[record.tool_use_id].get("command") or "")
            output = str(record.content or "")
            if DOWNLOADER.search(command):
                ok = not record.is_error and "[exit code:" not in output
                yield from ((u, ok) for u in URL.findall(command))


def _claude_code_fetches(phase_dir: Path) -> Iterator[tuple[str, bool]]:
    """Claude Code's stream-json events: an `assistant` event's `tool_use` block, answered
    by a `user` event's `tool_result` (an error when it failed)."""
    calls: dict[str, tuple[str, dict]] = {}
    for event in _records(phase_dir.glob("claude-run-*.jsonl")):
        content = (event.get("message") or {}).get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[block.get("id")] = (block.get("name") or "", block.get("input") or {})
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                ok = not block.get("is_error")
                name, inp = calls[block["tool_use_id"]]
                if name == "WebFetch" and inp.get("url"):
                    yield str(inp["url"]), ok
                elif name == "Bash" and DOWNLOADER.search(str(inp.get("command") or "")):
                    yield from ((u, ok) for u in URL.findall(str(inp.get("command"))))


def _journal(phase_dir: Path) -> Iterator[Record]:
    """The phase's journal records; one that does not parse is skipped, as `_records` skips."""
    for raw in _records(phase_dir.glob("conversation-*.jsonl")):
        try:
            yield RECORD.validate_python(raw)
        except ValueError:
            continue


def _records(files: Iterable[Path]) -> Iterator[dict]:
    """Every JSON object in the files, in order; a line that is not one is skipped (the
    journal's own reader reports damage, this one only looks for fetches)."""
    for path in sorted(files):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record

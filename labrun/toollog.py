"""What a phase's tools really fetched from the network, read from its tool log.

The tool log is what the engine kept of the phase: its journals (`conversation-NNN.jsonl`:
the Messages API's `web_fetch` results, `bash` calls and their results), its experiment
attempts, and a backend's own transcripts beside them (Claude Code's `claude-run-NNN.jsonl`),
which that backend reads into backend-neutral `ToolRun`s. A source counts as fetched when a fetch of its address
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
from itertools import chain
from typing import Any, Iterable, Iterator, Literal, NamedTuple
from urllib.parse import urlsplit

from labrun.agents.registry import tool_runs
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


class ToolRun(NamedTuple):
    """One tool call that may have reached the network, whichever backend made it: a `fetch`
    of the address `target` (the Messages API's `web_fetch`, Claude Code's `WebFetch`), or a
    `shell` command `target` (a download when it runs a program that fetches); `ok` when it
    succeeded."""

    kind: Literal["fetch", "shell"]
    target: str
    ok: bool


def fetches(phase_dir: Path, attempts: Iterable[Any] = ()) -> Iterator[tuple[str, bool]]:
    """Every fetch the phase's tools tried: (address, whether it succeeded). Its tool calls
    are labrun's journal's and those a backend's own transcripts show (read by the backend,
    `labrun.agents.registry.tool_runs`)."""
    for run in chain(journal_tool_runs(phase_dir), tool_runs(phase_dir)):
        if run.kind == "fetch":
            yield run.target, run.ok
        elif DOWNLOADER.search(run.target):
            yield from ((u, run.ok) for u in URL.findall(run.target))
    for a in attempts:
        if a.status in ("SUCCESS", "FAILED") and DOWNLOADER.search(a.command):
            yield from ((u, a.status == "SUCCESS") for u in URL.findall(a.command))


def journal_tool_runs(phase_dir: Path) -> Iterator[ToolRun]:
    """The journal's (`conversation-NNN.jsonl`): the Messages API's `web_fetch` results, in
    the reply that made the call, and `bash` calls with their results."""
    calls: dict[str, tuple[str, dict]] = {}
    for record in _journal(phase_dir):
        if isinstance(record, ReplyRecord):
            for block in record.content:
                if block.get("type") == "web_fetch_tool_result":
                    content = block.get("content") or {}
                    if content.get("type") == "web_fetch_result" and content.get("url"):
                        yield ToolRun("fetch", content["url"], True)
                    elif content.get("type") == "web_fetch_tool_result_error":
                        _, asked = calls.get(block.get("tool_use_id")) or ("", {})
                        if asked.get("url"):
                            yield ToolRun("fetch", str(asked["url"]), False)
                elif block.get("type") in ("tool_use", "server_tool_use") and block.get("name") in ("bash", "web_fetch"):
                    calls[block.get("id")] = (block["name"], block.get("input") or {})
        elif isinstance(record, ToolResultRecord) and record.tool_use_id in calls:
            name, asked = calls[record.tool_use_id]
            output = str(record.content or "")
            if name == "bash":
                yield ToolRun("shell", str(asked.get("command") or ""),
                              not record.is_error and "[exit code:" not in output)


def _journal(phase_dir: Path) -> Iterator[Record]:
    """The phase's journal records; one that does not parse is skipped, as `records` skips."""
    for raw in records(phase_dir.glob("conversation-*.jsonl")):
        try:
            yield RECORD.validate_python(raw)
        except ValueError:
            continue


def records(files: Iterable[Path]) -> Iterator[dict]:
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

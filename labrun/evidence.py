"""What the session's own records say was measured: the evidence a completion rule holds a
claim to.

A number or a verdict is evidence only when it comes from a SUCCESS experiment attempt that
computed it:
- **the attempt ran code from the workspace** (its command names a source file there, such as
  `python3 src/run.py` or `bash run.sh`), not only a shell line;
- **a metric** the attempt recorded counts unless its value is written in the command itself
  (`echo '{"acc": 0.99}' > m.json` measures nothing);
- **a file** counts when the attempt wrote it (it changed during the attempt) and it still
  holds what the attempt wrote: a later edit with the editor or `bash` takes it out. A file
  the attempt only copied from one that was there before it ran is not a measurement either.

Besides evidence, the numbers the idea and the plan's run list state (sizes, seeds,
settings) may be restated.

**How a number is matched** (`latex.Numbers.traces`): the decimal numbers a text states (`0.731`, `-0.49`,
`12.5%`, `3.1e-4`; integers are counts, years and sizes, and are not checked) must each be
found among the evidence's numbers at the precision written: `0.73` matches 0.7312, not 0.74.
A percentage matches itself or its fraction (`12.5%` matches 0.125), and an unsigned number
either sign. In Markdown only addresses (links, DOIs, arXiv ids) are left out: a number in a
code block or a table is a claim as much as one in a sentence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from labrun import latex
from labrun.snapshot import entry_digest
from labrun.wsfs import Beneath

SOURCE = re.compile(r"[\w./-]*\w\.(?:py|sh|bash|r|R|jl|ipynb|js|ts|lean|m|cpp|cc|c|rs|go|java|scala|pl|rb|lua)\b")
MODULE = re.compile(r"\bpython\d?(?:\.\d+)?\s+(?:-\w+\s+)*-m\s+([\w.]+)")
ENGINE_BLOCK = re.compile(r"<!-- labrun:(\w+) -->.*?<!-- /labrun:\1 -->", re.S)
"""What the engine writes into a write-up itself (REPORT.md's reproduction header): not the
agent's claims."""
CITED = re.compile(r"#(\d+)\b")
"""An attempt cited by number in a note (`#3`)."""
ADDRESS = re.compile(r"\]\([^)]*\)|<?https?://\S+|\bdoi:\S+|\barXiv:\S+", re.I)


def runs_workspace_code(command: str, files: Iterable[str]) -> bool:
    """The command runs a source file of the workspace (by its path or name, or as a module)."""
    files = list(files)
    names = {f.rsplit("/", 1)[-1] for f in files} | set(files)
    named = {m.group(0).lstrip("./") for m in SOURCE.finditer(command)}
    named |= {m.replace(".", "/") + ".py" for m in MODULE.findall(command)}
    return any(n in names or n.rsplit("/", 1)[-1] in names or any(f.endswith("/" + n) for f in files)
               for n in named)


def literal_in(command: str, value: Any) -> bool:
    """The value is written in the command as a number of its own."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    text = json.dumps(value)
    return re.search(rf"(?<![\w.]){re.escape(text)}(?![\w.])", command) is not None or (
        isinstance(value, float) and value.is_integer() and
        re.search(rf"(?<![\w.]){int(value)}(?![\w.])", command) is not None)


@dataclass(frozen=True)
class Evidence:
    """The session's measurements: its SUCCESS attempts, what each wrote, and what the idea
    and the plan state."""

    root: Path
    attempts: Sequence[Any]
    """The live attempts (`labrun.state.Attempt`)."""
    files: Mapping[int, Mapping[str, Any]]
    """Attempt n → its record of files: `before` (the workspace as it found it), `wrote`
    (what changed during it), `after` (their digests when it ended)."""
    stated: tuple[str, ...] = ()
    """Texts whose numbers may be restated: the idea, the run list."""

    def computed(self, attempt: Any) -> bool:
        """A SUCCESS attempt that ran code from the workspace."""
        before = (self.files.get(attempt.n) or {}).get("before") or {}
        return attempt.status == "SUCCESS" and runs_workspace_code(attempt.command, before)

    def measured(self, attempt: Any) -> dict[str, Any]:
        """The metrics the attempt computed (none for an attempt that did not compute)."""
        if not self.computed(attempt):
            return {}
        return {k: v for k, v in attempt.metrics.items() if not literal_in(attempt.command, v)}

    def measured_files(self, outside: Iterable[str] = ()) -> list[str]:
        """The files that hold what a computing attempt wrote, as it wrote them (`outside`:
        files and folders left out: the write-up itself, and the paper's folder, whose build
        logs echo its text)."""
        skip = tuple(o.rstrip("/") for o in outside)
        found: dict[str, None] = {}
        for a in self.attempts:
            record = self.files.get(a.n) or {}
            if not self.computed(a):
                continue
            before = set((record.get("before") or {}).values())
            for rel, digest in (record.get("after") or {}).items():
                if rel.endswith("/") or any(rel == s or rel.startswith(s + "/") for s in skip) or digest in before:
                    continue  # an environment, a folder left out, or a copy of what was there
                if entry_digest(self.root, rel) == digest:
                    found[rel] = None
        return list(found)

    def numbers(self, outside: Iterable[str] = ()) -> latex.Numbers:
        metrics = [float(v) for a in self.attempts for v in self.measured(a).values()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        stated = [float(v) for text in self.stated for v in latex.RESULT_NUMBER.findall(text)]
        return latex.Numbers([*latex.Numbers.in_files(Beneath(self.root), self.measured_files(outside)).values, *metrics, *stated])


def markdown_numbers(text: str) -> list[latex.Stated]:
    """The decimal numbers a Markdown text states, as `latex.stated_numbers` reads a paper's
    (addresses blanked out, line numbers kept)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = ADDRESS.sub(blank, ENGINE_BLOCK.sub(blank, text))
    return latex.stated_numbers(text.replace("\\", " ").replace("%", "\\%"))

"""Reading a LaTeX paper's source the way its completion rule needs: the files it inputs,
the figures and citation keys it uses, and the numbers its text states.

This is not a TeX parser. It reads what a paper written from a template uses (`\\input`,
`\\includegraphics`, `\\cite...`, BibTeX entries) and the decimal numbers in its text,
leaving out comments, the preamble, and the arguments that hold no claims (labels,
references, lengths, options).
"""

from __future__ import annotations

import bisect
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from labrun.wsfs import Beneath

COMMENT = re.compile(r"(?<!\\)%.*$", re.M)
INPUT = re.compile(r"\\(?:input|include)\s*\{([^}]+)\}")
GRAPHICS = re.compile(r"\\includegraphics\s*(?:\[[^\]]*\])?\s*\{([^}]+)\}")
CITE = re.compile(r"\\(?:no)?cite[a-zA-Z]*\*?\s*(?:\[[^\]]*\]\s*){0,2}\{([^}]+)\}")
BIB_ENTRY = re.compile(r"@\s*(?!comment|string|preamble)[a-zA-Z]+\s*[{(]\s*([^,\s]+)\s*,", re.I)
# Commands whose arguments are names, lengths or code, never claims: they are dropped.
NOT_TEXT = re.compile(
    r"\\(?:label|ref|eqref|autoref|cref|Cref|pageref|nameref|cite[a-zA-Z]*|nocite|"
    r"includegraphics|input|include|url|href|bibliography|bibliographystyle|usepackage|"
    r"documentclass|begin|end|vspace|hspace|setlength|addtolength|setcounter|addtocounter|"
    r"resizebox|scalebox|rule|hypersetup|captionsetup|definecolor|color|textcolor|"
    r"fontsize|linespread|arraystretch|multicolumn|multirow|cline|cmidrule)\*?"
    r"(?:\s*\[[^\]]*\])*(?:\s*\{[^{}]*\})*"
)
DEFINITION = re.compile(r"^.*\\(?:(?:re)?newcommand|providecommand|def|renewenvironment|newenvironment)\b.*$", re.M)
OPTIONS = re.compile(r"(\\[a-zA-Z@]+\*?|\\\\)\s*\[[^\]]*\]")
NUMBER = re.compile(
    r"(?<![\w.\\])(?P<sign>[-\u2212]|\$-|--)?\s?(?P<digits>\d+\.\d+)(?!\d|\.\d)"
    r"(?:\s*\\times\s*10\^\{?(?P<exp>[-\u2212]?\d+)\}?|[eE](?P<eexp>[-+]?\d+))?"
    r"(?P<unit>\s?\\%|(?:pt|mm|cm|in|em|ex|bp)(?![a-zA-Z])|\s*\\(?:text|line|column)width|\s*\\textheight)?"
)
RESULT_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
TEXT_SUFFIXES = {".json", ".csv", ".tsv", ".txt", ".md", ".yaml", ".yml", ".log", ".tex", ".dat"}
MAX_RESULT_BYTES = 20_000_000


def toolchain() -> str | None:
    """The path of `latexmk`, when it and `pdflatex` are on the PATH that agent commands
    get (the engine's own); None when TeX is not installed here."""
    path = os.environ.get("PATH", os.defpath)
    latexmk = shutil.which("latexmk", path=path)
    return latexmk if latexmk and shutil.which("pdflatex", path=path) else None


def uncommented(source: str) -> str:
    """A .tex file's text without its comments."""
    return COMMENT.sub("", source)


def body(source: str) -> str:
    """What the document says: the preamble (before `\\begin{document}`), when there is
    one, is blanked out (its lines kept, so line numbers stay the file's)."""
    head, sep, rest = source.partition("\\begin{document}")
    return "\n" * head.count("\n") + rest if sep else source


def inputs(source: str) -> list[str]:
    return [m.strip() for m in INPUT.findall(source)]


def graphics(source: str) -> list[str]:
    return [m.strip() for m in GRAPHICS.findall(source)]


def cite_keys(source: str) -> set[str]:
    return {k.strip() for group in CITE.findall(source) for k in group.split(",") if k.strip()} - {"*"}


def bib_keys(bib: str) -> set[str]:
    return set(BIB_ENTRY.findall(bib))


@dataclass(frozen=True)
class Stated:
    """A number a paper states: as written, its value, and what a match must agree to."""

    written: str
    value: float
    tolerance: float
    signed: bool
    percent: bool
    line: int


def stated_numbers(source: str) -> list[Stated]:
    """The decimal numbers in a paper's text (`0.731`, `12.5\\%`, `3.1\\times10^{-4}`);
    integers (counts, years, sections) and lengths are not claims this checks."""
    cleaned = DEFINITION.sub("", source)
    cleaned = NOT_TEXT.sub(lambda m: "\n" * m.group(0).count("\n"), cleaned)
    cleaned = OPTIONS.sub(lambda m: m.group(1) + "\n" * m.group(0).count("\n"), cleaned)
    found = []
    for m in NUMBER.finditer(cleaned):
        unit = (m.group("unit") or "").strip()
        if unit and unit != "\\%":
            continue  # a length
        digits = m.group("digits")
        decimals = len(digits.split(".")[1])
        exponent = int((m.group("exp") or m.group("eexp") or "0").replace("\u2212", "-"))
        value = float(digits) * 10.0 ** exponent
        signed = bool(m.group("sign"))
        found.append(Stated(
            written=m.group(0).strip().lstrip("$"),
            value=-value if signed else value,
            tolerance=0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9),
            signed=signed,
            percent=unit == "\\%",
            line=cleaned.count("\n", 0, m.start()) + 1,
        ))
    return found


class Numbers:
    """Every number in a set of files, sorted, to look up stated values in."""

    def __init__(self, values: Iterable[float]):
        self.values = sorted(v for v in values if math.isfinite(v))

    @classmethod
    def in_files(cls, files: Beneath, paths: Iterable[str]) -> "Numbers":
        """The numbers in the text files `paths`, beneath `files` (read without following a link)."""
        values = []
        for path in paths:
            if Path(path).suffix.lower() not in TEXT_SUFFIXES:
                continue
            try:
                data = files.read_bytes(path, MAX_RESULT_BYTES).decode(errors="replace")
            except (OSError, ValueError):  # gone, or not a file reached without a link
                continue
            values += [float(v) for v in RESULT_NUMBER.findall(data)]
        return cls(values)

    def _near(self, value: float, tolerance: float) -> bool:
        i = bisect.bisect_left(self.values, value - tolerance)
        return i < len(self.values) and self.values[i] <= value + tolerance

    def traces(self, number: Stated) -> bool:
        """A number found to the precision it is written at (a percentage as itself or as a
        fraction; an unsigned one as either sign, since text often states a magnitude)."""
        scales = (1.0, 0.01) if number.percent else (1.0,)
        for scale in scales:
            value, tolerance = number.value * scale, number.tolerance * scale
            if self._near(value, tolerance) or (not number.signed and self._near(-value, tolerance)):
                return True
        return False

"""The result-like numbers a write-up states, and those of them that no record holds.

The engine never refuses prose over a number: it lists the numbers that are not in any
attempt's record, so that a reader sees which statements the engine does not vouch for.
`stated` reads the numbers (of Markdown, or with `latex=True` of a LaTeX source) and
`unrecorded` keeps those that no value of a `Record` holds. Both are pure: no files, no I/O.

**What is read** is any number a reader of the rendered text would take for a result:
`0.731`, `-0.49`, `.971`, `12,345.6`, `89.8%`, `89.8 percent`, `10.4 percentage points`,
`3.1e-4`, `7.45 × 10⁻¹⁴`, `p < 0.001`, the two ends of `87.6–91.6%` or `[0.71, 0.75]`,
wherever they are written: sentences, tables, code blocks, footnotes, HTML comments, LaTeX
macro definitions. Forms that hide a number from a naive reader are undone first: HTML
entities (`0&#46;971`), a decimal comma (`0,971`; `12,345` stays twelve thousand), other
Unicode digits and invisible characters, siunitx (`\\num{0.971}`), a number split by `{}`,
`{,}` or `\\,` in LaTeX.

**What is not a result** is never listed: integers (counts, years, sizes, seeds), unless
written with a % or as percentage points; versions (`Python 3.11`, `v2.1.0`, `torch 2.3.1`);
references (`Section 4.1`, `§4.1`, `Table 2.3`, `Eq. (3.2)`); addresses (links, URLs, DOIs,
arXiv ids, paths) and inline code spans that are paths or commands; dates and times of day;
the level of an interval (`95% CI`); LaTeX comments, preamble settings and lengths; the
engine's own blocks (`<!-- labrun:NAME -->` … `<!-- /labrun:NAME -->`).

**How a number is matched** (`Stated.readings`): at the precision written (`0.73` is
0.725..0.735), a percentage or percentage points as itself or its fraction (`89.8%` is 89.8
or 0.898), an unsigned number as either sign, a bound (`p < 0.001`) by any record value that
satisfies it. Every reading is looked up among the record's values and differences.

A `Record` holds what the engine itself recorded: attempts' metrics, claim values, sealed
scores, durations, the numbers of the idea and the plan, and differences between claimed
values. The engine never puts an output file's numbers into it (a per-item predictions file
holds thousands of numbers, and among them almost any number at the precision written).
"""

from __future__ import annotations

import bisect
import html
import math
import re
import sys
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Union

EPSILON = sys.float_info.epsilon
KINDS = ("value", "percent", "points", "bound", "range_end")
"""What a stated number is: a plain value; a percentage; percentage points; a bound
(`p < 0.001`, with its `relation`); one end of a range or interval (`87.6–91.6%`)."""


@dataclass(frozen=True)
class Stated:
    """A number a text states: where, as written, what kind, and what it reads as."""

    line: int
    written: str
    """As the source writes it (`0&#46;971`, `\\num{0.971}`, `89.8 percent`)."""
    kind: str
    """One of KINDS."""
    value: float
    """The number read, in the unit written (89.8 for `89.8%`), negative when written so."""
    tolerance: float
    """Half a unit in the last place written (0.005 for `0.73`, 0.05 for `89.8%`)."""
    signed: bool = False
    """Written with a sign: only that sign matches (an unsigned number matches either)."""
    unit: str = ""
    """"%" (a percentage) or "pp" (percentage points), else ""."""
    relation: str = ""
    """A bound's relation: "<", "<=", ">" or ">="."""

    @property
    def readings(self) -> tuple[tuple[float, float], ...]:
        """(number, half-width) pairs this number may stand for: itself, and for a
        percentage or percentage points also its fraction."""
        scales = (1.0, 0.01) if self.unit else (1.0,)
        # the slack: a float's rounding in reading and scaling, not a looser precision
        return tuple((self.value * s, self.tolerance * s * (1 + 1e-9) + 4 * EPSILON * abs(self.value * s))
                     for s in scales)


@dataclass(frozen=True)
class Record:
    """What the engine's record holds (see the module's docstring), and the differences
    between claimed values (a gap stated in percentage points or as a value)."""

    values: tuple[float, ...]
    differences: tuple[float, ...] = ()

    def numbers(self) -> list[float]:
        """Every finite value and difference, sorted."""
        return sorted(float(v) for v in (*self.values, *self.differences) if math.isfinite(float(v)))


def unrecorded(text: str, record: Record, latex: bool = False) -> list[Stated]:
    """The numbers `text` states that no value or difference of `record` holds."""
    pool = record.numbers()
    return [s for s in stated(text, latex) if not _held(s, pool)]


def _held(number: Stated, pool: list[float]) -> bool:
    if not pool:
        return False
    if number.kind == "bound":
        magnitudes = pool if number.signed else [abs(v) for v in pool]  # `p < 0.001` bounds a magnitude
        lowest, highest = min(magnitudes), max(magnitudes)
        for r, _ in number.readings:
            slack = 4 * EPSILON * abs(r)
            held = {"<": lowest < r, "<=": lowest <= r + slack, ">": highest > r, ">=": highest >= r - slack}
            if held[number.relation]:
                return True
        return False
    for r, tol in number.readings:
        for c in ((r,) if number.signed else (r, -r)):
            i = bisect.bisect_left(pool, c - tol)
            if i < len(pool) and pool[i] <= c + tol:
                return True
    return False


# --- reading ---------------------------------------------------------------------------

class _Text:
    """A text being cleaned for reading, that remembers where each character came from,
    so that a number is reported with its line and as the source writes it."""

    def __init__(self, original: str):
        self.original = original
        self.s = original
        self.at = list(range(len(original)))

    def sub(self, pattern: "re.Pattern[str]", repl: Union[str, list, Callable[["re.Match[str]"], Any]]) -> None:
        """Replace each match by `repl`: a text, or a list of texts and kept parts (a group's
        number or name, or a (start, end) span of the text); kept characters keep their origins."""
        pieces: list[str] = []
        at: list[int] = []
        last = 0
        for m in pattern.finditer(self.s):
            if m.end() == m.start():
                continue
            r = repl(m) if callable(repl) else repl
            if r == m.group(0):
                continue
            pieces.append(self.s[last:m.start()])
            at.extend(self.at[last:m.start()])
            parts = [r] if isinstance(r, str) else r
            cursor = m.start()
            for k, p in enumerate(parts):
                if isinstance(p, str):
                    if p:
                        origin = [self.at[cursor]] * len(p)
                        if k == len(parts) - 1:
                            origin[-1] = self.at[m.end() - 1]
                        pieces.append(p)
                        at.extend(origin)
                    continue
                a, b = p if isinstance(p, tuple) else m.span(p)
                if a >= 0 and b > a:
                    pieces.append(self.s[a:b])
                    at.extend(self.at[a:b])
                    cursor = b - 1
            last = m.end()
        pieces.append(self.s[last:])
        at.extend(self.at[last:])
        self.s = "".join(pieces)
        self.at = at

    def blank(self, pattern: "re.Pattern[str]", group: Union[int, str] = 0) -> None:
        """Blank out each match (or one group of it), keeping its line breaks."""
        def blanked(m: "re.Match[str]") -> Union[str, list]:
            a, b = m.span(group)
            if a < 0:
                return m.group(0)
            return [(m.start(), a), " " + "\n" * m.group(group).count("\n"), (b, m.end())]
        self.sub(pattern, blanked)

    def written(self, start: int, end: int) -> str:
        return self.original[self.at[start]:self.at[end - 1] + 1]


def _c(pattern: str, flags: int = 0) -> "re.Pattern[str]":
    return re.compile(pattern, flags)


BRACED = r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"
"""A `{…}` group, up to two levels of braces inside."""
ENGINE_BLOCK = _c(r"<!-- labrun:(\w+) -->.*?<!-- /labrun:\1 -->", re.S)
"""What the engine writes into a write-up itself: not the author's statements."""
ENTITY = _c(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")
ODD_CHARACTER = _c(r"[^\x00-\x7f]")
LOOKALIKE = {"．": ".", "，": ",", "％": "%", "﹪": "%", "٪": "%", "−": "-", "－": "-", "﹣": "-", "‐": "-",
             "‑": "-", "‒": "–", "٫": ".", "٬": ",", "＋": "+", "＜": "<", "＞": ">", "⋅": "·", "∙": "·",
             "⩽": "≤", "⩾": "≥", "≦": "≤", "≧": "≥"}
GROUP_SPACE = _c(r"(?<=[0-9])[\u00a0\u2009\u202f\u2007](?=[0-9]{3}(?![0-9]))")
"""A thin or no-break space between digit groups (`12 345.6`)."""

# Markdown
MD_ESCAPE = _c(r"\\([!-/:-@\[-`{-~])")
COMMENT_MARK = _c(r"<!--|-->")
TAG = _c(r"</?([A-Za-z][A-Za-z0-9]*)\b[^<>]*>")
INLINE_TAGS = {"b", "i", "em", "strong", "span", "u", "s", "mark", "small", "big", "font", "a", "code", "ins",
               "del", "abbr", "kbd", "var", "samp", "tt"}
FENCE_OR_CODE = _c(r"^[ \t]*(?P<fence>`{3,}|~{3,}).*?^[ \t]*(?P=fence)|(?P<ticks>`+)(?P<code>[^`\n]+?)(?P=ticks)(?!`)",
                   re.M | re.S)
FENCE = _c(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1", re.M | re.S)
FILE_NAME = _c(r"\w\.[A-Za-z][A-Za-z0-9]{0,7}$")
LINK_TARGET = _c(r"\]\(([^()\s]*(?:\([^()\s]*\))?[^()\s]*(?:\s+\"[^\"]*\")?)\)")
LINK_DEFINITION = _c(r"^[ \t]*\[(?!\^)[^\]\n]+\]:[ \t]*(\S+.*)$", re.M)
HEADING_NUMBER = _c(r"^[ \t]*#{1,6}[ \t]+([0-9]+(?:\.[0-9]+)*\.?)(?=\s)", re.M)

# LaTeX
TEX_COMMENT = _c(r"(?<!\\)%.*$", re.M)
TEX_HIDDEN = _c(r"\\begin\{comment\}.*?\\end\{comment\}|\\iffalse\b.*?\\fi\b", re.S)
DEFINITION = _c(r"\\(?:(?:re)?newcommand|providecommand|DeclareRobustCommand|"
                r"(?:New|Renew|Provide|Declare)DocumentCommand|[gex]?def|pgfmathsetmacro|pgfmathtruncatemacro)"
                r"(?![A-Za-z])")
LAYOUT_DEFINITION = _c(r"\\(?:(?:re)?newcommand\*?|def)\s*\{?\\(?:arraystretch|baselinestretch)\}?\s*\{[^{}]*\}")
OPTS = r"\s*(?:\[[^\]]*\])?\s*"
SIUNITX = [  # siunitx's commands, as the numbers (and % unit) they print
    (_c(r"\\(?:num|tablenum|numlist)" + OPTS + r"\{([^{}]*)\}"), lambda m: [" ", 1, " "]),
    (_c(r"\\numrange" + OPTS + r"\{([^{}]*)\}\s*\{([^{}]*)\}"), lambda m: [" ", 1, "–", 2, " "]),
    (_c(r"\\(?:SI|qty|SIlist|qtylist)" + OPTS + r"\{([^{}]*)\}" + OPTS + "(" + BRACED + ")"),
     lambda m: [" ", 1, _unit(m.group(2))]),
    (_c(r"\\(?:SIrange|qtyrange)" + OPTS + r"\{([^{}]*)\}\s*\{([^{}]*)\}" + OPTS + "(" + BRACED + ")"),
     lambda m: [" ", 1, "–", 2, _unit(m.group(3))]),
]
# Commands whose first n arguments are names, addresses, lengths or settings, never claims.
NAME_ARGUMENTS = {
    1: r"label|ref|eqref|autoref|cref|Cref|vref|pageref|nameref|cite[a-zA-Z]*|[a-z]*cite|nocite|url|href|doi|"
       r"includegraphics|input|include|bibliography|bibliographystyle|addbibresource|usepackage|RequirePackage|"
       r"documentclass|vspace|hspace|vskip|hskip|hypersetup|captionsetup|sisetup|color|textcolor|colorbox|"
       r"cellcolor|rowcolor|columncolor|linespread|setstretch|cline|cmidrule|scalebox|raisebox|parbox|adjustbox|"
       r"pgfplotsset|tikzset|usetikzlibrary|newlength|graphicspath|geometry|newgeometry|enlargethispage|bibitem",
    2: r"setlength|addtolength|setcounter|addtocounter|resizebox|rule|fontsize|multicolumn|multirow",
    3: r"definecolor",
}
TEX_NAMES = [_c(r"\\(?:" + names + r")\*?(?:\s*\[[^\]]*\]|\s*\([^)]*\))*" + (r"\s*" + BRACED) * n)
             for n, names in NAME_ARGUMENTS.items()]
TABULAR_SPEC = _c(r"\\begin\{(?:(?P<two>tabular\*|tabularx|tabulary)|tabular|longtable|array|tblr|tabu)\}"
                  r"(?P<spec>(?:\s*\[[^\]]*\])?\s*(?(two)" + BRACED + r"\s*)" + BRACED + ")")
TEX_OPTIONS = _c(r"(?:\\[a-zA-Z@]+\*?|\\\\|\\begin\{[^{}]*\})\s*(\[[^\]]*\])")
TEX_SYMBOL = _c(r"\\(leqslant|leqq|leq|le|geqslant|geqq|geq|ge|lt|gt|textless|textgreater|ll|gg|times|cdot|pm|textpm|"
                r"mp|approx|sim|simeq|percent|textminus|textendash|textemdash)(?![A-Za-z])\s*")
SYMBOLS = {"leqslant": "≤", "leqq": "≤", "leq": "≤", "le": "≤",
           "geqslant": "≥", "geqq": "≥", "geq": "≥", "ge": "≥",
           "lt": "<", "gt": ">", "textless": "<", "textgreater": ">", "ll": "<", "gg": ">", "times": "×",
           "cdot": "·", "pm": "±", "textpm": "±", "mp": "±", "approx": "≈", "sim": "~", "simeq": "≈",
           "percent": "%", "textminus": "-", "textendash": "–", "textemdash": "—"}
TEX_JOIN = _c(r"(?<=[0-9.,])(?:\{\}|\\[,!;:> ]|\\thinspace(?![A-Za-z])\s*)+(?=[0-9.,])")
TEX_BRACED_DIGITS = _c(r"(?:(?<=[0-9.,])\{([0-9.,]+)\}|\{([.,])\}(?=[0-9]))")

# Both
DASHES = _c(r"---?")
NUMBER_DASHES = _c(r"(?<=[0-9%])\s*---?\s*(?=[-+]?\.?[0-9])")
ADDRESS = _c(r"<?(?:https?|ftp|file)://[^\s<>\]\)]+|\bwww\.[^\s<>\]\)]+|\bdoi:\s*\S+|\b10\.[0-9]{4,9}/\S+|"
             r"\barXiv[:\s]\s*[0-9]{4}\.[0-9]{4,5}(?:v[0-9]+)?|(?<![0-9.])[0-9]{4}\.[0-9]{5}(?:v[0-9]+)?(?![0-9])",
             re.I)
PATH = _c(r"(?<![\w/.~-])[\w.~-]*/[\w./~-]*")
VERSION = _c(r"(?<![0-9.])[0-9]+(?:\.[0-9]+){2,}(?:[-+.][0-9A-Za-z]+)*|"
             r"(?<=[A-Za-z0-9_\]])\s*(?:==|~=|!=|===)\s*[0-9]+(?:\.[0-9]+)*|"
             r"(?<=[A-Za-z][\w-]{2})(?:>=|<=)[0-9]+(?:\.[0-9]+)*")
VERSION_WORD = _c(r"\b(?:version|ver\.|release|python|py|pytorch|torch|numpy|scipy|pandas|sklearn|scikit-learn|"
                  r"jax|jaxlib|tensorflow|keras|transformers|cuda|cudnn|nccl|ubuntu|debian|centos|macos|ios|android|"
                  r"gcc|clang|llvm|nodejs|java|openjdk|rustc|julia|matlab|lean|mathlib|pip|conda|docker|linux|"
                  r"gpt|llama|claude|gemini|qwen|mistral|mixtral|gemma|deepseek|compat)\b[\s:=-]*v?"
                  r"([0-9]+\.[0-9]+)(?![0-9]|\.[0-9])", re.I)
REFERENCE = _c(r"(?:\b(?:sections?|secs?\.?|tables?|tabs?\.|figures?|figs?\.|equations?|eqs?\.|eqns?\.|lines?|steps?|"
               r"appendix|appendices|app\.|chapters?|chaps?\.|ch\.|theorems?|thms?\.|lemmas?|corollary|corollaries|"
               r"cor\.|propositions?|props?\.|definitions?|defs?\.|remarks?|examples?|algorithms?|algs?\.|listings?|"
               r"footnotes?|experiments?|exps?\.|hypothes[ie]s|stages?)|§§?)\s*"
               r"(?P<refs>\(?[1-9][0-9]*(?:\.[0-9]+)+\)?"  # a dotted number, never 0.x
               r"(?:\s*(?:,|and|&|or|to|–|—|-)\s*\(?[1-9][0-9]*(?:\.[0-9]+)+\)?)*)"
               r"(?![0-9]|\s*%)", re.I)
TIME = _c(r"(?<![0-9.:])[0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?(?![0-9])")
INTERVAL_LEVEL = _c(r"(?<![0-9.])[0-9]+(?:\.[0-9]+)?\s*(?:%|percent\b|per\s?cent\b)(?=[\s-]*(?:CI|C\.I\.|CrI|confidence|"
                    r"credib|prediction|tolerance|HDI|HPD|bootstrap|significance|level|uncertainty|interval))", re.I)
PERCENT_HEADER = _c(r"(?<![0-9.])(?<![0-9.]\s)%")
"""A % that is not a number's: a table's "(%)" heading."""
LATEX_TABLE = _c(r"\\begin\{(table\*?|tabular[*xy]?|longtable|tblr)\}.*?\\end\{\1\}", re.S)

SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
EXPONENT_10 = r"10\s*(?:(?:\^|\*\*)\s*[({]?\s*[-+]?\s*[0-9]+\s*[)}]?|[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)"
NUMBER = _c(
    r"(?<![A-Za-z0-9.])(?<![A-Za-z0-9]_)(?<![A-Za-z]-)"  # not part of a name, of another number, of `GPT-3.5`
    r"(?P<sign>(?<![)\]}/±])[-+])?"
    r"(?:(?P<power>" + EXPONENT_10 + r")"
    r"|(?P<digits>[1-9][0-9]{0,2}(?:,[0-9]{3})+(?:\.[0-9]+)?(?![0-9])"  # 12,345.6
    r"|(?<![0-9],)[0-9]+,[0-9]+(?![0-9]|[.,][0-9])"  # a decimal comma (0,971), not a list (0,1,2)
    r"|[0-9]*\.[0-9]+|[0-9]+)"
    r"(?P<exponent>[eE][-+]?[0-9]+|\s*[×xX·*]\s*" + EXPONENT_10 + r")?)"
    r"(?![0-9]|\.[0-9])"
    r"(?P<unit>[ \t]*(?:(?P<pp>(?:percentage|percent)[\s-]*points?\b|p\.\s?p\.|pp\b|(?P<bare>points?\b|pts?\b))"
    r"|(?P<pct>%|percent\b|per[\s-]?cent\b)"
    r"|(?P<length>(?<=[0-9])(?:pt|mm|cm|in|em|ex|bp|sp|pc|dd)(?![A-Za-z])|\\(?:text|line|column|paper)width|"
    r"\\textheight|\\hsize|\\baselineskip)))?")
RELATION = _c(r"(?<![-=<>])(<=|>=|=<|≤|≥|<|>|≲|≳)\s*$")
RELATIONS = {"<=": "<=", "=<": "<=", "≤": "<=", "≲": "<=", ">=": ">=", "≥": ">=", "≳": ">=", "<": "<", ">": ">"}
RANGE_BETWEEN = _c(r"\s*(?:[–—]|-|to|through|until)\s*")
PAIR_BETWEEN = _c(r"\s*(?:±|\+/-|\+-)\s*")
PARENTHESIS_BEFORE = _c(r"\s*[(\[][^()\[\]0-9]{0,40}")


def stated(text: str, latex: bool = False) -> list[Stated]:
    """The result-like numbers of a Markdown text (or, with `latex`, a LaTeX source: its
    preamble read for macro definitions only), in order, with their line numbers."""
    t = _Text(text)
    t.blank(ENGINE_BLOCK)
    if latex:
        _latex_cleaned(t)
    else:
        t.sub(COMMENT_MARK, " ")
    t.sub(ENTITY, lambda m: html.unescape(m.group(0)).replace("\n", " "))
    t.sub(GROUP_SPACE, "")
    t.sub(ODD_CHARACTER, _plain_character)
    t.blank(ADDRESS)
    if not latex:
        _markdown_cleaned(t)
    t.sub(NUMBER_DASHES, "–")
    for pattern in (VERSION, TIME, INTERVAL_LEVEL):
        t.blank(pattern)
    t.blank(VERSION_WORD, 1)
    t.blank(REFERENCE, "refs")
    return _read(t, latex)


def _plain_character(m: "re.Match[str]") -> str:
    """A character as a reader sees it: another script's digit as 0-9, a look-alike
    sign as ASCII, an invisible character as nothing."""
    ch = m.group(0)
    if ch in LOOKALIKE:
        return LOOKALIKE[ch]
    if unicodedata.category(ch) == "Cf":
        return ""
    digit = unicodedata.decimal(ch, None)
    if digit is not None:
        return str(digit)
    return " " if unicodedata.category(ch) == "Zs" else ch


def _markdown_cleaned(t: _Text) -> None:
    t.sub(MD_ESCAPE, [1])
    t.sub(TAG, lambda m: "" if m.group(1).lower() in INLINE_TAGS else " ")
    t.sub(FENCE_OR_CODE, _code_span)
    t.blank(LINK_TARGET, 1)
    t.blank(LINK_DEFINITION, 1)
    t.blank(HEADING_NUMBER, 1)
    t.sub(PATH, lambda m: " " if _is_path(m.group(0)) else m.group(0))


def _code_span(m: "re.Match[str]") -> str:
    """A fenced block is read as it is; an inline span that is a path or a command is not."""
    if m.group("fence"):
        return m.group(0)
    words = m.group("code").split()
    command = len(words) > 1 and any(re.match(r"--?[A-Za-z]", w) or _is_path(w) or FILE_NAME.search(w) for w in words)
    path = len(words) == 1 and ("/" in words[0] or FILE_NAME.search(words[0]) is not None)
    return " " * len(m.group(0)) if command or path else m.group(0)


def _is_path(word: str) -> bool:
    """A file path: several folders, an absolute or home path, or a file name at its end."""
    return "/" in word and re.search(r"[A-Za-z]", word) is not None and (
        word.count("/") >= 2 or word[0] in "/.~" or FILE_NAME.search(word.rstrip("/.,;:)")) is not None)


def _latex_cleaned(t: _Text) -> None:
    t.blank(TEX_COMMENT)
    t.blank(TEX_HIDDEN)
    _blank_preamble(t)
    t.blank(LAYOUT_DEFINITION)
    for pattern, printed in SIUNITX:
        t.sub(pattern, printed)
    t.blank(TABULAR_SPEC, "spec")
    for pattern in TEX_NAMES:
        t.blank(pattern)  # `\\href{address}{text}` loses its address only
    t.blank(TEX_OPTIONS, 1)
    t.sub(TEX_SYMBOL, lambda m: SYMBOLS[m.group(1)])
    t.sub(_c(r"\\%"), "%")
    t.sub(_c(r"(?<!\\)\$"), "")
    t.sub(_c(r"~|\\\\"), " ")
    t.sub(TEX_JOIN, "")
    t.sub(TEX_BRACED_DIGITS, lambda m: [1] if m.group(1) is not None else [2])
    t.sub(DASHES, lambda m: "—" if len(m.group(0)) == 3 else "–")


def _blank_preamble(t: _Text) -> None:
    """Blank what comes before `\\begin{document}` but the lines of macro definitions
    (`\\newcommand{\\acc}{0.971}` states its number wherever the macro is used)."""
    head_end = t.s.find("\\begin{document}")
    if head_end < 0:
        return
    spans, start, depth = [], 0, 0
    for line in t.s[:head_end].split("\n"):
        if depth > 0 or DEFINITION.search(line):
            depth = max(0, depth + len(re.findall(r"(?<!\\)\{", line)) - len(re.findall(r"(?<!\\)\}", line)))
        elif line.strip():
            spans.append((start, start + len(line)))
        start += len(line) + 1
    for a, b in reversed(spans):
        t.s, t.at = t.s[:a] + " " + t.s[b:], t.at[:a] + [t.at[a]] + t.at[b:]


def _unit(unit: str) -> str:
    return "%" if "\\percent" in unit or "%" in unit else " "


# --- the numbers -----------------------------------------------------------------------

@dataclass
class _Token:
    shown: int
    """Where its written form starts (a bound's relation included)."""
    start: int
    end: int
    value: float
    tolerance: float
    signed: bool
    integer: bool
    unit: str
    bare_points: bool
    relation: str
    kind: str = "value"


def _read(t: _Text, latex: bool) -> list[Stated]:
    text = t.s
    code = [m.span() for m in FENCE.finditer(text)] if not latex else []
    percent_tables = _percent_tables(text, latex)
    tokens: list[_Token] = []
    for m in NUMBER.finditer(text):
        if m.group("length") and latex:
            continue  # a length
        token = _token(m, text, code)
        if token is not None:
            tokens.append(token)
    _pair_up(tokens, text)
    found = []
    newlines = [i for i, ch in enumerate(t.original) if ch == "\n"]
    for k in tokens:
        if k.unit == "" and any(a <= k.start < b for a, b in percent_tables) and _a_cell(text, k, latex):
            k.unit = "%"
        if k.integer and not (k.unit == "%" or (k.unit == "pp" and not k.bare_points)):
            continue  # a count, a year, a size, a seed
        kind = k.kind if k.kind != "value" else {"%": "percent", "pp": "points"}.get(k.unit, "value")
        start = t.at[k.start]
        found.append(Stated(line=bisect.bisect_right(newlines, start - 1) + 1, written=t.written(k.shown, k.end).strip(),
                            kind=kind, value=k.value, tolerance=k.tolerance, signed=k.signed, unit=k.unit,
                            relation=k.relation))
    return found


NUMBERS_ONLY = re.compile(r"[\s\d.,+\-\u2212\u2013\u2014\u00b1()\[\]~$\\{}%*_]*(?:\bto\b[\s\d.,+\-()\[\]~$%*_]*)?")
"""A cell of numbers alone: one value, a range (`83.7–87.2`), a value with its interval."""


def _a_cell(text: str, k: "_Token", latex: bool) -> bool:
    """The number is in a cell of numbers (`| 84.2 |`, `| 83.7–87.2 |`, `& 84.2`), not in a
    label (`| seed 4 |`): only a table's values are in the unit its heading gives. (In LaTeX,
    `\\\\` is gone by now: a value cell follows a `&`.)"""
    if latex:  # the cell's first number follows its `&`; a range's second, the first
        return re.search(r"&\s*(?:\\(?:textbf|textit|emph|mathbf|underline)\s*\{)?\$?"
                         r"(?:[\d.,]+\$?\s*(?:--|\u2013|-|to)\s*\$?)?$", text[:k.shown]) is not None
    before = max(text.rfind("|", 0, k.shown), text.rfind("\n", 0, k.shown))
    after = min((i for i in (text.find("|", k.end), text.find("\n", k.end)) if i >= 0), default=len(text))
    return NUMBERS_ONLY.fullmatch(text[before + 1:after].strip()) is not None


def _token(m: "re.Match[str]", text: str, code: list[tuple[int, int]]) -> _Token | None:
    sign = m.group("sign") or ""
    start = m.start()
    if m.group("power"):
        mantissa, decimals, exponent = "1", 0, _exponent(m.group("power"))
    else:
        digits = m.group("digits")
        if "," in digits and "." not in digits and not re.fullmatch(r"[1-9][0-9]{0,2}(?:,[0-9]{3})+", digits):
            # a decimal comma: not in code, and not a pair such as (0,1)
            inside_code = any(a <= start < b for a, b in code)
            pair = text[start - 1:start] in "([" and text[m.end("digits"):m.end("digits") + 1] in ")]" and start > 0
            if inside_code or pair:
                return None
            digits = digits.replace(",", ".")
        else:
            digits = digits.replace(",", "")
        mantissa = digits
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        exponent = _exponent(m.group("exponent")) if m.group("exponent") else 0
    integer = decimals == 0 and exponent >= 0
    unit = "pp" if m.group("pp") else "%" if m.group("pct") else ""
    end = m.end()
    if m.group("bare") and integer:
        unit, end = "", m.start("unit")  # "12 points" is a count
    value = float(f"{mantissa}e{exponent}")
    relation = RELATION.search(text[max(0, start - 4):start])
    return _Token(shown=start - len(relation.group(0)) if relation else start, start=start, end=end,
                  value=-value if sign == "-" else value, tolerance=float(f"5e{exponent - decimals - 1}"),
                  signed=bool(sign), integer=integer, unit=unit, bare_points=bool(m.group("bare")),
                  relation=RELATIONS[relation.group(1)] if relation else "", kind="bound" if relation else "value")


def _exponent(written: str) -> int:
    """The power of ten of `e-4`, `× 10^{-14}`, `·10⁻¹⁴`, `10**-3`."""
    written = written.translate(SUPERSCRIPTS)
    if written[:1] in "eE":
        return int(written[1:])
    power = re.search(r"10\s*(?:\^|\*\*)?\s*[({]?\s*([-+]?)\s*([0-9]+)", written)
    assert power is not None
    return int(power.group(1) + power.group(2))


def _pair_up(tokens: list[_Token], text: str) -> None:
    """Ranges (`87.6–91.6%`, `7.7 to 13.2`), intervals (`[0.71, 0.75]`) and `±` pairs share
    a unit written once; a range in parentheses after a number takes that number's unit
    (`10.4 pp (7.7 to 13.2)`)."""
    for i in range(len(tokens) - 1):
        a, b = tokens[i], tokens[i + 1]
        between = text[a.end:b.start]
        ranged = RANGE_BETWEEN.fullmatch(between) is not None
        interval = (re.fullmatch(r"\s*[,;]\s*", between) is not None
                    and re.search(r"[(\[]\s*$", text[max(0, a.start - 4):a.start]) is not None
                    and re.match(r"\s*[)\]]", text[b.end:]) is not None)
        paired = PAIR_BETWEEN.fullmatch(between) is not None
        if not (ranged or interval or paired) or a.kind == "bound" or b.kind == "bound":
            continue
        if ranged or interval:
            a.kind = b.kind = "range_end"
        if a.unit and not b.unit:
            b.unit = a.unit
        elif b.unit and not a.unit:
            a.unit = b.unit
        if (ranged or interval) and not a.unit and i > 0:
            before = tokens[i - 1]
            if before.unit and PARENTHESIS_BEFORE.fullmatch(text[before.end:a.start]):
                a.unit = b.unit = before.unit


def _percent_tables(text: str, latex: bool) -> list[tuple[int, int]]:
    """The spans of tables headed by a % (`Accuracy (%)`), whose numbers are percentages."""
    spans = []
    if latex:
        for m in LATEX_TABLE.finditer(text):
            if PERCENT_HEADER.search(m.group(0)):
                spans.append(m.span())
        return spans
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    i = 0
    while i < len(lines) - 1:
        if "|" in lines[i] and re.match(r"^\s*\|?\s*:?-{2,}", lines[i + 1]):
            j = i + 2
            while j < len(lines) and "|" in lines[j]:
                j += 1
            if PERCENT_HEADER.search(lines[i]):
                spans.append((offsets[i], offsets[j] - 1))
            i = j
        else:
            i += 1
    return spans

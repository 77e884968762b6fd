"""Research idea files: NeuriCo's idea schema v1.1, as NeuriCo's own files use it.

An idea file is YAML with one top-level key, `idea:`. The schema (NeuriCo's
`ideas/schema.yaml`) is the guide, but real idea files stray from it, and those files must load
unchanged: `constraints.budget` may be a string such as "$50", `expected_outputs[].type` is
free text (`benchmark`, `proof`, ...), and any section may carry keys the schema does not name
(they are kept). What the schema does constrain (lengths, enums, ranges) is checked, so a bad
idea is refused before anything runs, with one line that names the file, the YAML line and the
field: `ideas/x.yaml:12: idea.hypothesis: must be at least 20 characters (got 7)`.

This module is imported by the CLI and the flow alike, so it stays light: no Prefect here.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from labrun import suggest

# NeuriCo's domains (its config/domains.yaml), plus computational_biology. A domain outside
# this list is allowed, as in NeuriCo, and gets the general guidance with a warning.
KNOWN_DOMAINS: tuple[str, ...] = (
    "artificial_intelligence",
    "machine_learning",
    "data_science",
    "nlp",
    "computer_vision",
    "reinforcement_learning",
    "systems",
    "theory",
    "mathematics",
    "mathematics_lean",
    "finance",
    "battery",
    "scientific_computing",
    "particle_physics",
    "computational_biology",
)
GENERAL_DOMAIN = "general"


class IdeaError(Exception):
    """An idea file that cannot be used. `str()` is one line: the first problem, in file order,
    and how many more there are; `problems` holds every problem, one line each."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)


# ── value parsers ────────────────────────────────────────────────────────────────────────

_USD = re.compile(
    r"(?:US)?\$?\s*"  # "$50", "US$50"
    r"(?P<amount>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"  # 1,200.50 or 1200.50
    r"\s*(?:USD|dollars?)?",  # "50 USD"
    re.IGNORECASE,
)


def _parse_usd(value: Any) -> Any:
    """A budget as NeuriCo's files write it: 50, 12.5, "50", "$50", "$1,200.50", "50 USD".
    NeuriCo itself crashes on "$50"; here every one of these is a float in USD."""
    if isinstance(value, bool):
        raise ValueError(f"must be an amount in USD such as 50 or \"$50\" (got {_show(value)})")
    if isinstance(value, str):
        match = _USD.fullmatch(value.strip())
        if not match:
            raise ValueError(
                f"must be an amount in USD such as 50 or \"$50\" (got {_show(value)})"
            )
        return float(match["amount"].replace(",", ""))
    return value  # numbers (and wrong types) go on to pydantic's own float checks


def _not_bool(value: Any) -> Any:
    # YAML reads `yes`/`true` as a bool, and pydantic would take a bool as the integer 1.
    if isinstance(value, bool):
        raise ValueError(f"must be an integer (got {_show(value)})")
    return value


def _memory_size(value: Any) -> Any:
    if isinstance(value, str) and not re.fullmatch(r"[0-9]+(GB|MB)", value):
        raise ValueError(f"must be a size such as 8GB or 512MB (got {_show(value)})")
    return value


def _date_as_text(value: Any) -> Any:
    # An unquoted `created_at: 2024-05-01` is a date to YAML; the schema wants a string.
    return value.isoformat() if isinstance(value, date) else value


def _env_name(value: Any) -> Any:
    from labrun.keys import ENV_NAME

    if isinstance(value, str) and not ENV_NAME.fullmatch(value):
        raise ValueError(f"must be the name of an environment variable, such as OPENAI_API_KEY (got {_show(value)})")
    return value


def _domain(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip().lower().removeprefix("*.").rstrip(".")
        if re.fullmatch(r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}", value):
            return value
    raise ValueError(f"must be a domain name such as pypi.org (got {_show(value)})")


Domain = Annotated[str, BeforeValidator(_domain)]
Usd = Annotated[float, BeforeValidator(_parse_usd), Field(ge=0, allow_inf_nan=False)]
EnvName = Annotated[str, BeforeValidator(_env_name)]
Seconds = Annotated[int, BeforeValidator(_not_bool), Field(ge=60, le=86400)]
Memory = Annotated[str, BeforeValidator(_memory_size)]


# ── the schema ───────────────────────────────────────────────────────────────────────────


class _Section(BaseModel):
    # Keys the schema does not name are kept: real idea files carry them (metadata.notes,
    # metadata.paper_style, ...), and they still mean something to the agent.
    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True, str_strip_whitespace=True)


class Paper(_Section):
    url: str | None = None
    path: str | None = None
    description: str

    @model_validator(mode="after")
    def _url_or_path(self) -> Paper:
        if not (self.url or self.path):
            raise ValueError("a paper needs a 'url' or a 'path'")
        return self


class Dataset(_Section):
    name: str
    source: str
    description: str | None = None
    size: str | None = None


class CodeReference(_Section):
    repo: str
    description: str
    branch: str | None = None


class Background(_Section):
    description: str | None = None
    papers: list[Paper] | None = None
    datasets: list[Dataset] | None = None
    code_references: list[CodeReference] | None = None


class Methodology(_Section):
    approach: str | None = None
    steps: list[str] | None = None
    baselines: list[str] | None = None
    metrics: list[str] | None = None


class Constraints(_Section):
    compute: Literal["cpu_only", "gpu_required", "multi_gpu", "tpu", "any"] | None = None
    time_limit: Seconds = 3600  # seconds; the schema's default
    memory: Memory | None = None
    budget: Usd | None = None  # USD, whatever form the file wrote it in: the experiments' money
    dependencies: list[str] | None = None
    # labrun's own keys (NeuriCo's schema lets constraints carry more):
    agent_budget: Usd | None = None
    """The limit on the agent's own model use, in USD (`--budget-usd` overrides it)."""
    api_keys: list[EnvName] | None = None
    """Environment variables the experiments need (API keys, tokens), by name."""
    network: bool | None = None  # labrun's: false runs the agent's commands without network
    allowed_domains: list[Domain] | None = None
    """labrun's: the only domains agent commands may reach (each with its subdomains)."""
    parallel_attempts: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=64)] | None = None
    """labrun's: experiment attempts that may run at once (4 unless set; never more than the CPUs)."""
    experiments_pool: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[\w.-]+$")] | None = None
    """labrun's: the Prefect work pool every experiment attempt runs on (`--experiments-pool` overrides it)."""
    reproduce_minutes: Annotated[float, BeforeValidator(_not_bool), Field(ge=0, le=1440, allow_inf_nan=False)] | None = None
    """labrun's: how long the engine may spend rerunning the attempts behind the claims
    (60 unless set; 0 turns reproduction off)."""
    reproduce_tolerance: Annotated[float, BeforeValidator(_not_bool), Field(ge=0, lt=1)] | None = None
    """labrun's: the relative difference within which a rerun's metric counts as the same
    (0.001 unless set)."""


class ExpectedOutput(_Section):
    type: str  # free text: NeuriCo's own files use benchmark, proof, error_analysis, ...
    format: str
    fields: list[str] | None = None
    description: str | None = None


def _phase_names(value: Any) -> Any:
    """`with_phases: [resources, paper]` or `"resources,paper"`; each a known optional phase."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        from labrun.phase_registry import phase_list

        phase_list(value)  # a ValueError naming the unknown phase and the known ones
    return value


def _review_names(value: Any) -> Any:
    """`review_after: [planning, analysis]` or `"planning,analysis"`; each a phase labrun knows
    (whether the session has it is checked when it starts)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        from labrun.phase_registry import BY_KEY

        for name in value:
            if name not in BY_KEY:
                raise ValueError(suggest.unknown("phase", name, BY_KEY))
    return value


def _inside_path(value: Any) -> Any:
    if isinstance(value, str) and (value.startswith("/") or ".." in Path(value).parts or not value.strip()):
        raise ValueError("must be a path inside the workspace (relative, without '..')")
    return value


class SealedEvaluation(_Section):
    """labrun's: a scorer and held-out data that the agent never sees; the engine scores the
    artifact with them after the experiments (`labrun.sealed`)."""

    scorer: str
    """A program (a `.py` one runs with `python`), relative to the idea file or absolute,
    outside the workspace. It is run as `scorer ARTIFACT DATA SCORE_JSON` and writes its
    scores, a JSON object of numbers, to SCORE_JSON."""
    python: str | None = None
    """The Python a `.py` scorer runs with (one with the packages it imports), relative to the
    idea file or absolute, outside the workspace and not under /tmp; labrun's own Python
    unless set. Never the workspace's: the agent could write that one."""
    data: str | None = None
    """The held-out data, a file or a folder, relative to the idea file or absolute."""
    artifact: Annotated[str, BeforeValidator(_inside_path)]
    """The workspace file the scorer reads (predictions, a model file)."""
    description: str | None = None
    """What the artifact must hold, for the agent."""
    criteria: list[Annotated[str, Field(pattern=r"^C[1-9]\d*$")]] | None = None
    """The evaluation criteria the sealed score decides (C1, C2, … in the order the idea lists
    them): the engine judges their planned checks on it, whatever the agent named its metrics."""
    tolerance: Annotated[float, Field(ge=0)] | None = None
    """How far, as a relative difference, a claim's value may be from the sealed score of the
    same name before the engine shows it contradicted (0.05 unless set)."""


class Metadata(_Section):
    author: str | None = None
    created_at: Annotated[str, BeforeValidator(_date_as_text)] | None = None
    tags: list[str] | None = None
    priority: Literal["low", "medium", "high", "urgent"] | None = None
    estimated_duration: str | None = None
    related_ideas: list[str] | None = None
    # Not in NeuriCo's schema, which lets metadata carry more keys: the optional phases this
    # idea asks for (labrun's `--with`).
    with_phases: Annotated[list[str], BeforeValidator(_phase_names)] | None = None
    paper_style: str | None = None  # NeuriCo's own key ("ams" in its mathematics ideas)
    notes: str | None = None  # NeuriCo's own key, in most of its ideas: free text for the agent
    review_after: Annotated[list[str], BeforeValidator(_review_names)] | None = None
    """labrun's: the phases a person reviews once they complete (`--review-after`)."""


class Idea(_Section):
    """The `idea:` mapping of an idea file, plus what `load_idea` learnt about the file."""

    title: str = Field(min_length=10, max_length=200)
    domain: str = Field(min_length=1)
    hypothesis: str = Field(min_length=20)
    background: Background | None = None
    methodology: Methodology | None = None
    constraints: Constraints = Field(default_factory=Constraints)
    expected_outputs: list[ExpectedOutput] | None = None
    evaluation_criteria: list[str] | None = Field(default=None, min_length=1)
    metadata: Metadata | None = None
    comments: str | None = None
    sealed_evaluation: SealedEvaluation | None = None  # labrun's

    _path: str | None = PrivateAttr(default=None)
    _content_hash: str = PrivateAttr(default="")
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def path(self) -> str | None:
        """The file it was loaded from, as given to `load_idea`."""
        return self._path

    @property
    def content_hash(self) -> str:
        """sha256 (hex) of the file's bytes: the same idea is the same content."""
        return self._content_hash

    @property
    def warnings(self) -> list[str]:
        """Problems that do not stop a run, such as an unknown domain."""
        return self._warnings

    @property
    def budget_usd(self) -> float | None:
        """The experiments' spending limit (`constraints.budget`): money for API calls and
        paid compute that the runs make, not the agent's own model use."""
        return self.constraints.budget

    @property
    def with_phases(self) -> list[str]:
        """The optional phases the idea asks for (`metadata.with_phases`)."""
        return list(self.metadata.with_phases or []) if self.metadata else []

    @property
    def review_after(self) -> list[str]:
        """The phases the idea asks a person to review (`metadata.review_after`)."""
        return list(self.metadata.review_after or []) if self.metadata else []

    @property
    def paper_style(self) -> str | None:
        """The paper style the idea asks for, if labrun has it (else a warning says so)."""
        from labrun.paper import style_names

        wanted = self.metadata.paper_style if self.metadata else None
        return wanted if wanted in style_names() else None

    @property
    def agent_budget_usd(self) -> float | None:
        """The limit on the agent's own model use (`constraints.agent_budget`, labrun's)."""
        return self.constraints.agent_budget

    @property
    def api_keys(self) -> list[str]:
        """The environment variables the idea's experiments need (`constraints.api_keys`)."""
        return list(self.constraints.api_keys or ())

    @property
    def guidance_domain(self) -> str:
        """The domain whose guidance the prompts use: the idea's own if known, else general."""
        domain = _normal_domain(self.domain)
        return domain if domain in KNOWN_DOMAINS else GENERAL_DOMAIN

    @property
    def slug(self) -> str:
        """A short, filesystem-safe name made from the title."""
        return slugify(self.title)

    def as_prompt_dict(self) -> dict[str, Any]:
        """The idea as plain data (str, numbers, lists, dicts) for prompt templates; no None."""
        # where the sealed files are is not the agent's
        return self.model_dump(mode="json", exclude_none=True,
                               exclude={"sealed_evaluation": {"scorer", "python", "data"}})


class _IdeaFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    idea: Idea


# ── loading ──────────────────────────────────────────────────────────────────────────────


def load_idea(path: str | os.PathLike[str]) -> Idea:
    """Read and validate an idea file. Raises `IdeaError` (one line: file, line, field,
    problem) if it cannot be used; warnings that do not stop a run are in `Idea.warnings`."""
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise IdeaError(name, [f"{name}: file not found"]) from None
    except IsADirectoryError:
        raise IdeaError(name, [f"{name}: is a directory, not an idea file"]) from None
    except OSError as e:
        raise IdeaError(name, [f"{name}: cannot read: {e.strerror or e}"]) from None
    return parse_idea(data, name)


def parse_idea(data: bytes, name: str = "<idea>") -> Idea:
    """Validate an idea file's bytes; `name` stands for the file in messages."""
    root, doc = _parse_yaml(data, name)
    if root is None:
        raise IdeaError(name, [f"{name}: file is empty: expected a mapping with an 'idea:' key"])
    where = f"{name}:{_line(root)}"
    if not isinstance(doc, dict):
        raise IdeaError(
            name, [f"{where}: top level must be a mapping with an 'idea:' key (got {_show(doc)})"]
        )
    if "idea" not in doc:
        raise IdeaError(
            name, [f"{where}: idea: field required (an idea file's fields go under 'idea:')"]
        )
    try:
        idea = _IdeaFile.model_validate(doc).idea
    except ValidationError as e:
        raise IdeaError(name, _problems(e, root, name)) from None

    idea._path = name
    idea._content_hash = hashlib.sha256(data).hexdigest()
    idea._warnings = _warnings(idea, doc, root)
    return idea


def _parse_yaml(data: bytes, name: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data, from one parse."""
    if b"\x00" in data:
        raise IdeaError(name, [f"{name}: binary file, not YAML text"])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise IdeaError(
            name, [f"{name}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})"]
        ) from None
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{name}:{mark.line + 1}" if mark else name
        problem = ", ".join(part for part in (e.context, e.problem) if part) or "cannot parse"
        raise IdeaError(name, [_one_line(f"{where}: invalid YAML: {problem}")]) from None
    except yaml.YAMLError as e:  # the reader's complaints (control characters) carry no mark
        line = text[: getattr(e, "position", 0)].count("\n") + 1
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise IdeaError(name, [_one_line(f"{name}:{line}: invalid YAML: {first}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


# ── errors and warnings ──────────────────────────────────────────────────────────────────

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
}
_MESSAGES = {
    **{kind: f"must be {what} (got {{got}})" for kind, what in _EXPECTED.items()},
    "string_too_short": "must be at least {min_length} characters (got {length})",
    "string_too_long": "must be at most {max_length} characters (got {length})",
    "too_short": "must have at least {min_length} item(s) (got {actual_length})",
    "literal_error": "must be one of {expected} (got {got})",
    "greater_than_equal": "must be at least {ge} (got {got})",
    "less_than_equal": "must be at most {le} (got {got})",
    "invalid_key": "keys must be strings (got {got})",
}
"""What an idea's error line says for pydantic's error types: the error's context by name,
`got` the value as `_show` shows it, `length` the length of its text."""


def _problems(error: ValidationError, root: yaml.Node, name: str) -> list[str]:
    """One line per pydantic error, `file:line: field: problem`, in file order."""
    found = []
    for err in error.errors():
        field, line = _locate(root, err["loc"], missing=err["type"] == "missing")
        found.append((line, _one_line(f"{name}:{line}: {field}: {_message(err)}")))
    found.sort(key=lambda pair: pair[0])  # stable: pydantic's order within a line
    return [text for _, text in found]


def _message(err: dict[str, Any]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "field required"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind in _MESSAGES:
        return _MESSAGES[kind].format(**{"actual_length": None, **ctx}, got=_show(got), length=len(str(got)))
    return err["msg"][:1].lower() + err["msg"][1:]


def _locate(root: yaml.Node, loc: tuple[Any, ...], missing: bool) -> tuple[str, int]:
    """The dotted field name and YAML line for a pydantic `loc`. Walks the node tree as far
    as the path exists; a missing field is reported at the line of its parent's key."""
    parts: list[Any] = []
    node, line = root, _line(root)
    for i, key in enumerate(loc):
        child = _child(node, key)
        if child is None:
            if missing and i == len(loc) - 1:
                parts.append(str(key))
            break  # the rest of `loc` is pydantic's bookkeeping (union tags and the like)
        parts.append(key if isinstance(node, yaml.SequenceNode) else str(key))  # int: an index
        line, node = child
    return _dotted(parts), line


def _child(node: yaml.Node, key: Any) -> tuple[int, yaml.Node] | None:
    """(line, value node) of `key` in a mapping node, or of index `key` in a sequence node."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in reversed(node.value):  # a duplicate key: the last one wins
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(key):
                return _line(key_node), value_node
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
        item = node.value[key]
        return _line(item), item
    return None


def _warnings(idea: Idea, doc: dict[str, Any], root: yaml.Node) -> list[str]:
    found = []
    if idea.guidance_domain == GENERAL_DOMAIN and _normal_domain(idea.domain) != GENERAL_DOMAIN:
        found.append(f"{suggest.unknown('domain', idea.domain, KNOWN_DOMAINS, listed=False)}: using general guidance")
    wanted = idea.metadata.paper_style if idea.metadata else None
    if wanted and idea.paper_style is None:
        from labrun.paper import DEFAULT_STYLE, style_names

        found.append(f"{suggest.unknown('paper style', wanted, style_names(), 'styles')} (metadata.paper_style): "
                     f"using {DEFAULT_STYLE!r}")
    for key in doc:
        if key != "idea":
            found.append(
                f"unknown top-level key {str(key)!r} ignored: idea fields go under 'idea:'"
            )
    found += _duplicate_keys(root, [])
    found += [text for _, text in sorted(_unknown_keys(idea, ("idea",), root))]
    return found


def _unknown_keys(section: BaseModel, loc: tuple[Any, ...], root: yaml.Node) -> list[tuple[int, str]]:
    """(line, warning) for each key the schema does not name. Such a key is kept for the
    agent, but is most often a misspelt one (`constraint:`) whose setting would silently do
    nothing: say which, and the known key it is near."""
    found = []
    known = list(type(section).model_fields)
    for key in section.model_extra or {}:
        field, line = _locate(root, (*loc, key), missing=False)
        found.append((line, f"line {line}: unknown key {field!r}{suggest.hint(str(key), known)}: "
                            "kept for the agent, unused by labrun"))
    for name in known:
        value = getattr(section, name)
        for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if isinstance(item, BaseModel):
                found += _unknown_keys(item, (*loc, name) if i is None else (*loc, name, i), root)
    return found


def _duplicate_keys(node: yaml.Node, path: list[Any]) -> list[str]:
    """PyYAML keeps the last of two equal keys without a word; say so."""
    found = []
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key in seen:
                found.append(
                    f"line {_line(key_node)}: duplicate key {_dotted([*path, key])!r}: "
                    "only the last one is used"
                )
            seen.add(key)
            found += _duplicate_keys(value_node, [*path, key])
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, [*path, i])
    return found


# ── small helpers ────────────────────────────────────────────────────────────────────────


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _dotted(parts: list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _show(value: Any) -> str:
    """A value as a message shows it: short, YAML-flavoured, on one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


def _normal_domain(domain: str) -> str:
    # "Machine Learning" and "machine-learning" both mean machine_learning.
    return re.sub(r"[\s-]+", "_", domain.strip().lower())


def slugify(title: str, max_len: int = 48) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+", ascii_title.lower().replace("'", ""))  # Gauss's -> gausss
    slug = ""
    for word in words:
        longer = f"{slug}-{word}" if slug else word
        if len(longer) > max_len:
            break
        slug = longer
    return slug or (words[0][:max_len] if words else "idea")

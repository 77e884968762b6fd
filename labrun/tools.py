"""The agent's tools (docs/design.md, contract): the same six for every backend.

`ToolBox.call` takes a tool name and its input as the model sent them and returns the text
the model will read. It never raises for the model's mistakes: a bad input is an error
result the agent can act on.
"""

from __future__ import annotations

import functools
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Protocol

from pydantic import BaseModel, Field, ValidationError, create_model

from labrun.commands import run_command
from labrun import gpus
from labrun.plan import PLAN_FIELDS, coverage
from labrun.resources import TEMPLATES
from labrun.secrets import redact
from labrun.phase_registry import Phase, section_titles
from labrun.wsfs import Refused, agent_path

if TYPE_CHECKING:
    from labrun.session import Session
    from labrun.state import Attempt

TOOL_DOCS = TEMPLATES / "tools"
BASH_TIMEOUT_S = 600
BASH_MAX_OUTPUT = 50_000_000
VIEW_MAX_CHARS = 40_000
VIEW_MAX_BYTES = 64_000_000
"""The most of a file the editor reads to show a part of it."""
VIEW_MAX_ENTRIES = 1000
"""The most entries of a folder the editor lists."""


NOT_EVIDENCE = ("No result may cite this attempt's metrics or files: write the metrics file (and the figures) from "
                "the code that computes them, run by this same attempt.")


class RunExperimentInput(BaseModel):
    command: str = Field(description="Shell command to run in the workspace root.")
    purpose: str = Field(description="What this attempt tests, in one sentence.")
    outputs: list[str] = Field(default_factory=list, description="Files the run must produce.")
    metrics_file: str | None = Field(default=None, description="JSON file of metrics it writes.")
    fix_applied: str | None = Field(default=None, description="After a failure: what you changed.")
    run_id: str | None = Field(default=None, description="The id of the planned run this attempt serves (R1, …).")
    run_in_background: bool = Field(default=False, description=(
        "True: return at once with the attempt's number; follow it with experiment_output."))
    gpus: int = Field(default=0, ge=0, description="GPUs the attempt gets for itself (0: it sees none).")


class ExperimentOutputInput(BaseModel):
    attempt: int = Field(description="The attempt's number.")
    wait_s: int = Field(default=0, ge=0, le=600, description="Seconds to wait for it to end (at most 600).")


class StopExperimentInput(BaseModel):
    attempt: int = Field(description="The number of a running attempt.")


def complete_phase_input(phases: Iterable[str] | None = None) -> type[BaseModel]:
    """`complete_phase`'s input: a summary, and one optional markdown field per STATE
    section that one of `phases` gives (default: every registered phase)."""
    return _complete_phase_input(tuple(section_titles(phases)))


@functools.cache
def _complete_phase_input(section_keys: tuple[str, ...]) -> type[BaseModel]:
    sections = create_model("Sections", **{k: (str | None, None) for k in section_keys})
    return create_model(
        "CompletePhaseInput",
        summary=(str, Field(description="What this phase achieved, in a few sentences.")),
        sections=(sections, Field(default_factory=sections, description="STATE.md sections (markdown).")),
        **PLAN_FIELDS,
    )


class BashInput(BaseModel):
    command: str | None = None
    restart: bool = False


class EditorInput(BaseModel):
    command: Literal["view", "create", "str_replace", "insert"]
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    insert_text: str | None = None
    view_range: list[int] | None = None


def tool_specs(phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The tool definitions sent to the model; part of every phase's version. `phases`: the
    session's, whose sections `complete_phase` takes (default: every registered phase's)."""

    return [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        _custom_tool("run_experiment", RunExperimentInput),
        _custom_tool("experiment_output", ExperimentOutputInput),
        _custom_tool("stop_experiment", StopExperimentInput),
        _custom_tool("complete_phase", complete_phase_input(None if phases is None else tuple(phases))),
    ]


@functools.cache
def _custom_tool(name: str, model: type[BaseModel]) -> dict[str, Any]:
    """Made once a process: pydantic builds a schema again at each call, and every phase's
    turns ask for the tools. Read only: the model APIs' clients serialize it."""
    return {"name": name, "description": (TOOL_DOCS / f"{name}.md").read_text().strip(),
            "input_schema": model.model_json_schema()}


@dataclass
class ToolResult:
    content: str
    is_error: bool = False


class ToolError(Exception):
    """A mistake of the agent's, reported back to it as an error result."""


class Experiments(Protocol):
    """A phase's experiment attempts, each the phase layer's Prefect subtask
    (`labrun.phases.attempts.PhaseAttempts`)."""

    def run(self, inp: RunExperimentInput) -> "Attempt":
        """Attempt n started: ended when it returns, or RUNNING with `inp.run_in_background`."""

    def output(self, n: int, wait_s: float) -> tuple["Attempt", str]:
        """Attempt n after waiting up to `wait_s` for its end, and its output since the last call."""

    def stop(self, n: int) -> "Attempt":
        """Running attempt n ended, recorded as stopped by the agent."""

    def running(self) -> list[int]:
        """This phase's attempts still running."""

    def ended_since(self) -> list["Attempt"]:
        """Background attempts that ended since the last call, each told once."""

    def watch(self, call: Callable[[], str]) -> str:
        """`call()`, one of the agent's own tools that may write, noting when it ran."""


class ToolBox:
    def __init__(self, session: "Session", phase: Phase, experiments: Experiments):
        self.session = session
        self.phase = phase
        self.experiments = experiments
        self.root = session.ws.root
        self.completed: str | None = None
        """The summary, once `complete_phase` succeeded."""
        self.calls = 0

    def call(self, name: str, raw_input: dict[str, Any]) -> ToolResult:
        self.calls += 1
        handler = {
            "bash": (BashInput, self.bash),
            "str_replace_based_edit_tool": (EditorInput, self.edit),
            "run_experiment": (RunExperimentInput, self.run_experiment),
            "experiment_output": (ExperimentOutputInput, self.experiment_output),
            "stop_experiment": (StopExperimentInput, self.stop_experiment),
            "complete_phase": (complete_phase_input(), self.complete_phase),
        }.get(name)
        if handler is None:
            return ToolResult(f"Unknown tool {name!r}.", is_error=True)
        self.session.ws.check_disk()  # DiskFull stops the phase: no step starts on a full disk
        schema, fn = handler
        try:
            inp = schema.model_validate(raw_input)
            # When the agent's own commands that may write ran, for the attempts running
            # meanwhile (`Experiments.watch`).
            writes = name == "bash" or (name == "str_replace_based_edit_tool" and inp.command != "view")
            text = self.experiments.watch(lambda: fn(inp)) if writes else fn(inp)
            return ToolResult(redact(text + self._ended_note()))
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'input'}: {err['msg']}" for err in e.errors()
            )
            return ToolResult(f"Invalid input for {name}: {problems}", is_error=True)
        except ToolError as e:
            return ToolResult(redact(str(e)), is_error=True)

    # -- tools -----------------------------------------------------------------------------

    def bash(self, inp: BashInput) -> str:
        if inp.restart:
            return "Shell restarted. Each command runs in a fresh shell in the workspace root."
        if not inp.command:
            raise ToolError("bash needs a command (or restart: true)")
        log = self.session.ws.tmp / "bash.log"
        result = run_command(inp.command, self.root, log, BASH_TIMEOUT_S, BASH_MAX_OUTPUT,
                             sandbox=self.session.confinement.sandbox(), keys=self.session.confinement.key_names())
        self.session.ws.release_reserve_if_full()
        status = "" if result.exit_code == 0 else f"\n[exit code: {result.exit_code}]"
        return (result.output or "(no output)") + status

    def edit(self, inp: EditorInput) -> str:
        """The editor runs in the engine, so it acts only through the workspace's file API:
        visible files beneath the workspace, never through a link (a strict part of what
        `bash` sees in the sandbox)."""
        files = self.session.ws.files
        try:
            whole = inp.path.strip().rstrip("/") in ("", ".", str(self.root))  # the workspace itself: view lists it
            rel = "." if whole else agent_path(inp.path, self.root)
            if rel != "." and (st := files.lstat(rel)) is not None and stat.S_ISLNK(st.st_mode):
                raise Refused(f"{rel} is a link; labrun follows no link in the workspace")
            if inp.command == "view":
                return self._view(rel, inp.view_range)
            if rel == "STATE.md":
                raise ToolError(f"{inp.path}: the engine owns this file; hand things on through complete_phase")
            if inp.command == "create":
                if inp.file_text is None:
                    raise ToolError("create needs file_text")
                files.write(rel, inp.file_text)
                return f"Created {rel} ({len(inp.file_text.splitlines())} lines)."
            if not files.is_file(rel):
                raise ToolError(f"{rel}: no such file")
            mode = stat.S_IMODE(files.lstat(rel).st_mode)  # a script stays executable
            text = files.read_text(rel)
            if inp.command == "str_replace":
                if not inp.old_str:
                    raise ToolError("str_replace needs old_str")
                count = text.count(inp.old_str)
                if count != 1:
                    raise ToolError(
                        f"old_str occurs {count} times in {rel}; it must occur exactly once "
                        "(add surrounding lines to make it unique)"
                    )
                files.write(rel, text.replace(inp.old_str, inp.new_str or ""), mode)
                return f"Replaced the text in {rel}."
            # insert
            if inp.insert_line is None or inp.insert_text is None:
                raise ToolError("insert needs insert_line and insert_text")
            lines = text.splitlines(keepends=True)
            if not 0 <= inp.insert_line <= len(lines):
                raise ToolError(f"insert_line must be between 0 and {len(lines)} for {rel}")
            new = inp.insert_text if inp.insert_text.endswith("\n") else inp.insert_text + "\n"
            lines.insert(inp.insert_line, new)
            files.write(rel, "".join(lines), mode)
            return f"Inserted text after line {inp.insert_line} of {rel}."
        except Refused as e:
            raise ToolError(f"Refused: {e}") from None
        except UnicodeDecodeError:
            raise ToolError(f"{inp.path}: not a UTF-8 text file; the editor edits text") from None
        except OSError as e:
            raise ToolError(f"{inp.path}: {e.strerror or e}") from None

    def _view(self, rel: str, view_range: list[int] | None) -> str:
        files = self.session.ws.files
        if rel == "." or files.is_dir(rel):
            entries = sorted(
                (name if rel == "." else f"{rel}/{name}") + ("/" if stat.S_ISDIR(st.st_mode) else "")
                for name, st in files.entries(rel)
                if name != self.session.ws.data.name
            )
            shown = entries[:VIEW_MAX_ENTRIES]
            more = [f"[... and {len(entries) - len(shown)} more]"] if len(entries) > len(shown) else []
            return "\n".join(shown + more) or f"{rel}/ is empty"
        if files.lstat(rel) is None:
            raise ToolError(f"{rel}: no such file or directory")
        lines = files.read_bytes(rel, VIEW_MAX_BYTES).decode(errors="replace").splitlines()
        start, end = 1, len(lines)
        if view_range:
            start = max(1, view_range[0])
            end = len(lines) if len(view_range) < 2 or view_range[1] == -1 else view_range[1]
        shown = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, min(end, len(lines)) + 1))
        if len(shown) > VIEW_MAX_CHARS:
            shown = shown[:VIEW_MAX_CHARS] + "\n[... cut: view a smaller view_range ...]"
        return shown or f"{rel} is empty"

    def run_experiment(self, inp: RunExperimentInput) -> str:
        try:  # before anything runs: the engine will read these, so it never follows the agent's links
            inp.outputs = [agent_path(p, self.root) for p in inp.outputs]
            if inp.metrics_file is not None:
                inp.metrics_file = agent_path(inp.metrics_file, self.root)
        except Refused as e:
            raise ToolError(f"Refused, not run: {e}") from None
        runs = self.session.state.plan.run_ids()
        if inp.run_id is not None and runs and inp.run_id not in runs:
            raise ToolError(f"Refused, not run: run_id {inp.run_id} is not in the run list "
                            f"({', '.join(runs)}); give a planned run's id, or none for a check that serves no run.")
        if self.session.state.experiments_pool is None:  # else the pool's worker has the GPUs, and says so
            try:
                gpus.check(inp.gpus)
            except gpus.GpuRefused as e:
                raise ToolError(f"Refused, not run: {e}.") from None
        return self.attempt_report(self.experiments.run(inp))

    def experiment_output(self, inp: ExperimentOutputInput) -> str:
        attempt, output = self.experiments.output(self._own(inp.attempt), inp.wait_s)
        if attempt.status != "RUNNING":
            return self.attempt_report(attempt) + ("\nOutput since the last look:\n" + output if output else "")
        return f"Attempt {attempt.n}: RUNNING\nOutput since the last look:\n{output or '(none)'}"

    def stop_experiment(self, inp: StopExperimentInput) -> str:
        n = self._own(inp.attempt)
        if self.session.state.attempts[n - 1].status != "RUNNING":
            raise ToolError(f"attempt {n} is not running ({self.session.state.attempts[n - 1].status})")
        return self.attempt_report(self.experiments.stop(n))

    def _own(self, n: int) -> int:
        """An attempt of this session's, by its number."""
        if not 1 <= n <= len(self.session.state.attempts):
            raise ToolError(f"no attempt {n}: this session has {len(self.session.state.attempts)}")
        return n

    def _ended_note(self) -> str:
        """Told after whatever call comes next: background attempts that ended meanwhile."""
        ended = self.experiments.ended_since()
        return "".join(f"\n[attempt {a.n}, run in the background, ended: {a.status}; "
                       f"experiment_output({a.n}) shows its record]" for a in ended)

    def attempt_report(self, attempt: "Attempt", note: str | None = None) -> str:
        """What `run_experiment` answers about an attempt: its record once it ended; `note`, a
        paragraph after its first line (the attempt's number and status, always first)."""
        if attempt.status == "RUNNING":
            return "\n".join([f"Attempt {attempt.n}: RUNNING in the background", *([note] if note else []),
                              f"experiment_output({attempt.n}) shows its output and status; "
                              f"stop_experiment({attempt.n}) ends it."])
        runs = self.session.state.plan.run_ids()
        metrics = ", ".join(f"{k}={v}" for k, v in attempt.metrics.items()) or "none"
        done = sum(r.state == "done" for r in coverage(self.session.state.plan, self.session.state.live_attempts()))
        return "\n".join([
            f"Attempt {attempt.n}: {attempt.status}",
            *([note] if note else []),
            *([f"Run: {attempt.run_id} (run list: {done} of {len(runs)} runs done)"] if attempt.run_id else []),
            f"Exit code: {attempt.exit_code}",
            f"Duration: {attempt.duration_s:.1f} s" if attempt.duration_s is not None else "Duration: —",
            f"Error: {attempt.error or 'none'}",
            f"Metrics: {metrics}",
            *([f"Not evidence: {attempt.unmeasured}. {NOT_EVIDENCE}"]
              if attempt.status == "SUCCESS" and attempt.unmeasured and (attempt.metrics_file or attempt.outputs) else []),
            *([f"Not measured: {', '.join(f'{k} (its value is written in {w})' for k, w in attempt.echoed.items())}: "
               "a setting or a number typed in is no result; no claim may cite these."]
              if attempt.status == "SUCCESS" and not attempt.unmeasured and attempt.echoed else []),
            f"Outputs: {', '.join(attempt.outputs) or 'none'}",
            f"Log: {attempt.log}",
            "Output (tail):",
            attempt_tail(self.root / attempt.log),
        ])

    def missing(self, sections: dict[str, str] | None = None,
                parts: dict[str, Any] | None = None) -> list[str]:
        """What the phase's completion rule still lacks (sections: those given so far;
        parts: the structured parts of a `complete_phase` call)."""
        given = self.session.state.sections if sections is None else sections
        return self.phase.missing(self.session.work(self.phase.key, given, parts or {}))

    def complete_phase(self, inp: BaseModel) -> str:
        given = {k: v for k, v in inp.sections.model_dump().items() if v and v.strip()}
        parts = inp.model_dump(include=set(PLAN_FIELDS), exclude_none=True)
        if running := self.experiments.running():
            raise ToolError(f"Attempt{'s' if len(running) > 1 else ''} {', '.join(map(str, running))} still "
                            f"run{'' if len(running) > 1 else 's'}: wait for {'them' if len(running) > 1 else 'it'} "
                            "(experiment_output with wait_s) or end it (stop_experiment), then call complete_phase again.")
        unread = [k for k in parts if k not in self.phase.fields]
        if unread:
            takes = ", ".join(self.phase.fields) or "none of them"
            raise ToolError(f"The {self.phase.key} phase does not take {', '.join(unread)} (it takes: "
                            f"{takes}); leave {'it' if len(unread) == 1 else 'them'} out and call complete_phase again.")
        missing = self.missing(given, parts)
        if missing:
            raise ToolError(
                f"The {self.phase.key} phase is not complete yet; missing: {'; '.join(missing)}. "
                "Provide them and call complete_phase again."
            )
        self.session.give_sections(self.phase.key, given, parts)
        self.completed = inp.summary
        titles = ", ".join(section_titles()[k] for k in given) or "no sections"
        return f"Phase {self.phase.key} complete ({titles} recorded)."


def attempt_tail(log: Path, chars: int = 3000) -> str:
    if not log.exists():
        return "(no output)"
    with open(log, "rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - chars))
        return f.read().decode(errors="replace") or "(no output)"


def parse_metrics(text: str) -> dict[str, Any]:
    """A JSON object of metrics, nested keys joined with dots."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the metrics file must hold a JSON object")
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                k = redact(" ".join(str(k).split()))  # a name on one line: records print it in lines of their own
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, str):  # redacted here: the records, Prefect's results too, keep what this returns
            flat[prefix] = redact(" ".join(value.split()))
        elif isinstance(value, (int, float)) or value is None:
            flat[prefix] = value

    walk("", data)
    return flat

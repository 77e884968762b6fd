"""The agent's prompts, rendered from the Jinja2 templates under `templates/`.

No prompt text lives in code. A phase's system prompt is `phases/<key>.md.j2` in the
phase's template folder (`Phase.templates`; labrun's own `templates/` for its phases), which
extends the layout `templates/system.md.j2`: the first line, the shared preamble, the
phase's own instructions and completion rule, then its guidance in two layers, then the idea
and the STATE.md digest. A phase's number and the count of phases come from the session's
own phase list (`order`).

The guidance layers, each looked up in the phase's template folder, then labrun's own:

1. general: `guidance/<key>.md.j2`, one named block per topic, shown in file order;
2. the domain's: `domains/<domain>/<key>.md.j2`, whose blocks are shown after the general
   ones. A block named `replace_<name>` takes the place of the general block `<name>`
   instead (an explicit override); a domain block may not reuse a general block's name, so
   no general block is ever dropped without saying so. A domain without a folder, or a
   folder without a file for the phase, adds nothing; a phase without a general file has
   no general layer.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined, TemplateNotFound

from labrun.agents.registry import web_tools
from labrun.phase_registry import BY_KEY, DEFAULT, Phase, section_titles
from labrun.plan import coverage
from labrun.state import add_clock_filters
from labrun import resources, suggest
from labrun.resources import TEMPLATES

FALLBACK_DOMAIN = "general"
REPLACE = "replace_"
_DOMAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


def _given(value: Any) -> bool:
    """Jinja test `is given`: present and not empty (None, "", [] and {} are not given)."""
    return value is not None and not (isinstance(value, (str, list, tuple, dict)) and not value)


def make_env(root: Path) -> Environment:
    """Templates under `root`, then labrun's own (the layout, the preamble, the notes)."""
    roots = dict.fromkeys([str(root), str(TEMPLATES)])
    env = Environment(
        loader=ChoiceLoader([FileSystemLoader(r) for r in roots]),
        bytecode_cache=resources.template_cache(),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )
    env.tests["given"] = _given
    add_clock_filters(env)
    return env


env = make_env(TEMPLATES)


def _env_for(templates: Path) -> Environment:
    """The environment of a phase's template folder (labrun's own: `env`)."""
    return env if templates == resources.TEMPLATES else _own_env(templates)


@functools.cache
def _own_env(templates: Path) -> Environment:
    return make_env(templates)


def _phase(phase_key: str) -> Phase:
    try:
        return BY_KEY[phase_key]
    except KeyError:
        raise ValueError(
            suggest.unknown("phase", phase_key, BY_KEY)
        ) from None


def _phase_vars(phase_key: str, order: Sequence[str]) -> dict[str, Any]:
    """`n` of `total`: the phase's place in the session's phase list `order`."""
    phase = _phase(phase_key)
    order = list(order)
    if phase_key not in order:
        raise ValueError(f"phase {phase_key!r} is not one of this session's phases ({', '.join(order)})")
    return {"phase": phase, "n": order.index(phase_key) + 1, "key": phase.key, "total": len(order),
            "rule": phase.rule_text(), "phases": order}


def _exists(env: Environment, name: str) -> bool:
    try:
        env.loader.get_source(env, name)
    except TemplateNotFound:
        return False
    return True


def _tidy(text: str) -> str:
    """Strip trailing spaces and collapse runs of blank lines, so output is stable."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n"


def guidance_domain(domain: str | None) -> str:
    """`domain` if labrun's `templates/domains/<domain>/` exists, else "general"."""
    name = (domain or "").strip().lower()
    if name and _DOMAIN_NAME.match(name) and (TEMPLATES / "domains" / name).is_dir():
        return name
    return FALLBACK_DOMAIN


@dataclass(frozen=True)
class Layers:
    """The templates that shape one phase's prompt, in the order the prompt shows them."""

    phase: str
    domain: str
    """The domain whose additions are used ("general": none)."""
    instructions: str
    general: str | None
    """The general guidance for this phase, if it has any."""
    blocks: tuple[str, ...]
    """The general guidance's blocks, in order."""
    domain_file: str | None
    """The domain's template for this phase, if it has one."""
    added: tuple[str, ...] = ()
    """Domain blocks shown after the general guidance."""
    replaced: tuple[str, ...] = ()
    """General blocks that the domain replaces with its `replace_<name>` blocks."""

    @property
    def files(self) -> list[str]:
        return [f for f in (self.instructions, self.general, self.domain_file) if f]


def layers(phase_key: str, domain: str | None) -> Layers:
    """The layers of phase `phase_key`'s prompt for `domain` (unknown domains: general)."""
    phase_env = _env_for(_phase(phase_key).templates)
    used = guidance_domain(domain)
    instructions = f"phases/{phase_key}.md.j2"
    general = f"guidance/{phase_key}.md.j2"
    if not _exists(phase_env, general):
        general = None
    blocks = tuple(phase_env.get_template(general).blocks) if general else ()
    found = f"domains/{used}/{phase_key}.md.j2"
    if not _exists(phase_env, found):
        return Layers(phase_key, used, instructions, general, blocks, None)
    added, replaced = [], []
    for name in phase_env.get_template(found).blocks:
        if name.startswith(REPLACE):
            if name[len(REPLACE):] not in blocks:
                raise ValueError(f"{found}: block {name!r} replaces no block of {general}")
            replaced.append(name[len(REPLACE):])
        elif name in blocks:
            raise ValueError(f"{found}: block {name!r} has the name of a block of {general}: "
                             f"call it {REPLACE}{name} to replace that block, or rename it")
        else:
            added.append(name)
    return Layers(phase_key, used, instructions, general, blocks, found, tuple(added), tuple(replaced))


def _render_block(phase_env: Environment, template: str, block: str, values: dict[str, Any]) -> str:
    tpl = phase_env.get_template(template)
    return _tidy("".join(tpl.blocks[block](tpl.new_context(values)))).strip()


def _unwrap(idea: dict[str, Any]) -> dict[str, Any]:
    """Accept an idea file's top level (`{"idea": {...}}`) as well as the idea itself."""
    if set(idea) == {"idea"} and isinstance(idea["idea"], dict):
        return idea["idea"]
    return idea


def system_prompt(phase_key: str, idea: dict, domain: str, digest: str,
                  order: Sequence[str] = DEFAULT, extra: dict[str, Any] | None = None) -> str:
    """The system prompt of one phase. Its first line is `# Phase N of M: <key>`. `extra`:
    variables for the phase's own templates (what its `setup` returned, the web tools)."""
    values = {"reviewer_notes": (), **(extra or {}), **_phase_vars(phase_key, order)}
    idea = _unwrap(dict(idea or {}))
    layout = layers(phase_key, domain)
    phase_env = _env_for(values["phase"].templates)
    values.update(idea=idea, idea_domain=(domain or idea.get("domain") or ""), domain=layout.domain)
    general = [
        _render_block(phase_env, layout.domain_file, REPLACE + name, values) if name in layout.replaced
        else _render_block(phase_env, layout.general, name, values)
        for name in layout.blocks
    ]
    added = [_render_block(phase_env, layout.domain_file, name, values) for name in layout.added]
    text = phase_env.get_template(layout.instructions).render(
        **values, general_guidance=general, domain_guidance=added, digest=digest or "")
    return _tidy(text)


def phase_system_prompt(session: Any, phase_key: str) -> str:
    """The system prompt of one phase of `session`, with the STATE.md digest as it is now.
    Runs the phase's `setup` (which may put files in the workspace)."""
    return system_prompt(phase_key, session.idea.as_prompt_dict(), session.idea.guidance_domain,
                         digest(session.state, session.limits.clock(), session.confinement.keys_for_prompt()), list(session.state.phases),
                         template_context(session, BY_KEY[phase_key]))


def template_context(session: Any, phase: Phase) -> dict[str, Any]:
    """What the phase's own templates get besides the idea and the digest: the backend's web
    tools when the phase offers them, and what the phase's `setup` returned (it runs now)."""
    context: dict[str, Any] = {"web_tools": web_tools(session.state.agent) if phase.web else (),
                               "reviewer_notes": session.state.notes_for(phase.key)}
    if phase.setup is not None:
        context.update(phase.setup(session))
    return context


def kickoff(phase_key: str, order: Sequence[str] = DEFAULT) -> str:
    """The first user message of a phase."""
    return _tidy(env.get_template("kickoff.md.j2").render(**_phase_vars(phase_key, order)))


def resume_note(phase_key: str, interrupted: list[str], order: Sequence[str] = DEFAULT) -> str:
    """The user note added when a phase's conversation resumes after an interruption."""
    return _tidy(env.get_template("resume_note.md.j2").render(
        **_phase_vars(phase_key, order), interrupted=list(interrupted or [])))


def revision(phase_key: str, text: str, order: Sequence[str] = DEFAULT) -> str:
    """The user message that sends a finished phase back with a reviewer's request."""
    return _tidy(env.get_template("revision.md.j2").render(**_phase_vars(phase_key, order), text=text.strip()))


def nudge(phase_key: str, missing: str, order: Sequence[str] = DEFAULT) -> str:
    """The user message when a turn ends with no tool call and the phase is not complete."""
    return _tidy(env.get_template("nudge.md.j2").render(
        **_phase_vars(phase_key, order), missing=(missing or "").strip()))


def digest(state: Any, clock: dict[str, Any] | None = None, keys: dict[str, Any] | None = None) -> str:
    """A compact digest of STATE.md for the phase prompts: the state's phases are the
    session's, in order; `clock` (`Limits.clock`) is the time and money so far, `keys`
    (`Confinement.keys_for_prompt`) the keys the experiments' commands get, by name."""
    numbers = {k: n for n, k in enumerate(state.phases, 1)}
    handed_on = [(f, k) for k, r in state.phases.items() if _status(r) == "DONE"
                 for f in BY_KEY[k].hands_on] if state.phases else []
    notes = [_handoff_note(k) for k, r in state.phases.items() if _status(r) == "DONE"] if state.phases else []
    plan = getattr(state, "plan", None)
    return _tidy(env.get_template("digest.md.j2").render(
        state=state, phase_number=numbers, handed_on=handed_on, notes=[n for n in notes if n],
        section_titles=section_titles(state.phases or DEFAULT), plan=plan, clock=clock, keys=keys,
        runs=coverage(plan, getattr(state, "live_attempts", lambda: state.attempts)())))


def _handoff_note(phase_key: str) -> str | None:
    """What a finished phase tells every later one about its files
    (`handoff/<key>.md.j2` in its template folder, if it has one)."""
    phase_env = _env_for(_phase(phase_key).templates)
    name = f"handoff/{phase_key}.md.j2"
    return _tidy(phase_env.get_template(name).render()).strip() if _exists(phase_env, name) else None


def _status(record: Any) -> str:
    status = record.status
    return getattr(status, "value", status)


def template_sources(phase_key: str, domain: str) -> str:
    """The source text of every template that shapes this phase's prompts, concatenated:
    what `prompt_digest` digests."""
    phase_env = _env_for(_phase(phase_key).templates)
    names = [
        "system.md.j2",
        "preamble.md.j2",
        *layers(phase_key, domain).files,
        "kickoff.md.j2",
        "resume_note.md.j2",
        "nudge.md.j2",
        "interrupted_tool.md.j2",
        "reattached_tool.md.j2",
        "cut_off.md.j2",
        "digest.md.j2",
        "clock.md.j2",
        "code_references.md.j2",
    ]
    sources = [(phase_env, name) for name in names]
    for phase in BY_KEY.values():  # the digest holds the notes of the phases before this one
        note_env, note = _env_for(phase.templates), f"handoff/{phase.key}.md.j2"
        if _exists(note_env, note):
            sources.append((note_env, note))
    parts = []
    for source_env, name in sources:
        source, _, _ = source_env.loader.get_source(source_env, name)
        parts.append(f"--- {name}\n{source}")
    return "\n".join(parts)


def cut_off(name: str | None = None) -> str:
    """What the model is told when its reply reached the output limit: for each tool call
    in it (none is run), or once when it held no tool call."""
    return _tidy(env.get_template("cut_off.md.j2").render(name=name or ""))


def prompt_digest(phase_key: str, domain: str) -> str:
    """The wording of the phase's templates: a finished phase whose digest differs from the
    current one was finished with an older prompt."""
    return hashlib.sha256(template_sources(phase_key, domain).encode()).hexdigest()[:16]


def interrupted_tool(name: str) -> str:
    """The result given for a tool call that a crash cut off (it is never re-run)."""
    return _tidy(env.get_template("interrupted_tool.md.j2").render(name=name))


def reattached_tool(running: bool = False) -> str:
    """The head of the result of a `run_experiment` call whose attempt outlived the engine
    (`running`: one in the background, which it follows again)."""
    return _tidy(env.get_template("reattached_tool.md.j2").render(running=running))

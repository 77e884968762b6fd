"""The agent's prompts, rendered from the Jinja2 templates under `templates/`.

No prompt text lives in code. A phase's system prompt is `templates/phases/<key>.md.j2`,
which extends the layout `templates/system.md.j2` (first line, shared preamble, the phase's
own instructions, the domain's guidance for that phase, the idea, the STATE.md digest).
Domain guidance is `templates/domains/<domain>/<key>.md.j2`; a domain without a folder, or a
folder without a file for the phase, falls back to `templates/domains/general/`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from labrun.phases import BY_KEY, PHASES
from labrun.resources import TEMPLATES
FALLBACK_DOMAIN = "general"
_DOMAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


def _given(value: Any) -> bool:
    """Jinja test `is given`: present and not empty (None, "", [] and {} are not given)."""
    return value is not None and not (isinstance(value, (str, list, tuple, dict)) and not value)


def make_env(root: Path) -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(root)),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )
    env.tests["given"] = _given
    env.globals["PHASES"] = PHASES
    env.globals["phase_number"] = {p.key: p.number for p in PHASES}
    return env


env = make_env(TEMPLATES)


def _phase(phase_key: str):
    try:
        return BY_KEY[phase_key]
    except KeyError:
        raise ValueError(
            f"unknown phase {phase_key!r}; the phases are: {', '.join(BY_KEY)}"
        ) from None


def _phase_vars(phase_key: str) -> dict[str, Any]:
    phase = _phase(phase_key)
    return {"phase": phase, "n": phase.number, "key": phase.key, "total": len(PHASES)}


def _tidy(text: str) -> str:
    """Strip trailing spaces and collapse runs of blank lines, so output is stable."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)) + "\n"


def guidance_domain(domain: str | None) -> str:
    """`domain` if `templates/domains/<domain>/` exists, else "general"."""
    name = (domain or "").strip().lower()
    if name and _DOMAIN_NAME.match(name) and (TEMPLATES / "domains" / name).is_dir():
        return name
    return FALLBACK_DOMAIN


def _domain_template(phase_key: str, domain: str | None) -> str:
    name = guidance_domain(domain)
    candidate = f"domains/{name}/{phase_key}.md.j2"
    if (TEMPLATES / candidate).is_file():
        return candidate
    return f"domains/{FALLBACK_DOMAIN}/{phase_key}.md.j2"


def _unwrap(idea: dict[str, Any]) -> dict[str, Any]:
    """Accept an idea file's top level (`{"idea": {...}}`) as well as the idea itself."""
    if set(idea) == {"idea"} and isinstance(idea["idea"], dict):
        return idea["idea"]
    return idea


def system_prompt(phase_key: str, idea: dict, domain: str, digest: str) -> str:
    """The system prompt of one phase. Its first line is `# Phase N of 6: <key>`."""
    phase_vars = _phase_vars(phase_key)
    idea = _unwrap(dict(idea or {}))
    used = guidance_domain(domain)
    text = env.get_template(f"phases/{phase_key}.md.j2").render(
        **phase_vars,
        idea=idea,
        idea_domain=(domain or idea.get("domain") or ""),
        domain=used,
        domain_template=_domain_template(phase_key, used),
        digest=digest or "",
    )
    return _tidy(text)


def kickoff(phase_key: str) -> str:
    """The first user message of a phase."""
    return _tidy(env.get_template("kickoff.md.j2").render(**_phase_vars(phase_key)))


def resume_note(phase_key: str, interrupted: list[str]) -> str:
    """The user note added when a phase's conversation resumes after an interruption."""
    return _tidy(env.get_template("resume_note.md.j2").render(
        **_phase_vars(phase_key), interrupted=list(interrupted or [])))


def nudge(phase_key: str, missing: str) -> str:
    """The user message when a turn ends with no tool call and the phase is not complete."""
    return _tidy(env.get_template("nudge.md.j2").render(
        **_phase_vars(phase_key), missing=(missing or "").strip()))


def digest(state: Any) -> str:
    """A compact digest of STATE.md for the phase prompts."""
    return _tidy(env.get_template("digest.md.j2").render(state=state))


def template_sources(phase_key: str, domain: str) -> str:
    """The source text of every template that shapes this phase's prompts, concatenated,
    for the phase's cache version."""
    _phase(phase_key)
    names = [
        "system.md.j2",
        "preamble.md.j2",
        f"phases/{phase_key}.md.j2",
        _domain_template(phase_key, domain),
        "kickoff.md.j2",
        "resume_note.md.j2",
        "nudge.md.j2",
        "interrupted_tool.md.j2",
        "digest.md.j2",
    ]
    parts = []
    for name in names:
        source, _, _ = env.loader.get_source(env, name)
        parts.append(f"--- {name}\n{source}")
    return "\n".join(parts)


def interrupted_tool(name: str) -> str:
    """The result given for a tool call that a crash cut off (it is never re-run)."""
    return _tidy(env.get_template("interrupted_tool.md.j2").render(name=name))

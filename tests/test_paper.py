"""The paper phase's parts: its styles (each compiled with Debian's TeX when it is here), the
checks of its completion rule, and TeX hidden from the PATH. The resources phase's check
against the tool log is here too. No Prefect: these read and write files only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_messages_api import web_fetch  # noqa: E402
from labrun.workspace import Workspace  # noqa: E402

from labrun import latex, paper  # noqa: E402
from labrun.journal import Conversation  # noqa: E402
from labrun.phase_registry import BY_KEY, CitesFetchedSource, Compiled, LatexPaper, Work  # noqa: E402
from labrun.state import Attempt  # noqa: E402
from labrun.usage import Usage  # noqa: E402

NEEDS_TEX = pytest.mark.skipif(
    latex.toolchain() is None,
    reason="needs Debian's TeX: run .ci/install-tex (apt-get install latexmk texlive-latex-base "
           "texlive-latex-recommended)")


def session_for(root: Path, style: str = "plain", agent: str = "anthropic") -> NS:
    root.mkdir(parents=True, exist_ok=True)
    return NS(ws=Workspace(root), state=NS(paper_style=style, agent=agent),
              idea=NS(title="Averaging 100% of k_i measurements & more"))


def write_sections(root: Path, body: str = "The slope is $-0.5016$ \\cite{src}.\n") -> list[str]:
    main = (root / paper.MAIN).read_text()
    names = re.findall(r"\\input\{sections/(\w+)\}", main)
    for name in names:
        heading = "" if name == "abstract" else f"\\section{{{name.replace('_', ' ')}}}\n"
        (root / "paper/sections" / f"{name}.tex").write_text(heading + body)
    (root / "paper/references.bib").write_text(
        "@misc{src,\n  title = {A source},\n  url = {https://example.org/src}\n}\n")
    return names


def work(root: Path, sections=None, attempts=(), phase="paper", log=None, network=True) -> Work:
    return Work(root, sections or {}, list(attempts), phase, log, network=network)


# -- styles ---------------------------------------------------------------------------------


def test_every_style_is_put_in_place_without_overwriting_the_agents_files(tmp_path):
    assert paper.style_names() == ["acl", "ams", "icml", "neurips", "plain"]
    for name in paper.style_names():
        root = tmp_path / name
        context = paper.setup(session_for(root, name))
        main = (root / paper.MAIN).read_text()
        assert context["paper_style"].name == name and context["compile_command"] == paper.COMPILE
        assert context["style_files"][0] == paper.MAIN
        assert all((root / f).is_file() for f in context["style_files"])
        assert "\\title{Averaging 100\\% of k\\_i measurements \\& more}" in main
        assert "labrun, agent \\texttt{anthropic}" in main
        assert "{{" not in main and "\\begin{document}" in main
        (root / paper.MAIN).write_text(main + "% the agent's edit\n")
        paper.setup(session_for(root, name))
        assert (root / paper.MAIN).read_text().endswith("% the agent's edit\n")
    scripted = tmp_path / "scripted"
    paper.setup(session_for(scripted, agent="scripted"))
    assert "scripted agent (an offline stand-in" in (scripted / paper.MAIN).read_text()
    with pytest.raises(ValueError, match="unknown paper style 'finance'; the styles are: acl, ams"):
        paper.load_style("finance")


@NEEDS_TEX
@pytest.mark.parametrize("style", ["plain", "neurips", "icml", "acl", "ams"])
def test_each_style_compiles_with_latexmk(tmp_path, style):
    paper.setup(session_for(tmp_path, style))
    write_sections(tmp_path)
    result = subprocess.run(paper.COMPILE, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    pdf = tmp_path / "paper/main.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    log = (tmp_path / "paper/main.log").read_text(errors="replace")
    assert "There were undefined" not in log and "Citation `src' on page" not in log.split("Output written")[-1]


# -- the paper's completion rule -------------------------------------------------------------


def test_the_paper_rule_names_each_missing_piece(tmp_path):
    paper.setup(session_for(tmp_path))
    rule = LatexPaper(paper.MAIN, "paper/references.bib")
    assert any("sections/introduction.tex (\\input by the paper) is missing" in m for m in rule.missing(work(tmp_path)))
    write_sections(tmp_path)
    assert rule.missing(work(tmp_path)) == []
    results = tmp_path / "paper/sections/results.tex"
    results.write_text("\\section{Results}\\input{tables/main}\nTODO: numbers. \\cite{nobody,src}\n"
                       "\\includegraphics[width=0.5\\linewidth]{figures/slope}\n")
    missing = rule.missing(work(tmp_path))
    assert missing == ["paper/tables/main.tex (\\input by the paper) is missing or empty",
                       "figure figures/slope (in \\includegraphics) is not there",
                       "citation keys not in paper/references.bib: nobody",
                       "a TODO left in the paper's text"]
    (tmp_path / "paper/tables").mkdir()
    (tmp_path / "paper/tables/main.tex").write_text("\\begin{tabular}{r}1\\end{tabular}\n")
    (tmp_path / "paper/figures/slope.pdf").write_bytes(b"%PDF-1.4")
    results.write_text("\\section{Results}\\input{tables/main} \\cite{src} % TODO in a comment is fine\n"
                       "\\includegraphics[width=0.5\\linewidth]{figures/slope}\n")
    assert rule.missing(work(tmp_path)) == []


def test_without_tex_the_paper_completes_saying_it_was_not_compiled(tmp_path, no_tex):
    rule = Compiled(paper.MAIN, "paper")
    assert "not compiled (no TeX is installed here)" in rule.describe()
    assert rule.missing(work(tmp_path, {"paper": "paper/main.tex"})) == [
        "the section paper saying the paper was not compiled (no TeX is installed here)"]
    assert rule.missing(work(tmp_path, {"paper": "paper/main.tex, not compiled: no TeX here"})) == []
    context = paper.setup(session_for(tmp_path))
    assert context["tex"] is None
    assert "No TeX is installed here" in _paper_prompt(context)


@NEEDS_TEX
def test_with_tex_the_paper_must_compile_after_its_last_edit(tmp_path):
    rule = Compiled(paper.MAIN, "paper")
    paper.setup(session_for(tmp_path))
    write_sections(tmp_path)
    failed = Attempt(n=1, phase="paper", status="FAILED", command=paper.COMPILE)
    ok = Attempt(n=2, phase="paper", status="SUCCESS", command=paper.COMPILE)
    other = Attempt(n=1, phase="experiments", status="SUCCESS", command=paper.COMPILE)
    assert rule.missing(work(tmp_path, attempts=[other])) == [
        f"a successful `latexmk` run of {paper.MAIN} through run_experiment"]
    assert rule.missing(work(tmp_path, attempts=[ok, failed])) != []
    subprocess.run(paper.COMPILE, shell=True, cwd=tmp_path, capture_output=True, timeout=120, check=True)
    assert rule.missing(work(tmp_path, attempts=[failed, ok])) == []
    later = tmp_path / "paper/sections/results.tex"
    os.utime(later, (later.stat().st_atime, (tmp_path / "paper/main.pdf").stat().st_mtime + 5))
    assert rule.missing(work(tmp_path, attempts=[failed, ok])) == [
        "main.pdf compiled after the last edit of the paper's sources (compile again)"]
    context = paper.setup(session_for(tmp_path))
    assert context["tex"] and f"command\n`{paper.COMPILE}`" in _paper_prompt(context)


def _paper_prompt(context: dict) -> str:
    from labrun import prompts
    from labrun.phase_registry import phase_list

    return prompts.system_prompt("paper", {"title": "T", "hypothesis": "h"}, "general", "",
                                 phase_list(["paper"]), {"web_tools": (), **context})


# -- the resources phase's check against its tool log ----------------------------------------


def test_a_cited_source_counts_only_when_this_phase_fetched_it(tmp_path):
    rule = CitesFetchedSource(("literature_review.md", "resources.md"), "literature")
    log = tmp_path / ".labrun/phases/resources"
    (tmp_path / "literature_review.md").write_text("- Wei et al. 2022, https://arxiv.org/abs/2201.11903\n")
    (tmp_path / "resources.md").write_text("| data | https://example.org/data.csv | CC-BY |\n")
    here = work(tmp_path, phase="resources", log=log)
    assert rule.missing(here) == [
        "a source cited in literature_review.md or resources.md that a tool fetched in this phase "
        "(cited: 2, none of them fetched), or a line `No source could be fetched: <why>` in the section literature "
        "after fetches that failed"]
    # Nothing could be fetched, says a phase that tried no fetch with the network on: refused;
    # with the network off, it is the truth.
    untried = {"literature": "No source could be fetched: every request timed out (arXiv, the idea's links)."}
    assert rule.missing(work(tmp_path, untried, phase="resources", log=log))[0].startswith(
        "`No source could be fetched:` stands only after fetches that failed, and this phase's tool log shows none")
    assert rule.missing(work(tmp_path, untried, phase="resources", log=log, network=False)) == []
    # A fetch of something else, or a failed fetch of the cited paper, does not count...
    convo = Conversation.start(log)
    convo.add_user_text("Go.")
    convo.add_reply(web_fetch("https://example.org/other", "page")
                    + web_fetch("https://arxiv.org/abs/2201.11903", None, error="url_not_accessible"),
                    Usage(), "end_turn")
    assert rule.missing(here) != []
    # ...nor a reason too short to say anything; a real reason does.
    assert rule.missing(work(tmp_path, {"literature": "No source could be fetched: no."}, phase="resources", log=log))
    assert rule.missing(work(tmp_path, {"literature": "No source could be fetched: every request timed out "
                                                      "(arXiv, Semantic Scholar, the idea's links)."},
                             phase="resources", log=log)) == []
    # The PDF of the cited abstract page, fetched, counts.
    convo.add_reply(web_fetch("https://arxiv.org/pdf/2201.11903v6", "the paper"), Usage(), "end_turn")
    assert rule.missing(here) == []


def test_the_optional_phases_rules_are_in_their_prompts():
    from labrun import prompts
    from labrun.phase_registry import phase_list

    order = phase_list(["resources", "paper"])
    text = prompts.system_prompt("resources", {"title": "T", "hypothesis": "h"}, "general", "", order,
                                 {"web_tools": ("web_search", "web_fetch")})
    assert text.splitlines()[0] == "# Phase 1 of 8: resources"
    assert CitesFetchedSource.MARKER in text and "`web_search` finds pages" in text
    assert BY_KEY["resources"].rule_text() in text
    planning = prompts.system_prompt("planning", {"title": "T", "hypothesis": "h"}, "general", "", order)
    assert planning.splitlines()[0] == "# Phase 2 of 8: planning"
    assert "session of eight" in planning


@pytest.mark.parametrize("key", ["resources", "paper"])
def test_the_optional_phases_have_general_guidance_and_domains_add_to_it(key):
    from labrun import prompts
    from labrun.phase_registry import phase_list

    domains = sorted(p.name for p in (prompts.TEMPLATES / "domains").iterdir() if p.is_dir())
    general = prompts.layers(key, "general")
    assert general.general == f"guidance/{key}.md.j2" and len(general.blocks) >= 2
    with_domain = [d for d in domains if prompts.layers(key, d).domain_file]
    assert {"mathematics", "machine_learning"} <= set(with_domain)
    for domain in domains:  # every domain's prompt renders, its layers checked by `layers`
        layout = prompts.layers(key, domain)
        text = prompts.system_prompt(key, {"title": "T", "hypothesis": "h"}, domain, "",
                                     phase_list([key]), {"web_tools": (), "paper_style": paper.load_style("plain"),
                                                         "style_files": [paper.MAIN], "tex": None,
                                                         "compile_command": paper.COMPILE, "main": paper.MAIN})
        assert ("## Guidance for this domain" in text) == bool(layout.added), domain
        for block in set(general.blocks) - set(layout.replaced):
            assert prompts._render_block(prompts.env, general.general, block, {}) in text, (domain, block)

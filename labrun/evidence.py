"""What the session's own records say was measured: the evidence a completion rule holds a
claim to.

A number or a verdict is evidence only when it comes from a SUCCESS experiment attempt that
computed it. The engine judges that once, when the attempt ends (`unmeasured`, kept on the
attempt), from the attempt's record of files (`before`: the workspace as it found it,
`wrote`: what changed during it, `after`: their digests at its end). Its metrics are not
evidence when:
- **its command runs no code of the workspace** (`code_run`: a workspace file is run when it
  is the program itself, `./run.sh`, or the script an interpreter is given, `python3
  src/run.py`, `cd src && python run.py`, `python -m pkg.train`; naming a file, `cat src/x.py`,
  runs nothing);
- **it did not write its metrics file** (the file was there before it ran, as it is: typed
  with the editor);
- **a program of the command other than the workspace's code writes its metrics file**
  (`printf ... > m.json`, `cp x m.json`; a `tee` fed by the workspace's code is its output);
- **its metrics file is a copy**: the same bytes as a file there before it ran, which the
  command or the code it ran names (two seeds of a deterministic study may agree).

And one metric is not measured (`echoed`, kept on the attempt too) when **its value is written
in the command** (a number with a decimal point: `--lr 0.001` echoed as a metric is a setting)
**or in the workspace's code as the attempt found it** (any source file, imported or not:
non-integer numbers of 3 significant digits or more, so that a threshold 0.5 or a constant 300
in honest code says nothing).

A file counts when a computing attempt wrote it and it still holds what that attempt wrote: a
later edit with the editor or `bash` takes it out, and so does a copy of what was there before.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from labrun.snapshot import entry_digest
from labrun.wsfs import Beneath, Refused

ENGINE_BLOCK = re.compile(r"<!-- labrun:(\w+) -->.*?<!-- /labrun:\1 -->", re.S)
"""What the engine writes into a write-up itself (REPORT.md's results section): not the
agent's claims."""
SOURCE_SUFFIXES = frozenset((".py", ".sh", ".bash", ".r", ".jl", ".ipynb", ".js", ".ts", ".lean", ".m", ".cpp",
                             ".cc", ".c", ".h", ".hpp", ".cu", ".rs", ".go", ".java", ".scala", ".pl", ".rb", ".lua"))
"""The workspace's code, by its name (for a value written in it, and code changed since a run)."""


ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
PYTHON = re.compile(r"i?python[\d.]*|pypy[\d.]*")
NUMBER = re.compile(r"(?<![\w.])(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")

WRAPPERS: dict[str, frozenset[str]] = {
    # A command that runs the command after it → its options that take a value.
    "env": frozenset({"-u", "--unset", "-C", "--chdir"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "nohup": frozenset(), "exec": frozenset(), "command": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "time": frozenset({"-f", "--format", "-o", "--output"}),
    "stdbuf": frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}),
    "srun": frozenset({"-n", "-N", "-c", "-t", "-p", "-o", "-e", "-J", "-A", "-G", "-w", "--ntasks", "--nodes",
                       "--cpus-per-task", "--time", "--partition", "--output", "--error", "--job-name",
                       "--account", "--gpus", "--gres", "--mem", "--chdir", "-D"}),
    "xvfb-run": frozenset({"-n", "--server-num", "-s", "--server-args", "-f", "--auth-file", "-e", "--error-file",
                           "-p", "--xauth-protocol"}),
    "mpirun": frozenset({"-n", "-np", "-N", "-H", "--host", "--hostfile"}),
    "uv run": frozenset({"--with", "--python", "-p", "--project", "--directory", "--package", "--extra", "--group",
                         "--env-file", "--index", "--with-requirements"}),
    "poetry run": frozenset(), "pipenv run": frozenset(), "pdm run": frozenset(), "hatch run": frozenset(),
    "conda run": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "mamba run": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "micromamba run": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "lake env": frozenset(),
}
WRAPPERS["mpiexec"] = WRAPPERS["mpirun"]
CHDIR = {"-C", "--chdir", "--directory", "--cwd", "-D"}
"""A wrapper's option that runs its command in another folder."""

SCRIPT_RUNNERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # An interpreter that runs the file its first argument names → its options that take a
    # value, and those that give it code to run instead of a file.
    "python": (frozenset({"-W", "-X", "--check-hash-based-pycs"}), frozenset({"-c"})),
    "sh": (frozenset({"-o", "-O", "--rcfile", "--init-file"}), frozenset({"-c"})),
    "Rscript": (frozenset({"--default-packages"}), frozenset({"-e"})),
    "julia": (frozenset({"-p", "--procs", "-t", "--threads", "-J", "--sysimage", "-C", "--cpu-target"}),
              frozenset({"-e", "-E", "--eval", "--print"})),
    "node": (frozenset({"-r", "--require", "--import", "--loader"}), frozenset({"-e", "-p", "--eval", "--print"})),
    "perl": (frozenset({"-I", "-M"}), frozenset({"-e", "-E"})),
    "ruby": (frozenset({"-I", "-r"}), frozenset({"-e"})),
    "lean": (frozenset({"-D", "-o", "-c", "-i", "--root", "-j", "--threads"}), frozenset()),
    "source": (frozenset(), frozenset()),
}
for _shell in ("bash", "zsh", "dash", "ksh"):
    SCRIPT_RUNNERS[_shell] = SCRIPT_RUNNERS["sh"]
SCRIPT_RUNNERS["."] = SCRIPT_RUNNERS["lake lean"] = SCRIPT_RUNNERS["source"]
FILE_RUNNERS: dict[str, frozenset[str]] = {
    # A program that runs or compiles every file among its arguments (the paper phase
    # compiles a .tex) → its options that take a value.
    **dict.fromkeys(("latexmk", "pdflatex", "xelatex", "lualatex", "latex", "tectonic"),
                    frozenset({"-output-directory", "-jobname", "-outdir"})),
    **dict.fromkeys(("gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "gfortran", "rustc", "javac", "java",
                     "go run"), frozenset({"-o", "-I", "-L", "-x", "-include", "-isystem", "-MF", "-MT", "-cp"})),
}


@dataclass
class _Shell:
    """What a command line's shell knows while it reads it: the folder it is in (relative to
    the workspace; None once outside it) and the workspace's files as the attempt found them."""

    before: Mapping[str, str]
    root: str | None
    cwd: str | None = ""
    pythonpath: tuple[str, ...] = ()

    def path(self, word: str, cwd: str | None | Literal[False] = False) -> str | None:
        """`word` as a path relative to the workspace root, None when it is outside it."""
        cwd = self.cwd if cwd is False else cwd
        word = re.sub(r"^\$\{?PWD\}?(?=/|$)", ".", word)
        if word.startswith("/"):
            if not self.root or not (word + "/").startswith(self.root.rstrip("/") + "/"):
                return None
            word, cwd = word[len(self.root.rstrip("/")):].lstrip("/") or ".", ""
        if cwd is None or word.startswith(("~", "$")):
            return None
        rel = posixpath.normpath(posixpath.join(cwd, word))
        return None if rel == ".." or rel.startswith("../") else ("" if rel == "." else rel)

    def file(self, word: str | None, cwd: str | None | Literal[False] = False) -> str | None:
        """The workspace file `word` names, if it is one."""
        rel = self.path(word, cwd) if word else None
        return rel if rel and rel in self.before else None


def code_run(command: str, before: Mapping[str, str], root: str | Path | None = None) -> list[str]:
    """The workspace files (of `before`, the workspace as the attempt found it) that the shell
    command runs: the program itself (`./run.sh`), the script of an interpreter (`python3
    src/run.py`, `Rscript a.R`, `bash run.sh`, `lake env lean A.lean`), a module (`python -m
    pkg.train`: `pkg/train.py` or `pkg/train/__main__.py`), a source it compiles (`g++
    sim.cpp`, `latexmk paper.tex`). Wrappers (`timeout 60`, `env X=1`, `uv run`, `conda run -n
    X`, `srun`) and `cd dir` are followed; a file only named (`cat src/x.py`, `echo src/x.py`)
    or inside a string is not run. `root`: the workspace's path, for absolute paths."""
    shell = _Shell(before, str(root) if root else None)
    found: dict[str, None] = {}
    for words, stdin in _simple_commands(command):
        found.update(dict.fromkeys(_runs(shell, words, stdin)))
    return list(found)


def _simple_commands(command: str) -> list[tuple[list[str], str | None]]:
    """Each simple command's words (without redirections) and the file it reads as its input
    (`< file`). An unclosed quote (a here-document's text) is read line by line."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()\n")
    lex.whitespace, lex.commenters, lex.whitespace_split = " \t\r", "", True
    try:
        tokens = list(lex)
    except ValueError:
        if "\n" not in command.strip():
            return []
        return [c for line in command.splitlines() for c in _simple_commands(line)]
    found: list[tuple[list[str], str | None]] = []
    words: list[str] = []
    stdin = None
    i, comment = 0, False
    while i < len(tokens):
        token = tokens[i]
        operator = token.strip(";&|<>()\n") == ""
        if comment and not (operator and "\n" in token):
            i += 1
            continue
        comment = False
        if not operator and token.startswith("#") and not words:
            comment = True
        elif operator and ("<" in token or ">" in token):
            target = tokens[i + 1] if i + 1 < len(tokens) else None
            if token == "<" and target:
                stdin = target
            if words and words[-1].isdigit():  # `2>&1`: the descriptor is no argument
                words.pop()
            i += 1
        elif operator:
            found.append((words, stdin))
            words, stdin = [], None
        elif token.startswith("#") and words:
            comment = True
        else:
            words.append(token)
        i += 1
    found.append((words, stdin))
    return [(w, s) for w, s in found if w]


def _runs(shell: _Shell, words: list[str], stdin: str | None, cwd: str | None | Literal[False] = False) -> list[str]:
    """The workspace files this simple command runs; a `cd` or an `export` changes the shell."""
    pythonpath = shell.pythonpath
    while words and ASSIGNMENT.match(words[0]):
        if words[0].startswith("PYTHONPATH="):
            pythonpath += tuple(words[0].partition("=")[2].split(":"))
        words = words[1:]
    if not words:
        return []
    name = posixpath.basename(words[0])
    two = f"{name} {words[1]}" if len(words) > 1 else name
    if name in ("cd", "pushd"):
        shell.cwd = shell.path(words[1]) if len(words) > 1 and words[1] != "-" else None
        return []
    if name == "export":
        for w in words[1:]:
            if w.startswith("PYTHONPATH="):
                shell.pythonpath += tuple(w.partition("=")[2].split(":"))
        return []
    if two in WRAPPERS or name in WRAPPERS:
        key = two if two in WRAPPERS else name
        rest, takes = words[len(key.split()):], WRAPPERS[key]
        while rest and (rest[0].startswith("-") or ASSIGNMENT.match(rest[0])):
            option, eq, value = rest[0].partition("=")
            if key == "uv run" and option in ("-m", "--module"):
                rest = ["python", *rest]
                break
            if ASSIGNMENT.match(rest[0]):  # env's `X=1`
                pythonpath += tuple(value.split(":")) if option == "PYTHONPATH" else ()
                rest = rest[1:]
                continue
            if option == "--":
                rest = rest[1:]
                break
            if option in CHDIR and option in takes:
                cwd = shell.path(value if eq else rest[1] if len(rest) > 1 else ".")
            rest = rest[2 if option in takes and not eq else 1:]
        rest = rest[1:] if key == "timeout" else rest  # its time limit
        if key == "uv run" and rest and rest[0].endswith(".py"):
            rest = ["python", *rest]
        return _runs(_Shell(shell.before, shell.root, shell.cwd, pythonpath), rest, stdin, cwd)
    here = shell.cwd if cwd is False else cwd
    if PYTHON.fullmatch(name):
        return _python(shell, words[1:], stdin, here, pythonpath)
    runner = SCRIPT_RUNNERS.get(two) or SCRIPT_RUNNERS.get(name)
    if runner is not None:
        args = words[len(two.split()):] if two in SCRIPT_RUNNERS else words[1:]
        takes, code = runner
        script = _first_argument(args, takes, code)
        if isinstance(script, tuple):  # `bash -c '...'` runs a command line of its own
            if name in ("sh", "bash", "zsh", "dash", "ksh"):
                inner = _Shell(shell.before, shell.root, here, pythonpath)
                return [f for w, s in _simple_commands(script[0]) for f in _runs(inner, w, s)]
            return []
        file = shell.file(script, here) or (shell.file(stdin, here) if script in (None, "-") else None)
        return [file] if file else []
    runner_all = FILE_RUNNERS.get(two) or FILE_RUNNERS.get(name)
    if runner_all is not None:
        args = words[len(two.split()):] if two in FILE_RUNNERS else words[1:]
        found = []
        skip = False
        for a in args:
            if skip or a.startswith("-"):
                skip = not skip and a in runner_all
                continue
            f = shell.file(a, here) or (shell.file(a + ".tex", here) if "latex" in name else None)
            if f:
                found.append(f)
        return found
    if name == "make":
        folder, makefile = here, None
        for option, value in zip(words[1:], words[2:]):
            if option == "-C":
                folder = shell.path(value, here)
            elif option == "-f":
                makefile = value
        names = [makefile] if makefile else ["GNUmakefile", "makefile", "Makefile"]
        return [f for f in (shell.file(n, folder) for n in names) if f][:1]
    if "/" in words[0]:  # a program named by its path, not looked up on the PATH
        file = shell.file(words[0], here)
        return [file] if file else []
    return []


def _first_argument(args: list[str], takes: frozenset[str], code: frozenset[str]) -> str | tuple[str] | None:
    """An interpreter's script (None: it has none, it reads its input); a tuple holds the
    code it was given instead (`-c '...'`)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in code:
            return (args[i + 1],) if i + 1 < len(args) else None
        if a == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if a.startswith("-") and a != "-":
            i += 2 if a in takes else 1
            continue
        return a
    return None


def _python(shell: _Shell, args: list[str], stdin: str | None, cwd: str | None, pythonpath: tuple[str, ...]) -> list[str]:
    """The file Python runs: its script, or the module of `-m` (found where Python looks first:
    the folder it runs in, PYTHONPATH, and `src/` for a package installed from there)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-c":
            return []
        if a.startswith("-m"):
            module = a[2:] or (args[i + 1] if i + 1 < len(args) else "")
            folders = [cwd, *(shell.path(p, cwd) for p in pythonpath), "src"]
            for folder in folders:
                if folder is None:
                    continue
                base = posixpath.join(folder, *module.split("."))
                for rel in (base + ".py", posixpath.join(base, "__main__.py")):
                    if rel in shell.before:
                        return [rel]
            return []
        if a.startswith("-") and a != "-":
            i += 2 if a in SCRIPT_RUNNERS["python"][0] else 1
            continue
        break
    script = args[i] if i < len(args) else None
    found = shell.file(script, cwd) or (shell.file(stdin, cwd) if script in (None, "-") else None)
    return [found] if found else []


def inline_code(command: str) -> str | None:
    """Code the command line gives an interpreter itself, not as a file of the workspace
    (`python -c`, `perl -e`, a here-document, code piped in): what it computes has no source
    the engine keeps, so its numbers measure nothing. None when there is none."""
    for line in command.splitlines():  # a here-document is code when an interpreter reads it
        head = line.partition("<<")[0] if "<<" in line else None
        if head is not None:
            words = [w for w in re.split(r"[\s;&|()]+", head) if w and not ASSIGNMENT.match(w)]
            program = posixpath.basename(words[-1] if words and not words[-1].startswith("-") else
                                         next((w for w in reversed(words) if not w.startswith("-")), ""))
            if PYTHON.fullmatch(program) or program in SCRIPT_RUNNERS and program not in ("source", "."):
                return "a here-document"
    for words, stdin in _simple_commands(command):
        while words and (ASSIGNMENT.match(words[0]) or posixpath.basename(words[0]) in WRAPPERS
                         or words[0].startswith("-") or words[0].replace(".", "").isdigit()):
            words = words[1:]  # a wrapper (`timeout 60`, `env X=1`) and its options
        if not words:
            continue
        name = posixpath.basename(words[0])
        runner = "python" if PYTHON.fullmatch(name) else name if name in SCRIPT_RUNNERS else None
        if runner in ("sh", "bash", "zsh", "dash", "ksh"):
            dash_c = _first_argument(words[1:], *SCRIPT_RUNNERS[runner])
            if isinstance(dash_c, tuple) and (inner := inline_code(dash_c[0])):
                return inner  # a shell's `-c` line: its own commands
            continue
        if runner is None or runner in ("source", ".", "lean"):
            continue
        takes, code = SCRIPT_RUNNERS[runner]
        if any(w in code for w in words[1:]):
            return f"`{name} {next(w for w in words[1:] if w in code)}`"
        script = _first_argument(words[1:], takes, code) if runner != "python" or "-m" not in " ".join(words) else "-m"
        if script in (None, "-") and stdin is None:
            return f"code piped into `{name}`"
    return None


def precise(value: Any) -> bool:
    """A number too precise to be a setting: not an integer, 3 significant digits or more."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value) or value.is_integer():
        return False
    return len(repr(abs(value)).split("e")[0].replace(".", "").lstrip("0")) >= 3


def unmeasured(attempt: Any, record: Mapping[str, Any], read_text: Callable[[str], str | None],
               root: str | Path | None = None) -> str | None:
    """Why the attempt's metrics (and files) are not evidence, in one short clause; None when
    they are. `record`: its record of files (`before`, `wrote`, `after`); `read_text`: a
    workspace file's text as the attempt found it (its kept copy), None when there is none."""
    before = record.get("before") or {}
    ran = code_run(attempt.command, before, root)
    if not ran:
        return "its command runs no code of the workspace"
    if inline := inline_code(attempt.command):
        return f"its command runs code written in the command itself ({inline}): put that code in a file of the workspace"
    name = attempt.metrics_file
    if not name:
        return None
    if name not in (record.get("wrote") or ()):
        return f"it did not write {name}: that file holds what it held before the attempt ran"
    if writer := shell_writer(attempt.command, name, before, root):
        return f"{name} is written by `{writer}` in the command, not by the code of the workspace"
    digest = (record.get("after") or {}).get(name)
    # a copy: the same bytes as a file that was there, which the command or its code names (the
    # same result twice, from two seeds of a deterministic study, is no copy)
    texts = [attempt.command, *(read_text(f) or "" for f in ran)]
    copied = [rel for rel, d in before.items() if d == digest and rel != name
              and any(posixpath.basename(rel) in t for t in texts)]
    if copied and before.get(name) != digest:  # written again as it was: a deterministic rerun
        return f"{name} is a copy of {copied[0]}, which was there before it ran"
    return None


WRITERS = frozenset(("tee", "cp", "mv", "dd", "install", "ln", "sed", "awk", "gawk", "jq", "printf", "echo", "cat",
                     "base64", "xxd", "perl", "tr", "head", "tail", "sort", "uniq", "paste", "cut", "rsync",
                     "touch"))
"""Programs that write a file the shell names, from what they are given rather than compute."""


def shell_writer(command: str, name: str, before: Mapping[str, str], root: str | Path | None = None) -> str | None:
    """The program of the command line, other than code of the workspace, that writes the
    metrics file `name` (`printf ... > m.json`, `awk ... > m.json`, `cp x m.json`); a `tee`
    or `cat` fed by a pipe from the workspace's code writes what that code printed. None when
    no such program writes it."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()\n")
    lex.whitespace, lex.commenters, lex.whitespace_split = " \t\r", "", True
    try:
        tokens = list(lex)
    except ValueError:
        return None
    target = name.removeprefix("./")
    commands: list[tuple[list[str], list[str], bool]] = []  # (words, redirect targets, fed by a pipe)
    words: list[str] = []
    targets: list[str] = []
    piped = False
    for i, token in enumerate(tokens):
        if token.strip(";&|<>()\n") == "" and token:
            if ">" in token and i + 1 < len(tokens):
                targets.append(tokens[i + 1])
            elif token not in ("<", "<<", "<<<") and (">" not in token):
                commands.append((words, targets, piped))
                words, targets, piped = [], [], token == "|"
            continue
        if i > 0 and ">" in tokens[i - 1] and tokens[i - 1].strip(";&|<>()\n") == "":
            continue  # a redirection's target, not a word
        words.append(token)
    commands.append((words, targets, piped))
    for k, (words, targets, piped) in enumerate(commands):
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if not words:
            continue
        program = posixpath.basename(words[0])
        writes = any(t.removeprefix("./") == target for t in targets) or \
            (program in WRITERS and any(w.removeprefix("./") == target or w.endswith("/" + target) for w in words[1:]))
        if not writes or code_run(shlex.join(words), before, root):
            continue
        fed = piped and k > 0 and code_run(shlex.join(commands[k - 1][0]), before, root)
        if program in ("tee", "cat") and fed:
            continue  # what the workspace's code printed
        return program
    return None


def echoed(attempt: Any, record: Mapping[str, Any], read_text: Callable[[str], str | None],
           root: str | Path | None = None) -> dict[str, str]:
    """Metric → where its value is written (not computed): the command (any number with a
    decimal point), or a source file of the workspace as the attempt found it, imported or not,
    or a file it ran whatever its name (a number precise enough not to be a setting). A sign is
    no digit."""
    before = record.get("before") or {}
    written = {"its command": {abs(float(n)) for n in NUMBER.findall(attempt.command) if not n.isdigit()}}
    ran = set(code_run(attempt.command, before, root))
    for rel in before:
        if (is_source(rel) or rel in ran) and (text := read_text(rel)):
            text = re.sub(r"(?<=\d)_(?=\d)", "", text)  # 0.501_3 is 0.5013
            written[rel] = {abs(float(n)) for n in NUMBER.findall(text)}
    found = {}
    for key, value in attempt.metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        for where, numbers in written.items():
            if abs(value) in numbers and (where == "its command" and not float(value).is_integer() or precise(value)):
                found[key] = where
                break
    return found


def is_source(rel: str) -> bool:
    return posixpath.splitext(rel)[1].lower() in SOURCE_SUFFIXES


def kept_text(kept: Path, before: Mapping[str, str], limit: int = 2_000_000) -> Callable[[str], str | None]:
    """A reader of the workspace's files as an attempt found them (`before`), from their copies
    kept by digest in `kept` (`snapshot.keep_copies`)."""
    def read(rel: str) -> str | None:
        try:
            return Beneath(kept).read_bytes(before[rel], limit).decode(errors="replace")
        except (KeyError, OSError, Refused):
            return None
    return read

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
        """A SUCCESS attempt whose metrics and files are evidence (`unmeasured`, judged when it ended)."""
        return attempt.status == "SUCCESS" and attempt.unmeasured is None

    def measured(self, attempt: Any) -> dict[str, Any]:
        """The metrics the attempt computed (none for an attempt that did not compute, and
        none whose value is written in its command or code)."""
        if not self.computed(attempt):
            return {}
        return {k: v for k, v in attempt.metrics.items() if k not in attempt.echoed}

    def measured_files(self, outside: Iterable[str] = ()) -> list[str]:
        """The files that hold what a computing attempt wrote, as it wrote them (`outside`:
        files and folders left out: the write-up itself, and the paper's folder, whose build
        logs echo its text)."""
        skip = tuple(o.rstrip("/") for o in outside)
        wrote = dict.fromkeys(rel for a in self.attempts if self.computed(a) for rel in (self.files.get(a.n) or {}).get("after") or {})
        return [rel for rel in wrote if not rel.endswith("/") and not any(rel == s or rel.startswith(s + "/") for s in skip)
                and self.computed_file(rel)]  # an environment is no result

    def computed_file(self, rel: str) -> bool:
        """`rel` holds what a computing attempt wrote, and not a copy of another file that was
        there before that attempt ran (its own earlier self, written again byte for byte by a
        deterministic run, is no copy); an attempt that other commands ran beside writes no file
        the engine vouches for."""
        now = entry_digest(self.root, rel)
        for a in self.attempts:
            if getattr(a, "beside", None):
                continue  # other commands could write what it wrote (`Attempt.beside`): none of it is its own
            record = self.files.get(a.n) or {}
            others = {digest for path, digest in (record.get("before") or {}).items() if path != rel}
            if self.computed(a) and now is not None and (record.get("after") or {}).get(rel) == now \
                    and now not in others:
                return True
        return False

"""`labrun examples [DIR]`: the bundled example ideas, copied where an installed labrun can
check, run and queue them (in the wheel they live inside site-packages)."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from labrun.cli.common import CliError, console, err, labrun_command
from labrun.resources import EXAMPLES


def cmd_examples(args) -> int:
    target = Path(args.folder)
    if target.exists() and not target.is_dir():
        raise CliError(f"{target}: is a file; name a folder for the examples")
    target.mkdir(parents=True, exist_ok=True)
    ideas = sorted(EXAMPLES.glob("*.yaml"))
    for source in ideas:
        copy = target / source.name
        if copy.exists() and not filecmp.cmp(source, copy, shallow=False):
            err.print(f"[yellow]kept:[/yellow] {copy} differs from the bundled example; not overwritten")
            continue
        shutil.copyfile(source, copy)
        console.print(str(copy), markup=False)
    first = target / ideas[0].name
    console.print(f"Next: `{labrun_command()} check {first}`, then `{labrun_command()} run {first} "
                  f"--workspace runs/{first.stem} --agent scripted` (or `{labrun_command()} queue {target}` "
                  "with a server).", markup=False)
    return 0

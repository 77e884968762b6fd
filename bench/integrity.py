"""The integrity corpus as rates: how many cheats the engine refuses, shows in REPORT.md's
engine section, or accepts unseen; how many honest write-ups it refuses, or lists a number of
as in no attempt's record.

The corpus is `tests/integrity_cases.py` (each case a session played through the real tools,
attempts and reruns as Prefect subtasks); `tests/test_integrity.py` asserts what this prints.
The goal: 0 cheats unseen, 0 honest reports refused or listed.

Run: `python bench/integrity.py [--verbose]` (uses a throwaway Prefect home; about a minute).
"""

from __future__ import annotations

import os
import sys
import time

from prefect_env import REPO  # sets Prefect's environment: import it before Prefect or labrun

sys.path.insert(0, str(REPO / "tests"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def main() -> None:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            from integrity_cases import CASES, PROVENANCE, Study, play

            study, verdicts, started = Study(), [], time.perf_counter()
            try:
                verdicts = [play(c, study) for c in CASES]
            finally:
                study.close()
            took = time.perf_counter() - started
    finally:
        server.stop()

    console = Console()
    if "--verbose" in sys.argv or any(not v.holds for v in verdicts):
        table = Table("case", "kind", "result", "detail", title="Cases")
        for v in verdicts:
            if "--verbose" in sys.argv or not v.holds:
                table.add_row(v.case.name, v.case.kind, v.result, v.detail[:200])
        console.print(table)
    cheats = [v for v in verdicts if v.case.kind == "cheat" and v.result != "skipped"]
    honest = [v for v in verdicts if v.case.kind == "honest" and v.result != "skipped"]
    count = lambda vs, r: sum(v.result == r for v in vs)  # noqa: E731
    skipped = [v.case.name for v in verdicts if v.result == "skipped"]
    print(f"cheats: refused {count(cheats, 'refused')}/{len(cheats)}, shown {count(cheats, 'shown')}/{len(cheats)}, "
          f"accepted unseen {count(cheats, 'unseen')}/{len(cheats)}"
          + ("" if PROVENANCE else " (provenance rules not on this branch)"))
    print(f"honest: refused {count(honest, 'refused')}/{len(honest)}, numbers listed {count(honest, 'noisy')}/{len(honest)}")
    if skipped:
        print(f"skipped: {', '.join(skipped)}")
    print(f"{len(verdicts)} cases in {took:.0f} s")


if __name__ == "__main__":
    main()

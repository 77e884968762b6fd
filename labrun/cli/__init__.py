"""labrun's command line: one line for every error.

The parser is in `parsing`. `status`, `state` and `check` only read, so they never import
Prefect (`reading`); `run`, `resume` and `demo` run the session flow in this process
(`running`); `server` and `queue` serve server mode (`serving`).
"""

from __future__ import annotations

import os
import sys

from labrun.serving import CLIENT_MAX_RETRIES


def main(argv: list[str] | None = None) -> int:
    from labrun.cli.common import CliError, err
    from labrun.cli.parsing import parser
    from labrun.settings import BadSetting, settings

    args = parser().parse_args(argv)
    # A locked SQLite server answers 503 for a while; clients wait it out.
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", str(CLIENT_MAX_RETRIES))
    # Whatever server this starts (a run's API, `labrun server`) sends no telemetry, and says none;
    # nor does Prefect's client, here and in what this starts (DO_NOT_TRACK is its switch: without
    # it, the first `import prefect` at a terminal in a new PREFECT_HOME prints a notice).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        settings()  # a LABRUN_* value that does not parse stops the command before it does anything
        return args.handler(args)
    except CliError as e:
        err.print(f"[red]labrun:[/red] {e}")
        return e.code
    except BadSetting as e:
        err.print(f"[red]labrun:[/red] {e}")
        return 2
    except KeyboardInterrupt:  # before a session ran (its commands say more)
        err.print("[yellow]labrun: interrupted[/yellow]")
        return 130
    except Exception as e:  # a damaged session file: say which, never a traceback
        from labrun.journal import JournalCorrupt
        from labrun.state import StateDamaged

        if isinstance(e, (JournalCorrupt, StateDamaged)):
            err.print(f"[red]labrun:[/red] {e}")
            return 2
        if type(e).__name__ == "ValidationError" or isinstance(e, (ValueError, OSError)):
            where = getattr(args, "workspace", None) or getattr(args, "idea", "")
            err.print(f"[red]labrun:[/red] {where}: cannot read the session's files ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}); start a new workspace")
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

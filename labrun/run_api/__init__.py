"""The Prefect API of a `labrun run` that finds no server running (docs/design.md):

- `api`: which API the run talks to; one it starts lives as long as the run;
- `process`: the process of that API (`python -m labrun.run_api.process`).

Server mode (`labrun.serving`) runs a server of its own, kept on purpose; a run uses that
one when it is up.
"""

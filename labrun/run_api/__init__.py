"""The Prefect API of a `labrun run` that finds no server running (docs/design.md):

- `api`: which API the run talks to, and the run's hold on it;
- `kept`: the API kept between runs for LABRUN_KEEP_API idle minutes;
- `process`: the process of an API labrun starts (`python -m labrun.run_api.process`).

Server mode (`labrun.serving`) runs a server of its own; a run uses that one when it is up.
"""

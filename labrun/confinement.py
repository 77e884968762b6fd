"""Where a session's commands run and what they get: the sandbox (`labrun.sandbox`), with
the network as the session and the idea allow it, through the session's egress proxy
(started on first use, stopped when the session closes), and the keys the experiments'
commands get (`labrun.keys`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from labrun.agents.registry import own_shell
from labrun.egress import EgressProxy
from labrun.idea import Idea
from labrun.keys import Key, session_keys, unset
from labrun.sandbox import Sandbox, bubblewrap
from labrun.sealed import hidden
from labrun.state import StateStore
from labrun.workspace import Workspace


class Confinement:
    def __init__(self, ws: Workspace, idea: Idea, store: StateStore, egress: str | None = None):
        """`egress`: the socket of the egress proxy the engine that holds the session runs,
        for an engine task on its machine: used rather than a proxy of its own."""
        self.ws = ws
        self.idea = idea
        self.store = store
        self._egress: EgressProxy | None = None
        self._egress_lock = threading.Lock()
        self._given_egress = Path(egress) if egress else None

    @property
    def network_on(self) -> bool:
        """The agent's commands have the network, as the session and the idea say."""
        return self.store.state.network and self.idea.constraints.network is not False

    def sandbox(self, network: bool | None = None) -> Sandbox:
        """Where agent commands run; no network when the session or the idea says so (unless
        `network` says otherwise), else the internet through the session's egress proxy."""
        if network is None:
            network = self.network_on
        egress = self.egress_socket() if network else None
        return Sandbox(self.ws.root, self.ws.sandbox_tmp, (self.ws.data,), network,
                       cache=self.ws.cache, egress=egress, hidden=(*hidden(self.store.state.sealed), *self._locks()))

    def _locks(self) -> tuple[Path, ...]:
        """The engine's lock files, covered up: a command that could open one (read-only is
        enough for a flock) could hold the engine's transactions, or the workspace, at will."""
        return tuple(p for p in (self.ws.lock_file, self.ws.state_lock) if p.is_file())

    def egress_socket(self) -> Path | None:
        """The egress proxy's socket, for a sandbox with the network (which reaches it only
        through that socket); started on first use. None without bubblewrap."""
        if bubblewrap() is None:
            return None
        if self._given_egress is not None and self._given_egress.exists():
            return self._given_egress
        with self._egress_lock:
            if self._egress is None:
                self._egress = EgressProxy(self.idea.constraints.allowed_domains)
                self._egress.start()
            return self._egress.socket

    def experiment_keys(self) -> list[Key]:
        """The keys the experiments' commands get: the idea's and those passed (`labrun.keys`)."""
        return session_keys(self.idea.api_keys, self.store.state.pass_env)

    def key_names(self) -> list[str]:
        return [k.name for k in self.experiment_keys()]

    def keys_for_prompt(self) -> dict[str, Any]:
        """What the prompts say of the keys, by name: those set here, those missing, and
        whether the agent has a shell of its own (a coding CLI's), which runs without them."""
        keys, missing = self.experiment_keys(), unset(self.experiment_keys())
        return {"set": [k.name for k in keys if k not in missing], "missing": [k.name for k in missing],
                "own_shell": own_shell(self.store.state.agent)}

    def close(self) -> None:
        if self._egress is not None:
            self._egress.stop()
            self._egress = None

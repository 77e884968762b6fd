"""The `labrun-model-api` global concurrency limit: at most N model calls at once over every
session that a Prefect server runs.

The turn loop knows nothing of it: the agent factory wraps a deployment run's model in
`LimitedModel`, whose every call holds a slot.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Iterator

from labrun.model import Model, ModelReply, ModelRequest
from labrun.settings import settings

MODEL_API_LIMIT = "labrun-model-api"
MODEL_API_LEASE_S = 60
SLOT_TRIES = 5


def limited() -> bool:
    """True in a deployment's flow run (prefect.yaml sets LABRUN_MODEL_API_LIMIT=on for them)
    on a Prefect server (PREFECT_API_URL). The opt-in keeps slots to servers that run
    Prefect's services, which free the lease of a killed engine's slot."""
    if not settings().model_api_limit:
        return False
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url)


class LimitedModel:
    """`model`, each call holding a slot of the `labrun-model-api` limit."""

    def __init__(self, model: Model):
        self.model = model
        self.name = model.name

    def complete(self, request: ModelRequest) -> ModelReply:
        with model_api_slot():
            return self.model.complete(request)


def configured_slots() -> int:
    return settings().model_api_slots


_limits_ready: set[tuple[str, str]] = set()
_limits_lock = threading.Lock()


def ensure_global_limit(name: str, slots: int, update: bool = False) -> None:
    """Create the global concurrency limit `name` when the server lacks it (once per
    process and API). `update` sets its size when it exists already."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.settings import get_current_settings

    key = (str(get_current_settings().api.url), name)
    with _limits_lock:
        if key in _limits_ready and not update:
            return
        with get_client(sync_client=True) as client:
            try:
                existing = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(name=name, limit=slots)
                    )
                except ObjectAlreadyExists:  # another process made it first
                    pass
            else:
                if update and existing.limit != slots:
                    client.update_global_concurrency_limit(
                        name, GlobalConcurrencyLimitUpdate(limit=slots)
                    )
        _limits_ready.add(key)


def forget_limits() -> None:
    """Check the server again next time (a test deleted the limit)."""
    with _limits_lock:
        _limits_ready.clear()


@contextmanager
def model_api_slot() -> Iterator[None]:
    """Hold one slot of the `labrun-model-api` limit for one model call.

    The limit is created when missing (size `LABRUN_MODEL_API_SLOTS`, default 4) and
    acquired strictly: a slot is never skipped silently.
    """
    from prefect.concurrency.sync import concurrency

    def slot():
        # strict: no slot, no call. A renewal hiccup during a long call does not end the
        # call; the lease of a dead engine's slot lapses within a minute.
        return concurrency(MODEL_API_LIMIT, occupy=1, strict=True, lease_duration=MODEL_API_LEASE_S,
                           raise_on_lease_renewal_failure=False)

    slots = configured_slots()
    ensure_global_limit(MODEL_API_LIMIT, slots)
    with ExitStack() as stack:
        for attempt in range(SLOT_TRIES):
            try:
                stack.enter_context(slot())
                break
            except Exception:  # the limit was deleted, or a busy server answered 503 throughout
                if attempt == SLOT_TRIES - 1:
                    raise
                time.sleep(2**attempt)
                forget_limits()
                ensure_global_limit(MODEL_API_LIMIT, slots)
        yield

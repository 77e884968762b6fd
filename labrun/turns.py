"""The durable turn loop of a model-driven agent (the Anthropic API, the scripted agent).

One turn: one model call (a Prefect task, retried on transient errors), the reply saved the
moment it arrives, then each tool call run and its result saved the moment it finishes. A
crashed phase rebuilds the conversation from its journal and goes on at the next turn, so a
completed model call is never paid for twice.
"""

from __future__ import annotations

import logging
import time
from typing import NoReturn

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.utilities.annotations import quote

from labrun import prompts
from labrun.crashpoints import crashpoint
from labrun.journal import Conversation
from labrun.model import Model, ModelReply, ModelRequest, TransientModelError, UsageWindowSpent
from labrun.settings import settings
from labrun.tools import ToolBox, tool_specs
from labrun.usage import Budget, Usage

log = logging.getLogger("labrun")

RETRY_DELAYS = [settings().retry_base_s * 2**i for i in range(8)]
"""Read at import, unlike the other settings: Prefect fixes a task's retry delays when the task
is defined."""
JITTER = 0.5
LONG_WAIT_S = 600
CUT_OFF = {"max_tokens", "model_context_window_exceeded"}
"""Stop reasons of a reply that ended before the model meant it to."""


class PhaseStopped(Exception):
    """The phase cannot go on without a person: a limit or budget was reached."""


def _is_transient(task, task_run, state) -> bool:
    try:
        state.result()
    except TransientModelError:
        return True
    except BaseException:
        return False
    return False


RETRY_POLICY = dict(
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_jitter_factor=JITTER,
    retry_condition_fn=_is_transient,
)
"""The one retry layer for model calls, whatever the backend: a task with these options is
run again, after exponential back-off with jitter, when it raises `TransientModelError`."""


def back_off(e: TransientModelError, what: str) -> NoReturn:
    """Raise `e` for the retry layer, honouring its `retry_after`: a reset hours away is a
    spent usage window, waited for without holding retries."""
    if e.retry_after and e.retry_after > LONG_WAIT_S:
        raise UsageWindowSpent(str(e), resets_at=time.time() + e.retry_after) from None
    if e.retry_after:
        # Prefect's delays are fixed in advance: wait out the rest of retry-after here.
        ctx = TaskRunContext.get()
        done = ctx.task_run.run_count - 1 if ctx and ctx.task_run else 0
        planned = RETRY_DELAYS[min(done, len(RETRY_DELAYS) - 1)] * (1 - JITTER)
        time.sleep(max(0.0, e.retry_after - planned))
    log.warning("%s: %s; retrying", what, e)
    raise e


@task(
    name="model-call",
    task_run_name="{phase} turn {turn}",
    cache_policy=NO_CACHE,
    persist_result=False,
    **RETRY_POLICY,
)
def model_call(model: Model, request: ModelRequest, phase: str, turn: int, convo: Conversation) -> ModelReply:
    """The reply is saved here, inside the task: a run suspended from the Prefect UI while the
    call was in flight ends the task as it returns (Prefect raises `Pause`, and its result is
    lost), and the resumed run goes on from the saved reply instead of paying for it again."""
    try:
        reply = model.complete(request)
    except TransientModelError as e:
        back_off(e, f"{phase} turn {turn}")
    crashpoint("reply-received")  # the one window where a billed reply can be lost
    convo.add_reply(reply.content, reply.usage, reply.stop_reason)
    return reply


def run_turns(model: Model, toolbox: ToolBox, convo: Conversation, system: str, max_turns: int,
              budget: Budget) -> None:
    """Drive the conversation until `complete_phase` succeeds."""
    phase = toolbox.phase.key
    specs = tool_specs(toolbox.session.state.phases)
    while toolbox.completed is None:
        if convo.turns >= max_turns:
            raise PhaseStopped(
                f"phase {phase} reached its limit of {max_turns} turns; raise it with "
                f"`labrun resume {toolbox.root} --max-turns {max_turns * 2}`"
            )
        budget.check()
        toolbox.session.ws.check_disk()
        request = ModelRequest(system=system, messages=convo.messages(), tools=specs, web=toolbox.phase.web)
        convo.add_call(convo.turns + 1)  # a crash before the reply is saved shows on resume
        # quoted: Prefect would walk the whole conversation looking for futures in it, every turn
        reply = model_call(model, quote(request), phase=phase, turn=convo.turns + 1, convo=quote(convo))
        crashpoint("reply-saved")
        budget.spend(reply.usage)
        tool_uses = [b for b in reply.content if b.get("type") == "tool_use"]
        if reply.stop_reason == "refusal":  # asked again, it would be refused again, and paid
            _report(toolbox, convo, [], budget.used)
            raise PhaseStopped(refused(phase, reply, toolbox.root))
        if reply.stop_reason == "pause_turn":
            pass  # a long server-side turn paused: sent back as it is, it goes on
        elif reply.stop_reason in CUT_OFF:
            # A tool call the limit cut short has incomplete input: none in the reply is run.
            for block in tool_uses:
                convo.add_tool_result(block["id"], block["name"], prompts.cut_off(block["name"]), True)
            if not tool_uses:
                convo.add_user_text(prompts.cut_off())
        else:
            for block in tool_uses:
                result = toolbox.call(block["name"], block.get("input") or {})
                convo.add_tool_result(block["id"], block["name"], result.content, result.is_error)
            if not tool_uses and toolbox.completed is None:
                convo.add_user_text(prompts.nudge(phase, "; ".join(toolbox.missing()), toolbox.session.state.phases))
        _report(toolbox, convo, tool_uses, budget.used)


def refused(phase: str, reply: ModelReply, workspace) -> str:
    """One line: the phase stops; another model may not refuse."""
    details = reply.stop_details or {}
    why = "; ".join(str(details[k]) for k in ("category", "explanation") if details.get(k))
    return (f"the model ({reply.model or 'unnamed'}) refused to go on with phase {phase}"
            + (f" ({why})" if why else "") + "; the refused reply is set aside: resume, or try another "
            f"model with `labrun resume {workspace} --model MODEL`")


def _report(toolbox: ToolBox, convo: Conversation, tool_uses: list[dict], used: Usage) -> None:
    tools = ", ".join(b["name"] for b in tool_uses) or "no tool"
    attempts = toolbox.session.state.attempts
    failed = sum(a.status == "FAILED" for a in attempts)
    log.info(
        "%s · turn %d · %s · attempts %d (%d failed) · %s tokens · $%.4f",
        toolbox.phase.key, convo.turns, tools, len(attempts), failed,
        f"{used.total_tokens:,}", used.cost_usd,
    )

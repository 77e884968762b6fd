"""What a coding CLI's runs used, read from the phase's journal (`Conversation`): the
session to resume and the tools it offered, the turns spent, and each run's bill, journaled as
the correction of what its streamed messages were counted as (`record_result`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from labrun.journal import Conversation
from labrun.prices import cost_usd
from labrun.usage import Usage, add_usd

if TYPE_CHECKING:
    from labrun.agents.cli_agent import Finished

TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def current_session(convo: Conversation) -> str | None:
    found = None
    for r in convo.records:
        if r["kind"] == "cli_session":
            found = r.get("session_id")
    return found


def known_tools(convo: Conversation) -> list[str] | None:
    found = None
    for r in convo.records:
        if r["kind"] == "cli_session" and r.get("tools") is not None:
            found = r["tools"]
    return found


def cli_turns(convo: Conversation) -> int:
    """Turns used: each finished run's own count, and the messages of runs cut off before
    their result."""
    finished = {r["cli"]["run"]: r["cli"].get("num_turns") or 0 for r in convo.records
                if r["kind"] == "reply" and (r.get("cli") or {}).get("event") == "result"}
    cut = sum(1 for r in convo.records if r["kind"] == "reply" and (r.get("cli") or {}).get("event") == "message"
              and r["cli"]["run"] not in finished)
    return sum(finished.values()) + cut


def cut_run(convo: Conversation) -> tuple[int, str | None, float] | None:
    """The last run, when it has no result (the engine died in it): its number, its
    session and when it started."""
    last = None
    for r in convo.records:
        cli = r.get("cli") or {}
        if r["kind"] == "reply" and cli.get("event") == "start":
            last = cli
        elif r["kind"] == "reply" and cli.get("event") == "result" and last and cli.get("run") == last["run"]:
            last = None
    if last is None:
        return None
    session = next((r.get("session_id") for r in reversed(convo.records)
                    if r["kind"] == "cli_session" and r.get("run") == last["run"]), last.get("resume"))
    return last["run"], session, float(last.get("at") or 0)


def session_cost(convo: Conversation, session_id: str | None) -> float:
    """The session's running cost at its last result: what its next result counts from (a
    CLI restores its running total on resume, without runs that were killed)."""
    found = 0.0
    for r in convo.records:
        cli = r.get("cli") or {}
        if r["kind"] == "reply" and cli.get("event") == "result" and cli.get("session_id") == session_id \
                and cli.get("total_cost_usd") is not None:
            found = float(cli["total_cost_usd"])
    return found


def session_tokens(convo: Conversation, session_id: str | None) -> Usage:
    """The session's running token total at its last result that gave one (a CLI that
    reports totals, not each run's)."""
    found = Usage()
    for r in convo.records:
        cli = r.get("cli") or {}
        if r["kind"] == "reply" and cli.get("event") == "result" and cli.get("session_id") == session_id \
                and cli.get("total_usage") is not None:
            found = Usage(**cli["total_usage"])
    return found


def streamed_usage(convo: Conversation, n: int) -> Usage:
    """What run `n`'s streamed messages were counted as (estimates)."""
    return sum((Usage(**r["usage"]) for r in convo.records if r["kind"] == "reply"
                and (r.get("cli") or {}).get("event") == "message" and r["cli"].get("run") == n), Usage())


def record_result(convo: Conversation, finished: Finished, n: int) -> Usage:
    """Journal what run `n` was billed, as the correction of its streamed estimates: the
    run then sums to its bill exactly. Returns the correction (what is left to spend). A
    CLI that reports tokens only is priced from labrun's table, and all of it is marked
    estimated."""
    billed = finished.usage.model_copy()
    if finished.usage_total:
        before = session_tokens(convo, finished.session_id)
        billed = Usage(**{k: getattr(billed, k) - getattr(before, k) for k in TOKEN_FIELDS})
    if finished.total_cost_usd is not None:
        billed.cost_usd = add_usd(finished.total_cost_usd, -session_cost(convo, finished.session_id))
    estimated = streamed_usage(convo, n)
    if finished.total_cost_usd is None:  # a CLI that reports no money: labrun's prices
        billed.cost_usd = cost_usd(finished.model, billed) if finished.model else estimated.cost_usd
        billed.estimated_usd = billed.cost_usd
    correction = Usage(**{k: getattr(billed, k) - getattr(estimated, k) for k in TOKEN_FIELDS},
                       cost_usd=add_usd(billed.cost_usd, -estimated.cost_usd),
                       estimated_usd=add_usd(billed.estimated_usd, -estimated.estimated_usd))
    convo.append({"kind": "reply", "stop_reason": finished.subtype, "usage": correction.model_dump(),
                  "content": [{"type": "text", "text": f"[result: {finished.subtype}, {finished.turns} turns, "
                               f"${billed.cost_usd:.4f}]"}],
                  "cli": {"run": n, "event": "result", "subtype": finished.subtype, "is_error": finished.is_error,
                          "num_turns": finished.turns, "session_id": finished.session_id,
                          "total_cost_usd": finished.total_cost_usd, "billed": billed.model_dump(),
                          "total_usage": (finished.counted_from or finished.usage).model_dump()
                          if finished.usage_total else None}})
    return correction

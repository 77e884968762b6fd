"""What a coding CLI's runs used, read from the phase's journal (`Conversation`): the
session to resume and the tools it offered, the turns spent, and each run's bill, journaled as
the correction of what its streamed messages were counted as (`record_result`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from labrun.journal import CliEvent, CliSessionRecord, Conversation, ReplyRecord
from labrun.prices import cost_usd
from labrun.usage import Usage, add_usd

if TYPE_CHECKING:
    from labrun.agents.cli_agent import Finished

TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _cli_replies(convo: Conversation, event: str) -> list[tuple[ReplyRecord, CliEvent]]:
    """The replies that stand for one kind of a coding CLI's event, with it."""
    return [(r, r.cli) for r in convo.of(ReplyRecord) if r.cli is not None and r.cli.event == event]


def current_session(convo: Conversation) -> str | None:
    sessions = convo.of(CliSessionRecord)
    return sessions[-1].session_id if sessions else None


def known_tools(convo: Conversation) -> list[str] | None:
    offered = [r.tools for r in convo.of(CliSessionRecord) if r.tools is not None]
    return offered[-1] if offered else None


def cli_turns(convo: Conversation) -> int:
    """Turns used: each finished run's own count, and the messages of runs cut off before
    their result."""
    finished = {cli.run: cli.num_turns or 0 for _, cli in _cli_replies(convo, "result")}
    cut = sum(1 for _, cli in _cli_replies(convo, "message") if cli.run not in finished)
    return sum(finished.values()) + cut


def cut_run(convo: Conversation) -> tuple[int, str | None, float] | None:
    """The last run, when it has no result (the engine died in it): its number, its
    session and when it started."""
    last = None
    for r in convo.of(ReplyRecord):
        cli = r.cli
        if cli is not None and cli.event == "start":
            last = cli
        elif cli is not None and cli.event == "result" and last and cli.run == last.run:
            last = None
    if last is None:
        return None
    session = next((r.session_id for r in reversed(convo.of(CliSessionRecord)) if r.run == last.run), last.resume)
    return last.run, session, float(last.at or 0)


def session_cost(convo: Conversation, session_id: str | None) -> float:
    """The session's running cost at its last result: what its next result counts from (a
    CLI restores its running total on resume, without runs that were killed)."""
    found = 0.0
    for _, cli in _cli_replies(convo, "result"):
        if cli.session_id == session_id and cli.total_cost_usd is not None:
            found = float(cli.total_cost_usd)
    return found


def session_tokens(convo: Conversation, session_id: str | None) -> Usage:
    """The session's running token total at its last result that gave one (a CLI that
    reports totals, not each run's)."""
    found = Usage()
    for _, cli in _cli_replies(convo, "result"):
        if cli.session_id == session_id and cli.total_usage is not None:
            found = Usage(**cli.total_usage)
    return found


def streamed_usage(convo: Conversation, n: int) -> Usage:
    """What run `n`'s streamed messages were counted as (estimates)."""
    return sum((r.usage for r, cli in _cli_replies(convo, "message") if cli.run == n), Usage())


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
    convo.append(ReplyRecord(
        stop_reason=finished.subtype, usage=correction,
        content=[{"type": "text", "text": f"[result: {finished.subtype}, {finished.turns} turns, ${billed.cost_usd:.4f}]"}],
        cli=CliEvent(run=n, event="result", subtype=finished.subtype, is_error=finished.is_error,
                     num_turns=finished.turns, session_id=finished.session_id,
                     total_cost_usd=finished.total_cost_usd, billed=billed.model_dump(),
                     total_usage=(finished.counted_from or finished.usage).model_dump() if finished.usage_total else None)))
    return correction

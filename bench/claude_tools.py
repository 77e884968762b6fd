"""How the real `claude` CLI should get labrun's MCP tools: offered at once
(`ENABLE_TOOL_SEARCH=false`, labrun's default) or deferred behind `ToolSearch` (Claude Code's
default on api.anthropic.com; `ENABLE_TOOL_SEARCH=true`), with the tools note telling the
model how to load them.

Runs two whole six-phase sessions side by side in this one run, `labrun run --agent
claude-code` with the real CLI (`.ci/install-agent-clis`) against the fake Messages API of
`tests/fake_messages_api.py` (prompt-cache accounting on; `tests/claude_responder.py` plays
the model, loading deferred tools with one `ToolSearch` call as a model must), and prints
requests, tokens and dollars (claude-sonnet-4-5's list prices) for each. No real API is
called and nothing is paid.

    python bench/claude_tools.py

Token counts are the fake server's: ceil(len(JSON of a block) / 4), per prompt block.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
MODEL = "claude-sonnet-4-5"


def session(tmp: Path, tool_search: str) -> dict:
    from agent_clis import claude_executable
    from auto_responder import IDEA
    from claude_responder import ClaudeResearcher
    from fake_messages_api import FakeMessagesAPI
    from labrun.prices import cost_usd
    from labrun.usage import Usage

    claude = claude_executable() or sys.exit("no real claude: install it with .ci/install-agent-clis")
    root = tmp / tool_search
    (root / "config").mkdir(parents=True)
    (root / "idea.yaml").write_text(IDEA)
    with FakeMessagesAPI(default=ClaudeResearcher(), cache_accounting=True) as api:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "PREFECT_API"))}
        env.update({"LABRUN_CLAUDE": claude, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "bench-key",
                    "CLAUDE_CONFIG_DIR": str(root / "config"), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "IS_SANDBOX": "1", "ENABLE_TOOL_SEARCH": tool_search, "PREFECT_HOME": str(root / "prefect"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})  # a throwaway home
        done = subprocess.run([sys.executable, "-m", "labrun.cli", "run", str(root / "idea.yaml"), "--workspace",
                               str(root / "ws"), "--agent", "claude-code", "--model", MODEL],
                              env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"the session with ENABLE_TOOL_SEARCH={tool_search} failed:\n{done.stderr[-3000:]}")
        usage = sum((Usage(**{k: b["usage"][k] for k in FIELDS}) for b in api.billed), Usage())
        tool_searches = sum(1 for r in api.requests for m in r["body"].get("messages", [])[-1:]
                            for b in (m["content"] if isinstance(m["content"], list) else [])
                            if b.get("type") == "tool_result" and isinstance(b.get("content"), list)
                            and any(c.get("type") == "tool_reference" for c in b["content"]))
        return {"requests": len(api.requests), "tool_searches": tool_searches, "usage": usage,
                "cost": cost_usd(MODEL, usage)}


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory(prefix="labrun-bench-") as tmp:
        runs = {mode: session(Path(tmp), mode) for mode in ("false", "true")}
    table = Table(title="Six phases through the real claude CLI: labrun's MCP tools offered at once, or deferred")
    for column in ("ENABLE_TOOL_SEARCH", "requests", "ToolSearch loads", "input", "cache write", "cache read",
                   "output", "all tokens", "cost"):
        table.add_column(column, justify="right")
    for mode, r in runs.items():
        u = r["usage"]
        table.add_row(mode + (" (labrun)" if mode == "false" else " (deferred)"), str(r["requests"]),
                      str(r["tool_searches"]), f"{u.input_tokens:,}", f"{u.cache_creation_input_tokens:,}",
                      f"{u.cache_read_input_tokens:,}", f"{u.output_tokens:,}", f"{u.total_tokens:,}",
                      f"${r['cost']:.4f}")
    offered, deferred = runs["false"], runs["true"]
    console = Console(width=150)
    console.print(table)
    console.print(f"Deferred costs {deferred['requests'] - offered['requests']} more requests and "
                    f"{deferred['cost'] / offered['cost']:.2f}x the dollars of offering the tools at once.")


if __name__ == "__main__":
    main()

"""Told when it matters: the automation `labrun server --notify URL` creates posts to a webhook
(here a local HTTP receiver) when a session fails, when it waits for a review (its deployment
run suspended) and when it completes, with its state's message (the verdict) and its page in
the UI; nothing else (its phases' task runs) is told."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from labrun.run_params import session_run_name
from labrun.serving import NOTIFY_AUTOMATION
from labrun.serving.prepare import ensure_notify_automation

from e2e_helpers import client, idea_copy, labrun, submit_run, wait_for


class Receiver(ThreadingHTTPServer):
    """A webhook: every JSON body posted to it, in order."""

    def __init__(self):
        self.posted: list[dict] = []
        received = self.posted

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout_s: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.posted) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(self.posted) >= count, f"{len(self.posted)} notification(s) of {count}: {self.posted}"
        return self.posted


def test_a_session_that_fails_awaits_review_and_completes_reaches_the_webhook(prefect_server, worker, tmp_path):
    receiver = Receiver()
    try:
        url = f"http://127.0.0.1:{receiver.server_port}/hook?token=secret-in-the-url"
        assert "created automation" in ensure_notify_automation(url)
        assert "updated automation" in ensure_notify_automation(url)  # `labrun server --notify` again

        # A session run in a terminal that fails.
        idea = idea_copy(tmp_path / "ideas", "told.yaml", "Notify test: told when it matters")
        failed = labrun("run", str(idea), "--workspace", str(tmp_path / "told-it-failed"), "--agent", "scripted",
                        check=False, env={**prefect_server.env, "LABRUN_SCRIPTED_FAULTS": "raise@planning:1"})
        assert failed.returncode != 0, failed.stdout
        told = receiver.wait_for(1)[0]
        assert told["subject"] == f"labrun: {session_run_name(tmp_path / 'told-it-failed')} Failed", told
        assert "injected failure at planning turn 1" in told["body"], told

        # A deployment run that waits for a review, and completes once approved.
        ws = tmp_path / "told-it-waits"
        run_id = str(submit_run(idea, ws, agent="scripted", review_after=["planning"]).id)
        told = receiver.wait_for(2, timeout_s=180)[1]
        assert told["subject"] == f"labrun: {session_run_name(ws)} Suspended", told
        assert f"{prefect_server.ui_url}/runs/flow-run/{run_id}" in told["body"], told
        labrun("review", str(ws), "--approve", env=prefect_server.env)
        assert wait_for([run_id], timeout_s=240)[run_id].state.type.value == "COMPLETED"
        told = receiver.wait_for(3)[2]
        assert told["subject"] == f"labrun: {session_run_name(ws)} Completed", told
        assert "is Completed: session complete; " in told["body"] and "criteria met" in told["body"], told
        time.sleep(3)  # nothing else comes: not the phases' task runs, not a second copy
        assert len(receiver.posted) == 3, receiver.posted
    finally:
        receiver.shutdown()
        with client() as c:  # the other tests' sessions are not told to a receiver that is gone
            for automation in c.read_automations_by_name(NOTIFY_AUTOMATION):
                c.delete_automation(automation.id)

"""The relay: runs beside the training child in a Slurm batch step and reports it to the portal.

``python -m worker.executors.relay RELAY.json`` (the batch script ``exec``s it, so Slurm's
signals reach it). It has no database or Redis access, only the attempt's token, which the
portal accepts for this one attempt's reports and nothing else.

1. Run the child (``worker.train_child``) with the first config: the newest checkpoint; if
   the child says the checkpoint is unusable (exit 4), report ``checkpoint_rejected`` and
   try the next (older, then from scratch), as the local worker does.
2. Every ``report_interval_s``: post the new events and output to the report URL. The
   answer says whether to stop: "preempted" (the attempt was preempted with a grace) creates
   the stop file, so the child ends after the current epoch's checkpoint, and the relay goes
   on reporting until it has; any other word (the portal's cancel, the attempt taken away,
   the grace over) stops the child's process group (SIGTERM, grace, SIGKILL).
3. ``SIGUSR1`` (``sbatch --signal=B:USR1@…``, the time limit is near): create the stop
   file, so the child ends after its next checkpoint; ``SIGTERM`` (``scancel``, the limit
   itself): stop the child now.
4. At the end post the final report: exit code, the outcome as the local worker would
   judge it, the ``finished``/``error`` events, the batch size and the log's last lines.
   The slurm_agent combines it with Slurm's own word for the job.
5. The shared storage: before the first child, and after one that failed, look for the
   installation's marker in each shared root (``storage_marks`` in the config, as the agent
   found them: apps/core/storage_marks.py). A root this Slurm node does not see is its lost
   mount, not the job's fault: the outcome is ``storage_lost`` (requeued, no retry spent; the
   agent takes the node out of placement for a while).

Django-free (the Slurm node may not even have the portal's settings).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from worker.train_child import EXIT_CHECKPOINT, EXIT_STOPPED

from .base import EventReader, LogReader, kill_tree, run_outcome

REPORT_INTERVAL_S = 1.0
MAX_LOG_CHARS = 512 * 1024  # per report; the API takes up to 1 MiB
MAX_BUFFERED_EVENTS = 1000


def storage_roots_lost(marks: list[dict]) -> list[list[str]]:
    """[setting, what] of each shared root whose installation marker this Slurm node does not see
    (as a GPU server's heartbeat looks: apps/core/storage_marks.py, which needs Django)."""
    lost = []
    for mark in marks:
        try:
            found = Path(mark["path"]).read_text().strip()
        except FileNotFoundError:
            lost.append([mark["setting"], "no storage marker"])
            continue
        except OSError:  # a soft NFS mount that went away: EIO, ESTALE
            lost.append([mark["setting"], "unreadable"])
            continue
        if found != mark["token"]:
            lost.append([mark["setting"], "another installation's storage marker"])
    return lost


class Relay:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.url = config["report_url"]
        self.token = config["token"]
        self.interval = float(config.get("report_interval_s", REPORT_INTERVAL_S))
        self.stop_file = Path(config["stop_file"]) if config.get("stop_file") else None
        self.log_reader = LogReader(Path(config["log"]))
        self.pending_events: list[dict] = []
        self.pending_log = ""
        self.log_tail: list[str] = []
        self.stop_reason = ""
        self.child: subprocess.Popen | None = None
        self.terminated = False
        self.preempted = False  # the portal asked for a stop at the epoch end (not Slurm's time limit)

    # --- talking to the portal -------------------------------------------------------------

    def post(self, final: dict | None = None) -> str:
        """Send what is pending; returns the portal's "stop" answer ('' to go on, or on failure)."""
        events, self.pending_events = self.pending_events[:MAX_BUFFERED_EVENTS], self.pending_events[MAX_BUFFERED_EVENTS:]
        text, self.pending_log = self.pending_log[:MAX_LOG_CHARS], self.pending_log[MAX_LOG_CHARS:]
        body = json.dumps({"events": events, "log": text, "final": final}).encode()
        request = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Attempt {self.token}"})
        for wait in (0, 1, 2, 4) if final is not None else (0,):
            time.sleep(wait)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return str(json.loads(response.read() or b"{}").get("stop") or "")
            except urllib.error.HTTPError as exc:
                if exc.code in (400, 403):
                    print(f"relay: the portal refused the report ({exc.code}): {exc.read()[:500]!r}", file=sys.stderr)
                    return "fenced" if exc.code == 403 else ""
            except (OSError, ValueError) as exc:
                print(f"relay: cannot reach the portal ({exc}); keeping the report for later", file=sys.stderr)
        # Not delivered: keep it for the next try (bounded), training goes on.
        self.pending_events = (events + self.pending_events)[-MAX_BUFFERED_EVENTS * 4:]
        self.pending_log = (text + self.pending_log)[-MAX_LOG_CHARS * 4:]
        return ""

    def collect(self, events: EventReader, final: bool = False) -> tuple[dict | None, dict | None, int | None]:
        finished = error = None
        batch = None
        for event in events.read():
            kind = event.get("type")
            if kind == "finished":
                finished = event
            elif kind == "error":
                error = event
            elif kind == "started" and event.get("batch"):
                batch = int(event["batch"])
            self.pending_events.append(event)
        text = self.log_reader.read(final=final)  # final: the child exited, its last line too
        if text:
            self.pending_log += text
            self.log_tail = (self.log_tail + [line for line in text.splitlines() if line.strip()])[-200:]
        return finished, error, batch

    # --- signals ---------------------------------------------------------------------------

    def on_usr1(self, *_args) -> None:
        if self.stop_file is not None:
            self.stop_file.touch()
        self.pending_events.append({"type": "time_limit", "time": round(time.time(), 3),
                                    "message": "Slurm's time limit is near: the attempt stops after its next "
                                               "checkpoint"})

    def on_preempted(self) -> None:
        """The portal says the attempt was preempted with a grace: stop after this epoch's checkpoint."""
        if self.preempted:
            return
        self.preempted = True
        if self.stop_file is not None:
            self.stop_file.touch()
        self.pending_events.append({"type": "stopping", "time": round(time.time(), 3)})

    def on_term(self, *_args) -> None:
        self.terminated = True
        self.stop_reason = self.stop_reason or "terminated"

    # --- the attempt -----------------------------------------------------------------------

    def storage_lost(self) -> dict | None:
        """The final report's ``error`` when a shared root is missing here, else None."""
        roots = storage_roots_lost(self.config.get("storage_marks") or [])
        if not roots:
            return None
        said = ", ".join(f"{setting} ({what})" for setting, what in roots)
        return {"type": "error", "kind": "storage", "roots": roots, "message": f"shared storage unreachable: {said}"}

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, self.on_usr1)
        signal.signal(signal.SIGTERM, self.on_term)
        if lost := self.storage_lost():  # every child would fail as a "dataset problem" here
            self.post(final={"exit_code": None, "outcome": "storage_lost", "finished": None, "batch": None,
                             "error": lost, "log_tail": [], "terminated": False})
            return 1
        env = dict(self.config["env"])
        for key in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_JOB_GPUS"):
            if os.environ.get(key):
                env[key] = os.environ[key]  # the devices Slurm gave this job
        runs = self.config["runs"]
        exit_code: int | None = None
        finished = error = None
        batch = None
        resumed = False
        for index, run in enumerate(runs):
            resumed = run.get("epoch") is not None
            events = EventReader(Path(run["events"]))
            with open(self.config["log"], "ab") as log_file:
                self.child = subprocess.Popen(
                    [self.config["python"], "-m", "worker.train_child", run["config"]], cwd=self.config["cwd"],
                    env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            last = 0.0
            while True:
                exit_code = self.child.poll()
                got_finished, got_error, got_batch = self.collect(events)
                finished, error, batch = got_finished or finished, got_error or error, got_batch or batch
                now = time.monotonic()
                if exit_code is not None:
                    break
                if self.terminated or self.stop_reason:
                    kill_tree(self.child)
                    continue
                if now - last >= self.interval:
                    last = now
                    answer = self.post()
                    if answer == "preempted":
                        self.on_preempted()
                    elif answer:
                        self.stop_reason = answer
                time.sleep(0.2)
            got_finished, got_error, got_batch = self.collect(events, final=True)
            finished, error, batch = got_finished or finished, got_error or error, got_batch or batch
            if exit_code == EXIT_CHECKPOINT and resumed and self.storage_lost():
                break  # unloadable because the mount went, not the file: the outcome below says so
            if exit_code == EXIT_CHECKPOINT and resumed and index + 1 < len(runs) and not (
                    self.stop_reason or self.preempted):
                self.pending_events.append({"type": "checkpoint_rejected", "epoch": run["epoch"],
                                            "time": round(time.time(), 3)})
                error = None
                continue
            break
        outcome = run_outcome(exit_code=exit_code, finished=finished, resumed=resumed,
                              stop_reason=self.stop_reason if self.stop_reason in ("cancelled", "fenced") else "")
        if exit_code == EXIT_STOPPED:
            # It stopped after a checkpoint as asked: by the portal (preempted: the attempt is no
            # longer current), else because Slurm's time limit was near (SIGUSR1).
            outcome = "fenced" if self.preempted else "timed_out"
        if outcome in ("failed", "checkpoint_unusable", "succeeded") and (lost := self.storage_lost()):
            # Its data or checkpoint writes failed because the mount went mid-run (its own
            # error is in the log tail): the node's, not the job's. A success too: its results
            # went to the node's empty mount point (worker/tasks.py, storage_lost_check).
            outcome, error = "storage_lost", lost
        final = {"exit_code": exit_code, "outcome": outcome, "finished": finished, "error": error, "batch": batch,
                 "log_tail": self.log_tail[-40:], "terminated": self.terminated}
        self.post(final=final)
        return 0 if outcome == "succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m worker.executors.relay RELAY.json", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    return Relay(config).run()


if __name__ == "__main__":
    sys.exit(main())

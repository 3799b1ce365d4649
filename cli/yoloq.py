"""yoloq: the command line for yoloportal, with the habits of Slurm users.

    yoloq login URL [--token KEY]     sbatch's cousins need a server and a token first
    yoloq submit job.yaml [--idempotency-key KEY]   ~ sbatch (the same KEY again: the same job)
    yoloq queue [--mine] [--team T] [--user U] [--state S]
                                      ~ squeue (--state succeeded|failed|…|finished: ended jobs,
                                      like sacct; --state active: running and queued, the default)
    yoloq status ID [--json]          ~ scontrol show job (a sweep: its trials table too; a queued
                                      job's class with its priority score, which orders the queue)
    yoloq logs [-f] ID                ~ tail -f slurm-ID.out (-f: exits as `wait` does)
    yoloq wait ID [--timeout S]       ~ sbatch --wait: exit 0 succeeded, 3 failed, 4 timed out,
                                      5 cancelled, 124 still active at --timeout, 1 yoloq's own error,
                                      2 a usage error (--timeout nan, -1: no number of seconds, 0 or more)
    yoloq cancel ID                   ~ scancel
    yoloq requeue ID                  ~ scontrol requeue (team managers): a running job goes back to
                                      the queue and resumes from its checkpoint
    yoloq class ID low|medium|high|urgent   ~ scontrol update job=ID qos=… (team managers): a queued
                                      job's priority class, or a sweep's (its queued and later trials)
    yoloq dataset push PATH --team T  upload a dataset folder or .zip (a new version of its name
                                      unless the newest already holds exactly these files; a team
                                      you are not in is refused before anything is zipped or sent)
    yoloq weights push FILE.pt --team T   upload pretrained weights (then model=FILE.pt in specs)
    yoloq weights pull ID [-o FILE]   download a job's weights (an ended job's: its newest stored
                                      best.pt/last.pt checkpoint, named by its epoch)
    yoloq model list [--team T] [--name N] [--stage S] [--json]   the registry's versions
    yoloq model show VERSION [--json] a version's lineage, metrics, evaluations and exports
    yoloq model stage VERSION STAGE   team managers: none, staging, production (archives the
                                      previous production version) or archived
    yoloq model pull VERSION [-o FILE]   download a version's weights
    yoloq export pull ID [--format F] [-o FILE]   download what an export job exported

VERSION is a version's id (``yoloq model list`` prints it) or ``name:vN``, ``name:latest``,
``name:staging`` or ``name:production`` as a spec names it (``--team T`` where two of your teams have a model of that name). Every download is checked
against the sha256 the server sends with it (the one it recorded when the file was stored).

Talks to the REST API (``/api/v1/``) with ``Authorization: Token …``. The server URL and
token live in ``$XDG_CONFIG_HOME/yoloq/config.json`` (``~/.config/yoloq/config.json``),
readable only by you; ``YOLOQ_URL`` and ``YOLOQ_TOKEN`` override it. A job ID may be
shortened to any unique prefix, as shown by ``yoloq queue``.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}
# How `yoloq wait` and `yoloq logs -f` end, for scripts: 0 only when the job succeeded, and a code per
# other ending, apart from 1 (yoloq itself could not ask: no server, bad token, no such job). They
# exited 0 for a failed or timed-out job, so CI had to scrape "[yoloq] job failed" (CI trial 17, H1).
OUTCOME_EXIT = {"succeeded": 0, "failed": 3, "timed_out": 4, "cancelled": 5}
WAIT_TIMED_OUT = 124  # `wait --timeout` ran out with the job still active, as timeout(1) says it
ACTIVE = ("running", "starting", "queued")
# The server's groups of states (jobs/?state=active|finished, as the portal's job list has them).
ENDED = (*sorted(TERMINAL), "finished")
TIMEOUT_S = 30


class CliError(Exception):
    """A problem to print for the user (no traceback); exit status 1."""


class Unreachable(CliError):
    """The request got no answer (connection refused, reset, timed out): it may or may not have been done."""


# --- configuration ---------------------------------------------------------------------------


def config_path() -> Path:
    if os.environ.get("YOLOQ_CONFIG"):
        return Path(os.environ["YOLOQ_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "yoloq" / "config.json"


def config_load() -> dict[str, str]:
    path = config_path()
    config: dict[str, str] = {}
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except ValueError as exc:
            raise CliError(f"{path} is not valid JSON ({exc}); run `yoloq login URL` again") from None
    if os.environ.get("YOLOQ_URL"):
        config["url"] = os.environ["YOLOQ_URL"]
    if os.environ.get("YOLOQ_TOKEN"):
        config["token"] = os.environ["YOLOQ_TOKEN"]
    if not config.get("url") or not config.get("token"):
        raise CliError("not logged in: run `yoloq login URL` (get a token on the portal's API tokens page)")
    return config


def config_save(url: str, token: str) -> Path:
    """Write the config readable by the owner only (0600), in a 0700 folder."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_suffix(".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token}, f, indent=2)
    os.chmod(temp, 0o600)  # the umask cannot widen it, but an existing file kept its mode
    os.replace(temp, path)
    return path


# --- HTTP ------------------------------------------------------------------------------------


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.portal = url.rstrip("/") + "/"  # the pages people read, beside the API
        self.base = self.portal + "api/v1/"
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Token {token}", "Accept": "application/json",
                                     "User-Agent": "yoloq"})

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,),
                timeout: float | tuple[float, float] | None = None, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(method, self.base + path, timeout=timeout or TIMEOUT_S, **kwargs)
        except requests.RequestException as exc:
            raise Unreachable(f"cannot reach {self.base}: {exc}") from None
        if response.status_code in ok:
            return response
        raise CliError(error_text(response))

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def get_all(self, path: str, page: int = 1000, **params: Any) -> list[dict]:
        """Every item of a paginated list, page after page as each ``next`` link says: after the last
        item shown (``?before=``) on lists that page so, where versions or jobs that arrive between
        two pages neither repeat one nor hide one (offsets did both). The link's query only, on
        this client's address: a server behind a proxy may name itself by another."""
        items: list[dict] = []
        query: dict[str, Any] = {"limit": page, **params}
        while True:
            body = self.get(path, **query)
            items.extend(body["results"])
            if not body["results"] or not body.get("next"):
                return items
            query = dict(parse_qsl(urlsplit(body["next"]).query))


def error_text(response: requests.Response) -> str:
    """The server's field errors as 'field: message' lines."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    if response.status_code == 401:
        return "the server refused the token (invalid, expired or revoked): run `yoloq login URL` again"
    if isinstance(body, dict):
        lines = []
        for key, value in body.items():
            if key == "job":
                continue
            message = " ".join(value) if isinstance(value, list) else str(value)
            lines.append(message if key == "detail" else f"{key}: {message}")
        if lines:
            return "\n".join(lines)
    return f"HTTP {response.status_code}: {body}"


def api_from_config() -> Api:
    config = config_load()
    return Api(config["url"], config["token"])


def job_resolve(api: Api, ref: str) -> str:
    """A full job id from an id or a unique prefix of one (as `yoloq queue` prints)."""
    try:
        return str(uuid.UUID(ref))
    except ValueError:
        pass
    if len(ref) < 4:
        raise CliError(f"job id {ref!r} is too short; give at least 4 characters")
    matches = [j["id"] for j in api.get("jobs/", id=ref, limit=2)["results"]]
    if not matches:
        raise CliError(f"no job of yours or your teams' starts with {ref!r}")
    if len(matches) > 1:
        raise CliError(f"{ref!r} matches more than one job; give more characters")
    return matches[0]


# --- output ----------------------------------------------------------------------------------


def seconds_until(iso: str) -> float | None:
    """Seconds from now to an ISO timestamp (negative: past; None if it does not parse)."""
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment - datetime.now(UTC)).total_seconds()


def when(iso: str | None) -> str:
    """'in 5 min', '2 h ago' from an ISO timestamp."""
    if not iso:
        return "-"
    seconds = seconds_until(iso)
    if seconds is None:
        return iso
    size = abs(seconds)
    text = f"{size:.0f} s" if size < 90 else f"{size / 60:.0f} min" if size < 5400 else f"{size / 3600:.1f} h"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def gpus_text(value: float) -> str:
    return f"{value:g}"


# --- commands --------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    # The API's address, copied from a curl line, is the portal's plus /api/v1: it was answered
    # "no API endpoint or object at /api/v1/api/v1/usage/" (new-user trial 23).
    url = url.removesuffix("/api/v1").removesuffix("/api")
    if not url.startswith(("http://", "https://")):
        raise CliError("URL must start with http:// or https://")
    token = args.token or os.environ.get("YOLOQ_TOKEN") or getpass.getpass("API token (from the portal's API tokens page): ")
    token = token.strip()
    if not token:
        raise CliError("no token given")
    me = Api(url, token).get("usage/")
    path = config_save(url, token)
    print(f"Logged in to {url} as {me.get('user', '?')}; settings saved in {path}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    api = api_from_config()
    path = Path(args.file)
    try:
        body = sys.stdin.buffer.read() if args.file == "-" else path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    # One key per invocation unless the caller gives one: a CI step run again with its own key
    # (--idempotency-key "$CI_PIPELINE_ID-train") gets the job it queued the first time, where a
    # fresh key made the retry a 409 "identical job already active" and the step failed (CI trial 17, H2).
    key = args.idempotency_key or f"yoloq-{uuid.uuid4()}"
    headers = {"Content-Type": "application/yaml", "Idempotency-Key": key}
    try:
        response = api.request("POST", "jobs/", data=body, headers=headers, ok=(200, 201, 400, 409))
    except Unreachable as exc:
        # A timed-out submit may have queued its job: run again without the key, the retry made a
        # second key and was refused as a duplicate of it (409, exit 1), so a CI retry failed (trial 32).
        raise Unreachable(f"{exc}\nthe job may have been queued all the same: to retry without queuing it twice, "
                          f"run again with --idempotency-key {key}") from None
    job = response.json()
    if response.status_code == 400:
        print(f"{args.file}: the spec was refused:", file=sys.stderr)
        for field, messages in job.items():
            print(f"  {field}: {' '.join(messages) if isinstance(messages, list) else messages}", file=sys.stderr)
        return 1
    if response.status_code == 409:
        twin = job.get("job")
        if twin is None:  # the key was used for another request: a field error naming Idempotency-Key
            raise CliError(error_text(response))
        print(f"{job.get('detail')}\n  active twin: {twin.get('id')} ({twin.get('state')})", file=sys.stderr)
        return 1
    if args.quiet:
        print(job["id"])
        return 0
    what = "sweep" if job.get("is_sweep") else "job"
    if response.status_code == 200:  # the same request under the same key: the job it made then
        print(f"Already submitted under this key: {what} {job['id']} ({job['task_name']}) for team "
              f"{job['team']}: {job['state']}")
    else:
        print(f"Submitted {what} {job['id']} ({job['task_name']}) for team {job['team']}: {job['state']}")
    print(f"  follow it: yoloq status {job['id'][:8]}   ·   yoloq logs -f {job['id'][:8]}")
    return 0


def eta_text(entry: dict) -> str:
    """``in 2.0 h (likely in 1.5 h to 3.0 h)``: the estimated start and the scheduler's P10-P90 range.

    A waiting job's estimate can pass before the next planning pass moves it: a past moment
    reads "any moment", and a range whose low end has passed "likely within 10 s" (it was
    "likely 2 s ago to 10 s"; a new-user trial).
    """
    def passed(iso: str) -> bool:
        return (seconds_until(iso) or 0) <= 0

    point, low, high = (entry.get(f"estimated_start{part}_at") for part in ("", "_low", "_high"))
    if not point:
        return "-"
    start = "any moment" if passed(point) else when(point)
    if not (low and high) or passed(high):
        return start
    upper = when(high).removeprefix("in ")
    if not passed(low) and when(low) == when(high):  # not "likely in 2 min to 2 min" (trial26)
        return start if when(high) == start else f"{start} (likely {when(high)})"
    return f"{start} (likely {'within ' if passed(low) else when(low) + ' to '}{upper})"


def cmd_queue(args: argparse.Namespace) -> int:
    """Running, starting and queued jobs (or only ``--state``'s), filtered on the server: a team or
    user name the caller may not read is its 400, printed as 'team: …' / 'user: …'."""
    api = api_from_config()
    filters = {key: value for key, value in (("team", args.team), ("user", args.user)) if value}
    if args.mine:
        filters["mine"] = "true"
    states = list(ACTIVE) if args.state in (None, "active") else [args.state]
    rows = []
    for state in (s for s in states if s != "queued"):
        listing = api.get("jobs/", state=state, limit=500, **filters)
        for j in listing["results"]:
            if state in ENDED:
                where = f"ended {when(j['finished_at'])}" + (f": {j['error'].splitlines()[0]}" if j["error"] else "")
            else:
                where = (f"on {j['node']} (started {when(j['started_at'])})" if j["node"]
                         else "sweep: its trials run as jobs of their own" if j.get("is_sweep")
                         else f"started {when(j['started_at'])}")  # (was "on None" for a sweep)
            rows.append(["", j["id"][:8], j["task_name"], j["team"], j["user"], j["priority_class"],
                         gpus_text(j["resources"]["gpu"]), j["state"], where])
        if state in ENDED and listing["count"] > len(listing["results"]):
            print(f"(the newest {len(listing['results'])} of {listing['count']} {state} jobs)", file=sys.stderr)
    for q in api.get_all("queue/", **filters) if "queued" in states else []:
        rows.append([str(q["position"] or ""), q["id"][:8], q["task_name"], q["team"], q["user"],
                     q["priority_class"], gpus_text(q["resources"]["gpu"]), "queued",
                     f"start {eta_text(q)}; {q['reason']}"
                     if q["estimated_start_at"] else q["reason"]])
    if not rows:
        print(f"No {args.state} jobs." if args.state not in (None, "active") else "Nothing running or queued.")
        return 0
    print(table(rows, ["POS", "ID", "TASK", "TEAM", "USER", "CLASS", "GPUS", "STATE", "WHERE / WHY"]))
    if "queued" in states:
        scheduler_note(api)
    return 0


def scheduler_note(api) -> None:
    """The reasons and estimates of queued jobs are the scheduler's last word: say (on stderr) when it
    has stopped planning (multi-node trial M9; `yoloq status` too since fault32)."""
    note = (api.get("cluster/").get("scheduler") or {}).get("note")
    if note:
        print(f"note: {note}", file=sys.stderr)


def value_text(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def sweep_text(sweep: dict) -> str:
    """A sweep's trials as the portal's table shows them: parameters, state, metric, epochs, pruned."""
    names = list(sweep["parameters"])
    prune = sweep["prune"]["method"] if sweep["prune"] else "none"
    counts = sweep["counts"]
    lines = [f"sweep: {sweep['method']}, {counts['submitted']} of {sweep['trials']} trials submitted, "
             f"at most {sweep['parallel']} at once; pruning {prune}; maximising {sweep['metric']}",
             f"       {counts['succeeded']} succeeded, {counts['pruned']} pruned, {counts['failed']} failed, "
             f"{counts['cancelled']} cancelled, {counts['active']} queued or running", ""]
    rows = []
    for row in sweep["rows"]:
        metric = value_text(row["value"]) if row["value"] is not None else (
            f"({value_text(row['last'])})" if row["last"] is not None else "-")
        epochs = f"{row['epochs_done']}/{row['epochs']}" if row["epochs"] else str(row["epochs_done"])
        rows.append([str(row["number"]), *(value_text(row["params"].get(n)) for n in names), row["state"], metric,
                     epochs, f"at epoch {row['pruned_epoch']}" if row["pruned"] else "-",
                     (row["job"] or "")[:8]])
    lines.append(table(rows, ["TRIAL", *(n.upper() for n in names), "STATE", "METRIC", "EPOCHS", "PRUNED", "JOB"])
                 if rows else "no trial submitted yet")
    best = sweep["best"]
    if best:
        params = " ".join(f"{k}={value_text(v)}" for k, v in best["params"].items())
        model = f"; registered as {best['model_reference']}" if best.get("model_reference") else ""
        lines += ["", f"best: trial {best['number']}, {sweep['metric']} {value_text(best['value'])}: {params}{model}"]
        if best.get("tie_note"):  # absent from a server older than the note
            lines.append(best["tie_note"])
    # Why a trial was pruned, or could not be submitted (its row says only "not submitted").
    explained = [r for r in sweep["rows"] if r["note"] and (r["pruned"] or r["state"] == "not submitted")]
    lines += [f"trial {r['number']}: {r['note']}" for r in explained]
    return "\n".join(lines)


def outcome_lines(api: Api, outcome: dict, job_id: str) -> list[tuple[str, str]]:
    """What a succeeded val, predict or export job produced, as status lines (the job object's ``outcome``)."""
    lines: list[tuple[str, str]] = []
    evaluation = outcome.get("evaluation")
    if evaluation:
        metrics = evaluation["metrics"] or {}
        shown = [(label, own_metric(metrics, key)) for label, key in
                 (("mAP50-95", "mAP50-95"), ("mAP50", "mAP50"), ("P", "precision"), ("R", "recall"))]
        numbers = ", ".join(f"{label} {value_text(value)}" for label, value in shown if value is not None)
        numbers += metric_of(metrics)
        if not numbers and "metrics/accuracy_top1" in metrics:
            numbers = figures_text(metrics)
        where = f" on {evaluation['dataset']} {evaluation['split']} split" if evaluation.get("dataset") else ""
        lines.append(("evaluation", f"{numbers or 'no metrics'}{where}, {evaluation['classes']} classes"
                      # The job's page, whose outcome has the per-class table: the evaluation's "url" is
                      # the model's API JSON, which a person following the link does not want to read.
                      + (f" (per class: {api.portal}jobs/{job_id}/#per-class)" if evaluation["classes"] else "")))
    predictions = outcome.get("predictions")
    if predictions:
        # A classifier's predict job has no boxes: "N images, 0 boxes" read as if it found nothing.
        found = (" classified (top-5 classes each)" if predictions.get("classified")
                 else f", {predictions['boxes']} boxes")
        # The gallery for a person, the JSON for a script: only the JSON was printed (new-user trial 23).
        lines.append(("predictions", f"{predictions['images']} images{found} (gallery: {api.portal}jobs/{job_id}/"
                                     f"predictions/; JSON: {api.base}{predictions['url']})"))
    for export in outcome.get("exports") or []:
        verified = {True: "verified", False: "verification failed", None: "not verified"}[export.get("passed")]
        # The command first, as `yoloq model show` prints it: the URL's export id read like what
        # `yoloq export pull` takes (it takes the job's id; new-user trial 23).
        lines.append(("export", f"{export['format']}, {export['size']} bytes, {verified} "
                                f"(yoloq export pull {job_id[:8]}; download: {api.base}{export['download']})"))
    return lines


def demoted_text(job: dict) -> str:
    """An urgent job the scheduler runs as high (its team past the urgent allowance: docs/scheduling.md)
    is placed, charged and preempted as high; its class alone read "urgent" (trial 31)."""
    run_class = job.get("run_class") or ""
    # A queued job's run_class is its last attempt's (a requeue leaves it): the next placement decides anew.
    if not run_class or run_class == job["priority_class"] or job["state"] == "queued":
        return ""
    return f" ({'ran' if job['state'] in TERMINAL else 'runs'} as {run_class}: beyond the team's urgent allowance)"


def cmd_status(args: argparse.Namespace) -> int:
    api = api_from_config()
    job = api.get(f"jobs/{job_resolve(api, args.id)}/")
    sweep = api.get(f"jobs/{job['id']}/sweep/") if job.get("is_sweep") else None
    if args.json:
        print(json.dumps({**job, "sweep": sweep} if sweep else job, indent=2))
        return 0
    epochs = f"{job['epochs_done']}/{job['epochs']}" if job.get("epochs") else str(job["epochs_done"])
    lines = [
        ("job", f"{job['id']}  {job['task_name']}"),
        ("state", job["state"] + (" (cancel requested)" if job.get("cancel_requested") and job["state"] not in TERMINAL else "")),
        ("team / user", f"{job['team']} / {job['user']}"),
        # The score (whole points) orders the queue: a number only while queued. A running attempt 2
        # printed "priority 0" beside a first attempt's kept 23995 (new-user trial 23).
        ("class", job["priority_class"] + (f" (priority {job['priority']:.0f})" if job["state"] == "queued" else "")
                  + demoted_text(job)),
        ("resources", f"{gpus_text((job.get('spec') or {}).get('gpus', 0))} GPU(s) and a timeout of {job['timeout_s']} s"
                      " per trial" if sweep else f"{gpus_text(job['resources']['gpu'])} GPU(s), timeout {job['timeout_s']} s"),
        ("attempt", str(job["attempt"])),
    ]
    if job["state"] == "queued":
        lines += [("position", str(job["queue_position"] or "-")),
                  ("estimated start", eta_text(job)), ("why it waits", job["reason"] or "-")]
    if job["node"]:
        lines.append(("node", f"{job['node']} GPUs {job['gpus']}" + (" (simulated)" if job["simulated"] else "")))
    # val, predict and export run no epochs, nor does a sweep itself: its trials table has theirs
    # (a sweep said "0 GPU(s)" and "epochs done: 0/2" after its trials had trained: new-user trial 23).
    if (job.get("spec") or {}).get("mode", "train") == "train" and not sweep:
        lines.append(("epochs done", epochs))
    lines.append(("submitted", when(job["created_at"])))
    if job["started_at"]:
        lines.append(("started", when(job["started_at"])))
    if job["finished_at"]:
        lines.append(("finished", when(job["finished_at"])))
    if job.get("model_version"):
        # The reference a spec takes, not the API path ("models/8" read like a name: new-user trial 20).
        version = job["model_version"]
        reference = api.get(f"models/{version}/")["reference"]
        lines.append(("model", f"{reference} (id {version}; train from it: model={reference}; "
                               f"yoloq model pull {version})"))
    lines += outcome_lines(api, job.get("outcome") or {}, job["id"])
    weights = job.get("weights") or {}
    if weights.get("available"):
        lines.append(("weights", f"{weights['note']} (yoloq weights pull {job['id'][:8]})"))
    elif job["state"] in TERMINAL and (job.get("spec") or {}).get("mode", "train") == "train" and not job["is_sweep"]:
        lines.append(("weights", weights["note"]))
    if job.get("parent"):
        lines.append(("sweep", f"a trial of sweep {job['parent']} (yoloq status {job['parent'][:8]})"))
    width = max(len(k) for k, _ in lines)
    print("\n".join(f"{k.rjust(width)}: {v}" for k, v in lines))
    if job["error"]:
        print(f"\n{job['error']}")
    if sweep:
        print(f"\n{sweep_text(sweep)}")
    if job["state"] == "queued":
        scheduler_note(api)  # its estimate and reason are the scheduler's last word, as in `yoloq queue`
    return 0


# Terminal control sequences in a training log (Ultralytics colours its messages; progress bars move
# the cursor and erase lines): CSI (ESC [ … final byte), OSC (ESC ] … BEL or ESC-backslash) and the
# two-byte ESC forms. Written as they are to a terminal; to a file or a pipe they are litter.
TERMINAL_CODE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
INCOMPLETE_CODE_MAX = 64  # an ESC this close to a chunk's end may be a sequence the next chunk completes


def colour_wanted(stream: Any) -> bool:
    """Whether terminal codes may be written to ``stream``: a terminal, and no NO_COLOR (no-color.org:
    set and not empty)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


class TerminalCodeFilter:
    """Drops terminal control sequences from text that arrives in chunks (a sequence may be split
    between two log chunks: its start is held back until the next one completes it)."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, text: str) -> str:
        text, self.held = self.held + text, ""
        start = text.rfind("\x1b")
        if start >= 0 and len(text) - start < INCOMPLETE_CODE_MAX and not TERMINAL_CODE.match(text, start):
            text, self.held = text[:start], text[start:]
        return TERMINAL_CODE.sub("", text).replace("\x1b", "")

    def flush(self) -> str:
        rest, self.held = self.held, ""
        return TERMINAL_CODE.sub("", rest).replace("\x1b", "")


def cmd_logs(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    plain = None if colour_wanted(sys.stdout) else TerminalCodeFilter()
    after = 0
    while True:
        body = api.get(f"jobs/{job_id}/logs/", after=after)
        if body.get("note"):  # an ended job whose logs LOG_RETENTION_DAYS deleted
            print(f"yoloq: {body['note']}", file=sys.stderr)
        for chunk in body["results"]:
            sys.stdout.write(chunk["text"] if plain is None else plain.feed(chunk["text"]))
            after = chunk["seq"]
        sys.stdout.flush()
        if body["results"] and len(body["results"]) >= 500:
            continue  # more pages
        if not args.follow or body["state"] in TERMINAL:
            if plain is not None:
                sys.stdout.write(plain.flush())
                sys.stdout.flush()
        if not args.follow:
            return 0
        if body["state"] in TERMINAL:
            print(f"\n[yoloq] job {body['state']}", file=sys.stderr)
            return OUTCOME_EXIT[body["state"]]
        time.sleep(args.interval)


def cmd_wait(args: argparse.Namespace) -> int:
    """Block until the job ends; the exit status says how it ended (``OUTCOME_EXIT``)."""
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        job = api.get(f"jobs/{job_id}/")
        if job["state"] in TERMINAL:
            error = job["error"].splitlines()[0] if job["error"] else ""
            print(f"{job_id} ({job['task_name']}): {job['state']}" + (f": {error}" if error else ""))
            return OUTCOME_EXIT[job["state"]]
        if deadline is not None and time.monotonic() >= deadline:
            print(f"yoloq: {job_id} ({job['task_name']}) is still {job['state']} after {args.timeout:g} s",
                  file=sys.stderr)
            return WAIT_TIMED_OUT
        time.sleep(args.interval if deadline is None else max(0.0, min(args.interval, deadline - time.monotonic())))


def cmd_cancel(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    body = {"reason": args.reason} if args.reason else {}
    job = api.request("POST", f"jobs/{job_id}/cancel/", ok=(202,), json=body).json()
    if job["state"] == "cancelled":
        print(f"Cancelled {job_id} ({job['task_name']}).")
    else:
        print(f"Cancel requested for {job_id} ({job['task_name']}); its worker is stopping it.")
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    job = api.request("POST", f"jobs/{job_id}/requeue/", ok=(202,)).json()
    print(f"Requeued {job_id} ({job['task_name']}): it resumes from its checkpoint as attempt {job['attempt']}.")
    return 0


def cmd_continue(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    body = {"timeout": args.timeout} if args.timeout is not None else {}
    if args.memory is not None:  # more for a job that ran out of memory
        body["memory"] = args.memory
    if args.gpus is not None:  # fewer for a job over a per-job GPU limit lowered since its submit
        body["gpu"] = args.gpus
    if args.val is not None:  # false: a training whose dataset's val split has no labels
        body["val"] = args.val
    # One key per invocation: a retried request cannot continue the job twice.
    job = api.request("POST", f"jobs/{job_id}/continue/", json=body, ok=(200, 201),
                      headers={"Idempotency-Key": f"yoloq-{uuid.uuid4()}"}).json()
    lineage = (job.get("spec") or {}).get("continued_from") or {}
    print(f"Continuing {job_id} ({job['task_name']}) from epoch {lineage.get('epoch')} as job {job['id']}: "
          f"{job['state']}")
    print(f"  follow it: yoloq status {job['id'][:8]}   ·   yoloq logs -f {job['id'][:8]}")
    return 0


def cmd_class(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    before = api.get(f"jobs/{job_id}/")["priority_class"]
    job = api.request("POST", f"jobs/{job_id}/class/", json={"priority": args.priority}).json()
    if job["priority_class"] == before:
        print(f"{job_id} ({job['task_name']}) is already {before}; nothing changed.")
    else:
        print(f"{job_id} ({job['task_name']}): class {before} → {job['priority_class']}.")
    return 0


# --- uploads: datasets and weights ------------------------------------------------------------

# Never part of a dataset upload: hidden files, OS clutter and Ultralytics' label caches (the
# server refuses .cache files: Ultralytics unpickles them).
SKIPPED = re.compile(r"(^|/)(\.|__MACOSX/)|\.cache$")
STORED_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".zip"}


class UploadBody:
    """A multipart/form-data body streamed from disk with a known length (``requests`` sends an
    iterable with ``__len__`` with a Content-Length, block by block), printing progress as it goes."""

    def __init__(self, fields: dict[str, str], file_field: str, path: Path, filename: str, progress: bool) -> None:
        self.boundary = f"yoloq-{uuid.uuid4().hex}"
        head = "".join(f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"
                       for k, v in fields.items() if v)
        head += (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{file_field}\"; "
                 f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n")
        self.head, self.tail = head.encode(), f"\r\n--{self.boundary}--\r\n".encode()
        self.path, self.size = path, path.stat().st_size
        self.total = len(self.head) + self.size + len(self.tail)
        self.sent, self.progress, self.last = 0, progress, -1

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        yield self.head
        with open(self.path, "rb") as f:
            while block := f.read(1 << 20):
                self.sent += len(block)
                self.report()
                yield block
        yield self.tail

    def report(self) -> None:
        percent = int(self.sent * 100 / max(self.size, 1))
        if self.progress and percent != self.last:
            self.last = percent
            print(f"\r  uploading {self.size / 1024**2:.1f} MiB: {percent:3d}%", end="", file=sys.stderr, flush=True)


def folder_files(folder: Path) -> list[tuple[Path, str, bool]]:
    """Each file under ``folder``: (path, its path relative to ``folder``, reached through a symbolic
    link), in path order, with each hidden/cache entry (``SKIPPED``) as itself; see :func:`folder_walk`."""
    return folder_walk(folder)[0]


def folder_walk(folder: Path) -> tuple[list[tuple[Path, str, bool]], list[str]]:
    """What :func:`zip_folder` zips: each file under ``folder`` (path, its path relative to ``folder``,
    reached through a symbolic link), in path order, and the folders entered (relative paths).

    Links are followed, to files and to folders, wherever they point, as ``zip -r`` follows them: a
    dataset whose images folder is a link to where the images are is that dataset (trial27 F2: a
    linked file was left out as a "hidden/cache file", a linked folder without a word, and the server
    then said "folder 'images/val' is not in the archive"). A link to nothing, or to a folder that
    holds the link (a loop), is a CliError naming it: nothing is left out silently.

    A hidden/cache entry (``SKIPPED``: ``.git``, ``.ipynb_checkpoints``, ``.DS_Store``, ``__MACOSX``,
    Emacs' lock link ``.#data.yaml``) is listed as itself, one entry, and never entered or followed:
    it is left out anyway, and walking a ``.git`` of 100,000 objects, or a hidden link to a big tree,
    only cost time before zipping (review32). A link to nothing or a loop among them is no refusal."""
    found: list[tuple[Path, str, bool]] = []
    folders: list[str] = []

    def visit(directory: Path, prefix: str, chain: frozenset[str], linked: bool) -> None:
        for entry in os.scandir(directory):
            path, relative = Path(entry.path), prefix + entry.name
            through = linked or entry.is_symlink()
            if SKIPPED.search(relative) or SKIPPED.search(relative + "/"):
                found.append((path, relative, through))
                continue
            if entry.is_symlink() and not path.exists():
                raise CliError(f"{path}: is a symbolic link to {os.readlink(path)}, which does not exist; "
                               "nothing was uploaded")
            if entry.is_dir():
                real = os.path.realpath(path)
                if real in chain:
                    raise CliError(f"{path}: is a symbolic link to a folder that holds it ({real}), a loop; "
                                   "nothing was uploaded")
                folders.append(relative)
                visit(path, relative + "/", chain | {real}, through)
            elif entry.is_file():
                found.append((path, relative, through))

    visit(folder, "", frozenset({os.path.realpath(folder)}), False)
    return sorted(found, key=lambda item: item[1].split("/")), folders


def zip_folder(folder: Path, into: Path) -> tuple[int, int, int]:
    """Zip ``folder`` (its name as the top folder) into ``into``: (files written, hidden/cache files
    and folders left out, files written that were reached through a symbolic link)."""
    written = skipped = linked = 0
    holding: set[str] = set()  # folders with a file written under them
    entries, folders = folder_walk(folder)
    with zipfile.ZipFile(into, "w") as archive:
        for path, relative, through in entries:
            if SKIPPED.search(relative) or SKIPPED.search(relative + "/"):
                skipped += 1
                continue
            compress = zipfile.ZIP_STORED if path.suffix.lower() in STORED_SUFFIXES else zipfile.ZIP_DEFLATED
            archive.write(path, f"{folder.name}/{relative}", compress_type=compress)
            written += 1
            linked += through
            parts = relative.split("/")[:-1]
            holding.update("/".join(parts[:end]) for end in range(1, len(parts) + 1))
        # An empty folder goes in as a folder entry, as `zip -r` writes it: left out, an emptied split
        # (images/val) was answered "folder 'images/val' is not in the archive" while the user saw it on
        # disk; with it, "holds no images" (trial 31). The folders folder_walk entered: it walked the tree
        # once (an os.walk here walked it again, hidden folders and links included: review32).
        for relative in folders:
            if relative not in holding:
                archive.writestr(f"{folder.name}/{relative}/", b"")
    return written, skipped, linked


def upload(api: Api, endpoint: str, path: Path, filename: str, fields: dict[str, str], quiet: bool,
           shown: str | None = None) -> dict:
    """POST ``path`` as ``filename``; a refusal names ``shown`` (what the user gave: the folder a
    temporary zip was made of), else ``filename``."""
    body = UploadBody(fields, "file", path, filename, progress=not quiet and sys.stderr.isatty())
    response = api.request("POST", endpoint, data=body, headers={"Content-Type": body.content_type},
                           ok=(200, 201, 400, 413), timeout=(TIMEOUT_S, 3600))
    if body.progress:
        print(file=sys.stderr)
    answer = response.json()
    if response.status_code not in (200, 201):  # 200: already stored (a dataset's unchanged files)
        lines = [f"{p['path']}: {p['problem']}" for p in answer.get("problems") or []]
        for key, value in answer.items():
            if key not in ("problems", "problem_count", "offending_global"):
                lines.insert(0, f"{key}: {' '.join(value) if isinstance(value, list) else value}")
        raise CliError(f"{shown or filename} was refused:\n  " + "\n  ".join(lines))
    return answer


def upload_team_check(api: Api, team: str | None) -> None:
    """Refuse an upload the server would refuse for its team before zipping or sending anything:
    it answers "not a member" (or, without --team, "you are in several teams") only once the whole
    file has arrived, after the folder was zipped (trial23). One small request: the caller's teams."""
    slugs = [row["team"] for row in api.get_all("teams/")]
    yours = ", ".join(slugs) or "none"
    if team and team not in slugs:
        raise CliError(f"team: you are not a member of a team named {team!r} (your teams: {yours}); nothing was "
                       "uploaded")
    if not team and len(slugs) != 1:
        raise CliError(f"team: give --team: you are in {'no team' if not slugs else 'several teams'} "
                       f"(your teams: {yours}); nothing was uploaded")


# The server's rule for a dataset name (apps/datasets/services.py NAME).
DATASET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
WEIGHTS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.pt")  # the server's (registry checkpoint_scan.member_name_ok)


def cmd_dataset_push(args: argparse.Namespace) -> int:
    api = api_from_config()
    source = Path(args.path)
    name = args.name or re.sub(r"[^a-z0-9_-]+", "-", source.name.removesuffix(".zip").lower()).strip("-")
    fields = {"name": name, "team": args.team or "", "kind": args.kind, "description": args.description or ""}
    if not source.exists():
        raise CliError(f"{source}: no such file or folder")
    # What the server would refuse only once the whole upload had arrived, said before zipping or
    # sending anything (trial25: a bad --name, a .yaml, an empty folder each went up first).
    if not DATASET_NAME.fullmatch(name):
        raise CliError(f"name: {name!r} is no dataset name: use lowercase letters, digits, '-' and '_' "
                       "(at most 100, starting with a letter or digit; --name NAME); nothing was uploaded")
    if source.is_file() and not zipfile.is_zipfile(source):
        raise CliError(f"{source}: is not a zip archive: push the dataset's folder, or a .zip of it; "
                       "nothing was uploaded")
    if source.is_dir() and not folder_files(source):
        raise CliError(f"{source}: the folder holds no files; nothing was uploaded")
    upload_team_check(api, args.team)
    if source.is_dir():
        with tempfile.TemporaryDirectory(prefix="yoloq-") as temp:
            archive = Path(temp) / f"{name}.zip"
            written, skipped, linked = zip_folder(source, archive)
            if not args.quiet:
                notes = [f"{linked} through symbolic links"] if linked else []
                notes += [f"{skipped} hidden/cache files or folders left out"] if skipped else []
                print(f"zipped {written} files of {source}" + (f" ({'; '.join(notes)})" if notes else ""),
                      file=sys.stderr)
            # A refusal names the folder pushed, not the temporary NAME.zip (trial26: "boxes.zip was refused"
            # for `yoloq dataset push ./shots --name boxes`).
            answer = upload(api, "datasets/", archive, archive.name, fields, args.quiet, shown=str(source))
    elif source.is_file():
        answer = upload(api, "datasets/", source, source.name, fields, args.quiet)
    else:
        raise CliError(f"{source}: no such file or folder")
    if args.quiet:
        print(answer["reference"])
        return 0
    if answer.get("skipped"):  # documentation beside data.yaml, OS clutter: not stored
        print(f"Skipped (not stored): {', '.join(answer['skipped'])}", file=sys.stderr)
    for warning in answer.get("warnings") or []:  # a split without labels: stored, but trainings on it are refused
        print(f"Warning: {warning}", file=sys.stderr)
    if answer.get("unchanged"):
        print(f"Unchanged: {answer['team']}/{answer['reference']} already holds exactly these files "
              f"(sha256 {answer['sha256'][:16]}…); no new version made")
        return 0
    if answer.get("kind") == "images":
        # Images without labels serve predict jobs only: "train on it" was refused when followed (trial 16, G4).
        print(f"Stored {answer['team']}/{answer['reference']}: {answer['num_images']} images without labels; "
              f"sha256 {answer['sha256'][:16]}…")
        print(f"  predict on it: yolo predict model=<model> source={answer['name']} …   "
              f"(this version: source={answer['reference']})")
        print("  to train on these images, label them first and push a YOLO dataset (data.yaml, images/, labels/)")
        return 0
    stats = (answer.get("stats") or {}).get("splits") or {}
    splits = ", ".join(f"{k} {v['images']}" for k, v in stats.items())
    print(f"Stored {answer['team']}/{answer['reference']}: {answer['num_images']} images ({splits}), "
          f"{answer['num_classes']} classes; sha256 {answer['sha256'][:16]}…")
    if answer.get("kind") == "classify":
        # A classification dataset trains -cls models only: say which, so the first submit is not a 400.
        print(f"  a classification dataset: yolo classify train data={answer['name']} model=yolov8n-cls.yaml …   "
              f"(this version: data={answer['reference']})")
        return 0
    print(f"  train on it: yolo train data={answer['name']} …   (this version: data={answer['reference']})")
    return 0


def cmd_weights_push(args: argparse.Namespace) -> int:
    api = api_from_config()
    source = Path(args.file)
    if source.is_dir():  # "no such file" of a folder that is there (trial27)
        raise CliError(f"{source}: is a folder; weights push sends one .pt file (a dataset's folder: "
                       f"yoloq dataset push {source}); nothing was uploaded")
    if not source.is_file():
        raise CliError(f"{source}: no such file")
    upload_team_check(api, args.team)
    # What the server would refuse only once the whole file had arrived (trial26), said before sending it.
    field, filename = ("name", args.name) if args.name else ("file", source.name)
    if not WEIGHTS_NAME.fullmatch(filename):
        raise CliError(f"{field}: the file name must be a plain name ending in .pt, like yolov8s.pt (letters, digits, "
                       f"'.', '_', '-', at most 100 before .pt; no folders), got {filename!r}"
                       f"{'' if args.name else ' (--name NAME.pt)'}; nothing was uploaded")
    with source.open("rb") as handle:
        head = handle.read(4)
    if head != b"PK\x03\x04":  # the server's messages (registry checkpoint_scan)
        why = ("is empty" if not head else "is a bare pickle (the pre-1.6 torch.save format), not a zip checkpoint: "
               "load and save it again with a current torch" if head[:1] == b"\x80"
               else "is not a PyTorch checkpoint (torch.save writes a zip archive)")
        raise CliError(f"file: {source} {why}; nothing was uploaded")
    # --name travels as its own field: a multipart file name loses its folders on the way, so
    # "../../x.pt" was stored as x.pt while this printed model=../../x.pt (trial 16, G10).
    answer = upload(api, "weights/", source, source.name, {"team": args.team or "", "name": args.name or ""},
                    args.quiet)
    if args.quiet:
        print(answer["reference"])
        return 0
    if answer.get("unchanged"):
        print(f"Unchanged: {answer['team']}/{answer['reference']} already holds these weights "
              f"(sha256 {answer['sha256'][:16]}…); no new version made")
        return 0
    filename = answer["filename"]  # what the server stored, which specs name
    print(f"Stored {filename} for {answer['team']} as {answer['reference']} ({answer['task'] or 'task unknown'}, "
          f"sha256 {answer['sha256'][:16]}…)")
    print(f"  use it: yolo train model={filename} …   (this version: model={answer['reference']})")
    return 0


def download(api: Api, path: str, output: str | None, fallback: str, sha_header: str) -> tuple[Path, Any, str]:
    """Save a download as ``<target>.part``, then move it into place once its sha256 matches the one
    the server sent in ``sha_header`` (checked against the stored file as it was served).

    A download that broke off leaves its ``.part``; the same command again resumes it (``Range:
    bytes=<its size>-``) where the server says ``Accept-Ranges: bytes`` and sends the hash to check
    the joined file against (without one, a part of an older file could not be told apart: it
    starts over). A joined file whose hash is not the server's is deleted: pull again.

    Returns where it went, the response's headers and the line to print about its hash.
    """
    folder = Path(output) if output and Path(output).is_dir() else Path(output or ".").parent
    if not folder.is_dir():  # was a FileNotFoundError traceback, once the file had come (trial26)
        raise CliError(f"-o: {folder} is no folder; nothing was downloaded")
    response = api.request("GET", path, stream=True, timeout=(TIMEOUT_S, 300))
    named = re.search(r'filename="?([^";]+)"?', response.headers.get("Content-Disposition", ""))
    name = Path(named.group(1)).name if named else fallback  # a name, never a path elsewhere
    target = Path(output or name)
    if target.is_dir():  # -o into a folder: the name the server gives
        target = target / name
    part = target.with_name(target.name + ".part")
    expected = response.headers.get(sha_header, "")
    size = int(response.headers.get("Content-Length") or -1)
    have = part.stat().st_size if part.is_file() else 0
    resumed = 0
    if have and expected and response.headers.get("Accept-Ranges") == "bytes" and 0 < have <= size:
        response.close()  # (stream=True: nothing of its body was read)
        if have == size:  # the break came after the last byte: the part is only to be checked
            resumed = have
        else:
            headers = {"Range": f"bytes={have}-"}
            if etag := response.headers.get("ETag"):
                headers["If-Range"] = etag  # a file replaced since the first answer comes whole
            response = api.request("GET", path, ok=(200, 206), stream=True, timeout=(TIMEOUT_S, 300),
                                   headers=headers)
            if response.status_code == 206 and response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                resumed = have
    digest = hashlib.sha256()
    try:
        handle = part.open("r+b" if resumed else "wb")
    except OSError as exc:  # a folder that cannot be written
        raise CliError(f"-o: cannot write in {target.resolve().parent} ({exc.strerror}); nothing was saved") from None
    with handle:
        if resumed:
            while block := handle.read(1 << 20):
                digest.update(block)
            handle.seek(resumed)
        try:
            # 64 KiB blocks: what came before a break is on disk, less the block it broke in (urllib3
            # drops the bytes of a read that ends early).
            for block in ([] if resumed == size else response.iter_content(1 << 16)):
                handle.write(block)
                digest.update(block)
        except requests.RequestException as exc:
            handle.close()
            raise CliError(f"the download broke off after {part.stat().st_size} of {size} bytes ({exc}); they are "
                           f"kept in {part}: run the same command again to resume") from None
    # The server sends the hash it checked the file against: the copy on disk is verified against
    # it, and the hash printed for the script's records (nothing verified it: CI trial 17, H4).
    if expected and digest.hexdigest() != expected:
        part.unlink()
        raise CliError(f"the download's sha256 {digest.hexdigest()} is not the server's {expected}: nothing saved; "
                       "pull again")
    os.replace(part, target)
    return target, response.headers, (f"  sha256 {digest.hexdigest()}"
                                      + (" (verified)" if expected else " (the server recorded none to check)")
                                      + (f"; resumed after the {resumed} bytes of {part.name}" if resumed else ""))


def cmd_weights_pull(args: argparse.Namespace) -> int:
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    job = api.get(f"jobs/{job_id}/")
    if (job.get("spec") or {}).get("mode") == "export":
        # The API's "trains nothing" said where the files are in API terms only (CI trial 17, H13).
        raise CliError(f"{job_id} ({job['task_name']}) is an export job: it trains nothing, so it has no weights; "
                       f"its exported files: yoloq export pull {job_id[:8]}")
    target, headers, hashed = download(api, f"jobs/{job_id}/weights/", args.output, f"{job_id}.pt",
                                       "X-Weights-SHA256")
    note = headers.get("X-Weights-Note", "")
    print(f"Saved {target}" + (f": {note}" if note else ""))
    print(hashed)
    return 0


# --- the model registry: versions, stages, downloads, exports -----------------------------------

STAGE_WORDS = {"none": "in no stage"}  # "is in none" read as nonsense (manager trial 15, F9)


def stage_text(stage: str) -> str:
    return STAGE_WORDS.get(stage, f"in {stage}")


def model_resolve(api: Api, ref: str, team: str | None) -> dict:
    """A version as ``GET models/{id}/`` gives it, from its id (as `yoloq model list` prints) or a
    reference as a spec names it: ``name:vN``, ``name:latest`` (its newest version), ``name:staging`` or
    ``name:production`` (the newest version in that stage), as ``model=`` reads them (trial27 F4:
    `yoloq model pull pcb:production` was refused). ``--team`` when two of the caller's teams have one
    of that name."""
    if ref.isdigit():
        return api.get(f"models/{ref}/")
    named = re.fullmatch(r"(.+):(?:v(\d+)|(latest|staging|production))", ref)
    if not named:
        raise CliError(f"model {ref!r}: give a version's id, as `yoloq model list` prints it, or name:vN, "
                       "name:latest, name:staging or name:production")
    name, number, alias = named.groups()
    stage = alias if alias in ("staging", "production") else None
    versions = api.get_all("models/", name=name, team=team, stage=stage)
    if number:
        matches = [v for v in versions if v["version"] == int(number)]
    else:  # each team's newest (of that stage)
        newest: dict[str, dict] = {}
        for v in versions:
            if v["version"] > newest.get(v["team"], {"version": 0})["version"]:
                newest[v["team"]] = v
        matches = list(newest.values())
    if not matches:
        where = f"team {team}" if team else "your teams"
        raise CliError((f"no version of {name} is in {stage} in {where}" if stage else f"no model {ref} in {where}")
                       + f" (yoloq model list --name {name} lists its versions)")
    if len(matches) > 1:
        raise CliError(f"{ref} is a model of teams {', '.join(sorted(v['team'] for v in matches))}: give --team")
    return api.get(f"models/{matches[0]['id']}/")


# A segment model's own figures are its masks' (M), a pose model's its keypoints' (P); their box
# figures (B) come too. The first key found used to be the box one (trial21).
OWN_SUFFIXES = {"M": " (mask)", "P": " (keypoints)", "B": ""}


def own_metric(metrics: dict | None, key: str) -> float | None:
    metrics = metrics or {}
    return next((metrics[f"metrics/{key}({s})"] for s in OWN_SUFFIXES
                 if isinstance(metrics.get(f"metrics/{key}({s})"), (int, float))), None)


def metric_of(metrics: dict | None) -> str:
    """`` (mask)`` / `` (keypoints)`` when :func:`own_metric` reads those, else ``""``."""
    return next((text for s, text in OWN_SUFFIXES.items() if f"metrics/mAP50-95({s})" in (metrics or {})), "")


def metric_text(metrics: dict | None, key: str = "mAP50-95") -> str:
    value = own_metric(metrics, key)
    if value is None and key == "mAP50-95" and isinstance((metrics or {}).get("metrics/accuracy_top1"), (int, float)):
        # A classifier has no mAP: its headline, in the same column, is its top-1 accuracy, named.
        return value_text(metrics["metrics/accuracy_top1"]) + " (top-1)"
    return value_text(value) + metric_of(metrics) if value is not None else "-"


def figures_text(metrics: dict) -> str:
    """A model's headline figures: top-1 and top-5 accuracy for a classifier, else mAP50-95 and mAP50."""
    if own_metric(metrics, "mAP50-95") is None and "metrics/accuracy_top1" in metrics:
        return (f"top-1 accuracy {value_text(metrics.get('metrics/accuracy_top1'))}, top-5 "
                f"{value_text(metrics.get('metrics/accuracy_top5'))}")
    return f"mAP50-95 {metric_text(metrics)}, mAP50 {metric_text(metrics, 'mAP50')}"


def cmd_model_list(args: argparse.Namespace) -> int:
    """The versions of the caller's teams, every page (``models/`` is a paged list)."""
    api = api_from_config()
    versions = api.get_all("models/", team=args.team, name=args.name, stage=args.stage)
    if args.json:
        print(json.dumps(versions, indent=2))
        return 0
    if not versions:
        print("No model versions." if not (args.team or args.name or args.stage) else "No model versions match.")
        return 0
    rows = [[str(v["id"]), v["reference"], v["team"], v["stage"], v["task"] or "-",
             (v["job"] or "")[:8] or v["source"], metric_text(v["metrics"]), when(v["created_at"])] for v in versions]
    print(table(rows, ["ID", "MODEL", "TEAM", "STAGE", "TASK", "FROM", "mAP50-95", "CREATED"]))
    return 0


def cmd_model_show(args: argparse.Namespace) -> int:
    api = api_from_config()
    version = model_resolve(api, args.version, args.team)
    if args.json:
        print(json.dumps(version, indent=2))
        return 0
    parent, dataset = version.get("parent") or {}, version.get("dataset") or {}
    lines = [
        ("model", f"{version['reference']}  (id {version['id']}, team {version['team']})"),
        ("stage", version["stage"]),
        ("task", version["task"] or "-"),
        ("from", f"job {version['job']} (yoloq status {version['job'][:8]})" if version["job"] else version["source"]),
        ("weights", f"{version['filename']}, {version['size']} bytes, sha256 {version['sha256']} "
                    f"(yoloq model pull {version['id']})"),
        ("created", when(version["created_at"])),
    ]
    if parent:
        lines.append(("parent", f"{parent.get('name')}:v{parent.get('version')} (team {parent.get('team')})"
                      if parent.get("kind") == "version" else f"{parent.get('name')} ({parent.get('kind')} weights)"))
    if dataset.get("name"):
        lines.append(("dataset", f"{dataset['name']}:v{dataset.get('version')}"))
    if version.get("metrics"):
        lines.append(("metrics", figures_text(version["metrics"])))
    for evaluation in version.get("evaluations") or []:
        data = evaluation.get("dataset") or {}
        on = f" on {data['name']}:v{data.get('version')}" if data.get("name") else ""
        lines.append(("evaluation", f"{figures_text(evaluation['metrics'] or {})}{on} {evaluation['split']} split"))
    for export in version.get("exports") or []:
        passed = (export.get("verification") or {}).get("passed")
        verified = {True: "verified", False: "verification failed", None: "not verified"}[passed]
        pull = f"yoloq export pull {export['job'][:8]}" if export.get("job") else f"exports/{export['id']}/download/"
        lines.append(("export", f"{export['format']}, {export['size']} bytes, {verified} ({pull})"))
    width = max(len(k) for k, _ in lines)
    print("\n".join(f"{k.rjust(width)}: {v}" for k, v in lines))
    return 0


def cmd_model_stage(args: argparse.Namespace) -> int:
    api = api_from_config()
    version = model_resolve(api, args.version, args.team)
    moved = api.request("POST", f"models/{version['id']}/stage/", json={"stage": args.stage}).json()
    what = f"{version['reference']} ({version['team']})"
    if moved["stage"] == version["stage"]:
        print(f"{what} is already {stage_text(moved['stage'])}; nothing changed.")
        return 0
    print(f"{what}: {version['stage']} → {moved['stage']}.")
    for other in moved.get("also_changed") or []:  # the previous production version, archived
        print(f"  and {other['reference']}: production → {other['stage']}")
    return 0


def cmd_model_pull(args: argparse.Namespace) -> int:
    api = api_from_config()
    version = model_resolve(api, args.version, args.team)
    target, _, hashed = download(api, f"models/{version['id']}/download/", args.output,
                                 f"{version['name']}-v{version['version']}.pt", "X-Weights-SHA256")
    print(f"Saved {target}: {version['reference']} of team {version['team']} ({stage_text(version['stage'])})")
    print(hashed)
    return 0


def cmd_export_pull(args: argparse.Namespace) -> int:
    """An export job's exported file (or a training's ``export: [...]`` ones), from its outcome."""
    api = api_from_config()
    job_id = job_resolve(api, args.id)
    job = api.get(f"jobs/{job_id}/")
    spec = job.get("spec") or {}
    mode = spec.get("mode") or "train"
    exports = (job.get("outcome") or {}).get("exports") or []
    what = f"{job_id} ({job['task_name']})"
    if not exports:
        if mode != "export" and not spec.get("export"):
            weights = f"; its weights: yoloq weights pull {job_id[:8]}" if mode == "train" else ""
            raise CliError(f"{what} is a {mode} job that exports nothing{weights}")
        if job["state"] != "succeeded":
            raise CliError(f"{what} is {job['state']}: its exported files are here once it succeeds"
                           if job["state"] not in TERMINAL else f"{what} {job['state']}: it stored no exported file")
        raise CliError(f"{what} stored no exported file")
    if args.format:
        exports = [e for e in exports if e["format"] == args.format]
        if not exports:
            formats = ", ".join(e["format"] for e in (job.get("outcome") or {}).get("exports") or [])
            raise CliError(f"{what} exported no {args.format} file (it exported {formats})")
    if len(exports) > 1 and args.output and not Path(args.output).is_dir():
        raise CliError(f"{what} exported {len(exports)} files ({', '.join(e['format'] for e in exports)}): "
                       "give --format to save one as -o FILE, or -o a folder")
    for export in exports:
        target, _, hashed = download(api, f"exports/{export['id']}/download/", args.output,
                                     f"{job_id}.{export['format']}", "X-Export-SHA256")
        verified = {True: "verified against PyTorch", False: "its verification failed",
                    None: "not verified"}[export.get("passed")]
        print(f"Saved {target}: the {export['format']} export of {job['task_name']} ({verified})")
        print(hashed)
    return 0


# --- entry point -----------------------------------------------------------------------------


def seconds(low: float, high: float | None = None) -> Callable[[str], float]:
    """An option's type: a finite number of seconds from ``low`` (up to ``high``).

    float() takes "nan", "inf" and "1e400" (inf): ``wait --timeout nan`` waited forever, ``--timeout -1``
    said "still queued after -1 s" and a bad ``--interval`` ended in time.sleep's traceback (trial28)."""
    wanted = f" from {low:g} to {high:g}" if high is not None else f", {low:g} or more"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be a number of seconds{wanted}; got {text!r}")
        return value

    return parse


# How often `logs -f` and `wait` ask (hidden options, for tests): not so often that it hammers the
# server, not so seldom that time.sleep refuses it.
INTERVAL = seconds(0.1, 3600)


# Every job-id argument says so: `yoloq requeue -h` said nothing of its id (manager trial 15, F10).
JOB_ID_HELP = "the job's id, or any unique prefix of it as `yoloq queue` prints"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="yoloq", description="Submit and follow YOLO training jobs on yoloportal.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("login", help="save the server URL and your API token")
    p.add_argument("url", help="the portal, e.g. http://gpu-portal:8000")
    p.add_argument("--token", help="API token (asked for when not given)")
    p.set_defaults(func=cmd_login)

    p = commands.add_parser("submit", help="submit a job spec (YAML), like sbatch")
    p.add_argument("file", help="job spec file, or - for standard input")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the job id")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="submitting the same spec under the same key again gives the same job (a retried CI "
                        "step); the same key with another spec is refused; default: a new key each time")
    p.set_defaults(func=cmd_submit)

    p = commands.add_parser("queue", help="running and queued jobs of your teams, like squeue")
    p.add_argument("--mine", action="store_true", help="only my jobs")
    p.add_argument("--team", help="only this team's jobs")
    p.add_argument("--user", help="only this user's jobs (a member of your teams, or someone with jobs in them who has left)")
    p.add_argument("--state", choices=["active", "queued", "starting", "running", "finished", *sorted(TERMINAL)],
                   help="only jobs in this state; active: running, starting and queued (the default); "
                        "finished: every ended state; an ended state lists the newest 500, like sacct")
    p.set_defaults(func=cmd_queue)

    p = commands.add_parser("status", help="one job in detail")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("--json", action="store_true", help="the API's job object")
    p.set_defaults(func=cmd_status)

    p = commands.add_parser("logs", help="a job's log")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing until the job ends; then exit as `yoloq wait` does (0 only if it succeeded)")
    p.add_argument("--interval", type=INTERVAL, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_logs)

    p = commands.add_parser("wait", help="wait until a job ends; exit 0 if it succeeded, 3 failed, "
                                         "4 timed out, 5 cancelled (124: --timeout ran out)")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("--timeout", type=seconds(0), help="give up after this many seconds (0 or more)")
    p.add_argument("--interval", type=INTERVAL, default=5.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_wait)

    p = commands.add_parser("cancel", help="cancel a job, like scancel")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("--reason", help="why (kept in the job's timeline; a teammate's job: told to its owner)")
    p.set_defaults(func=cmd_cancel)

    p = commands.add_parser("requeue", help="team managers: put a running job back in the queue "
                                            "(it resumes from its checkpoint)")
    p.add_argument("id", help=JOB_ID_HELP)
    p.set_defaults(func=cmd_requeue)

    p = commands.add_parser("continue", help="continue an ended (failed, cancelled, timed-out) training job from "
                                             "its newest stored checkpoint, as a new job")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("--timeout", type=int, metavar="S", help="the new job's timeout in seconds (default: the job's own)")
    p.add_argument("--memory", metavar="QTY", help="the new job's resources.memory, e.g. 16Gi (default: the job's "
                                                  "own; more for a job that ran out of memory)")
    p.add_argument("--gpus", metavar="N", help="the new job's resources.gpu: a whole number of GPUs, or 0.5, 0.25 "
                                               "or 0.125 of one (default: the job's own; fewer for a job over a "
                                               "per-job GPU limit lowered since it was submitted)")
    p.add_argument("--no-val", dest="val", action="store_false", default=None,
                   help="no validation during the new job's training (val=false): for a dataset whose val split "
                        "has no labels (default: the job's own val)")
    p.add_argument("--val", dest="val", action="store_true", help="validate after each epoch again (val=true)")
    p.set_defaults(func=cmd_continue)

    p = commands.add_parser("class", help="team managers: change a queued job's priority class, or a sweep's "
                                                "(its queued trials' and later ones')")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("priority", help="low, medium, high or urgent")
    p.set_defaults(func=cmd_class)

    dataset = commands.add_parser("dataset", help="datasets: push").add_subparsers(dest="verb", required=True)
    p = dataset.add_parser("push", help="upload a dataset folder or .zip (a new version of its name, unless unchanged)")
    p.add_argument("path", help="a folder with data.yaml, images/ and labels/ (or a classification folder: "
                                "train/<class>/…, val/<class>/…), or a .zip of one")
    p.add_argument("--team", help="the team it belongs to (optional when you are in one team); checked before "
                                  "the folder is zipped")
    p.add_argument("--name", help="how specs name it (default: the folder's name)")
    p.add_argument("--kind", choices=["yolo", "classify", "images"], default="yolo",
                   help="images: a set of images without labels, to predict on; classify: only a classification "
                        "folder (the default kind takes one too)")
    p.add_argument("--description", help="a short description")
    p.add_argument("-q", "--quiet", action="store_true", help="print only name:vN")
    p.set_defaults(func=cmd_dataset_push)

    weights = commands.add_parser("weights", help="weights: push, pull").add_subparsers(dest="verb", required=True)
    p = weights.add_parser("push", help="upload pretrained weights (.pt) to a team")
    p.add_argument("file", help="a .pt written by Ultralytics (training or model.save())")
    p.add_argument("--team", help="the team it belongs to (optional when you are in one team)")
    p.add_argument("--name", help="the file name specs use (default: the file's own name)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only name:vN")
    p.set_defaults(func=cmd_weights_push)
    p = weights.add_parser("pull", help="download a job's weights (an ended job's newest stored checkpoint)")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("-o", "--output", help="where to write them (default: the name the server gives)")
    p.set_defaults(func=cmd_weights_pull)

    # The registry was API-only from the CLI, though docs/lifecycle.md said it all works from yoloq (CI trial 17, H13).
    version_help = ("a version's id, as `yoloq model list` prints it, or name:vN, name:latest, name:staging or "
                    "name:production as specs name it")
    team_help = "the team whose name:vN it is (when two of your teams have a model of that name)"
    model = commands.add_parser("model", help="the model registry: list, show, stage, pull").add_subparsers(
        dest="verb", required=True)
    p = model.add_parser("list", help="the model versions of your teams")
    p.add_argument("--team", help="only this team's")
    p.add_argument("--name", help="only this model's versions")
    p.add_argument("--stage", help="only versions in this stage: none, staging, production or archived")
    p.add_argument("--json", action="store_true", help="the API's version objects")
    p.set_defaults(func=cmd_model_list)
    p = model.add_parser("show", help="one version: lineage, metrics, evaluations, exports")
    p.add_argument("version", help=version_help)
    p.add_argument("--team", help=team_help)
    p.add_argument("--json", action="store_true", help="the API's version object")
    p.set_defaults(func=cmd_model_show)
    p = model.add_parser("stage", help="team managers: move a version to another stage (promoting one to production "
                                       "archives the previous production version)")
    p.add_argument("version", help=version_help)
    p.add_argument("stage", help="none, staging, production or archived")
    p.add_argument("--team", help=team_help)
    p.set_defaults(func=cmd_model_stage)
    p = model.add_parser("pull", help="download a version's weights (checked against their recorded sha256)")
    p.add_argument("version", help=version_help)
    p.add_argument("--team", help=team_help)
    p.add_argument("-o", "--output", help="where to write them, a file or a folder (default: NAME-vN.pt)")
    p.set_defaults(func=cmd_model_pull)

    export = commands.add_parser("export", help="exported models: pull").add_subparsers(dest="verb", required=True)
    p = export.add_parser("pull", help="download what an export job (or a training's export: [...]) exported")
    p.add_argument("id", help=JOB_ID_HELP)
    p.add_argument("--format", help="only this format's file (onnx, torchscript, engine, …)")
    p.add_argument("-o", "--output", help="where to write it, a file or a folder (default: the name the server gives)")
    p.set_defaults(func=cmd_export_pull)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except CliError as exc:
        print(f"yoloq: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`yoloq queue | head -3`): stop quietly, as squeue does. Whatever is
        # still buffered goes nowhere, so the interpreter's last flush raises nothing either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program a closed pipe stopped


if __name__ == "__main__":
    sys.exit(main())

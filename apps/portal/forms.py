"""Browser forms. They only collect text: the job spec is validated by ``apps.jobs.spec``
and ``apps.jobs.services`` exactly as for the API, and their errors (keyed by field path,
e.g. ``train.epochs``) are put back next to the form field that caused them."""

from __future__ import annotations

import math
import re
import string
from typing import Any

from django import forms
from django.conf import settings

from apps.core.errors import FieldErrors
from apps.core.strict_yaml import YamlError, load_yaml, text_decode
from apps.core.values import ascii_float
from apps.jobs.spec import PRIORITIES, TRAIN_ARGS
from apps.jobs.spec_sweep import DEFAULT_METRIC, PRUNERS

GPU_CHOICES = [("0.25", "¼ of a GPU"), ("0.5", "½ of a GPU"), ("1", "1"), ("2", "2"), ("4", "4"), ("8", "8")]

# Spec field path → form field. Structured (`train.*`) and command (`command.*`) paths both map.
FIELD_FOR_PATH = {
    "task_name": "task_name",
    "team": "team",
    "user": "team",
    "data": "dataset",
    "model": "model",
    "epochs": "epochs",
    "imgsz": "imgsz",
    "batch": "batch",
    "resources": "gpus",
    "resources.gpu": "gpus",
    "priority": "priority",
    "timeout": "timeout_hours",
}


def form_field_for(path: str) -> str | None:
    """The form field a spec error path belongs to, or None (shown above the form)."""
    if path in FIELD_FOR_PATH:
        return FIELD_FOR_PATH[path]
    head, _, tail = path.partition(".")
    if head in ("train", "command") and tail in FIELD_FOR_PATH:
        return FIELD_FOR_PATH[tail]
    return None


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)  # float() reads any script's digits


def typed(text: str) -> int | float | str:
    """A number typed into a text box as the number (``"30"`` → 30, ``"1e-4"`` → 0.0001), else the text.

    The form builds the spec a YAML or JSON author would write; kept as text, the stored spec
    showed ``"epochs": "30"`` on the job page and in Edit & resubmit (a new-user trial). Text
    that is not a number ("ten", "nan") stays text, so the parser names it at its field; so does text
    with anything but ASCII in it: the API refuses ``"3\u3000"`` (apps.core.values.ascii_int), and
    ``strip()`` took that ideographic space off here and submitted 3. (The number boxes are
    :func:`number_field`s: Django's own strip() takes Unicode spaces off too.)
    """
    text = text.strip(string.whitespace)  # ASCII spaces only: " Адам" in "SGD, Адам" was sent as typed
    if not text.isascii():
        return text
    if not _NUMBER.fullmatch(text):
        return text
    number = float(text)
    if not math.isfinite(number):
        return text
    return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else number


def text_input(placeholder: str = "", **attrs: Any) -> forms.TextInput:
    return forms.TextInput(attrs={"placeholder": placeholder, **attrs})


def number_field(**kwargs: Any) -> forms.CharField:
    """A text box for a number, kept as typed (``strip=False``): Django's strip() takes any Unicode
    space off, and ``"3\u3000"`` became 3, which the API refuses (see :func:`typed`)."""
    return forms.CharField(required=False, strip=False, **kwargs)


class JobForm(forms.Form):
    """The common fields. Every field is optional here: the spec parser says what is missing."""

    # The spec's own limit (apps.jobs.spec: 200), so a browser stops there (300 let 201..300 through to
    # a second refusal saying 200: trial25 F4).
    task_name = forms.CharField(required=False, max_length=200, widget=text_input("e.g. pcb-defects-v8s"))
    team = forms.ChoiceField(required=False, choices=())
    dataset = forms.CharField(required=False, widget=text_input("a dataset of your team", list="datasets"))
    model = forms.CharField(required=False, initial="yolov8n.yaml",
                            widget=text_input("yolov8n.yaml, name.pt or name:v1", list="models"))
    epochs = number_field(initial="10", widget=text_input(inputmode="numeric"))
    imgsz = number_field(initial="640", label="Image size", widget=text_input(inputmode="numeric"))
    batch = number_field(initial="16", widget=text_input("16, -1 = auto", inputmode="decimal"))
    gpus = forms.ChoiceField(required=False, choices=GPU_CHOICES, initial="1", label="GPUs")
    priority = forms.ChoiceField(required=False, choices=[(p, p) for p in PRIORITIES], initial="medium")
    timeout_hours = number_field(initial="24", label="Timeout (hours)", widget=text_input(inputmode="decimal"))
    allow_duplicate = forms.BooleanField(required=False, label="Run even if an identical job is active")

    def __init__(self, *args: Any, teams: list[str], urgent_teams: list[str] | None = None, **kwargs: Any) -> None:
        """``urgent_teams``: the teams whose urgent class the user may use (None: all of ``teams``)."""
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(slug, slug) for slug in teams]
        if urgent_teams is not None and set(urgent_teams) != set(teams):
            self.offer_urgent_in(teams=teams, urgent_teams=urgent_teams)

    def offer_urgent_in(self, *, teams: list[str], urgent_teams: list[str]) -> None:
        """Offer urgent only to who may submit it (Team.urgent_by): the form offered it to every
        member and the submit then refused it. Only the list shown changes: a forged urgent still
        reaches the submit, whose refusal names the team's managers."""
        priority = self.fields["priority"]
        if not urgent_teams:
            priority.widget.choices = [(p, p) for p in PRIORITIES if p != "urgent"]
            priority.help_text = "urgent: your teams let only their managers submit urgent jobs"
        else:
            others = [slug for slug in teams if slug not in urgent_teams]
            priority.help_text = (f"urgent: for jobs of {', '.join(urgent_teams)} only ({', '.join(others)} "
                                  f"{'lets only its' if len(others) == 1 else 'let only their'} managers submit "
                                  "urgent jobs)")

    def spec_document(self) -> dict[str, Any]:
        """The spec the fields describe (numbers as numbers, the rest as typed; the parser checks them)."""
        data = self.cleaned_data
        train = {"data": data["dataset"].strip(), "model": data["model"].strip()}
        for name in ("epochs", "imgsz", "batch"):
            if data[name].strip():
                train[name] = typed(data[name])
        document: dict[str, Any] = {
            "task_name": data["task_name"].strip(),
            "train": train,
            "resources": {"gpu": typed(data["gpus"] or "1")},
            "priority": data["priority"] or "medium",
        }
        if data["team"]:
            document["team"] = data["team"]
        typed_hours = data["timeout_hours"]
        hours = typed_hours.strip()
        if hours:
            try:
                value = ascii_float(typed_hours)  # not ``hours``: strip() takes a Unicode space off
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                self.add_error("timeout_hours", f"must be a number of hours, got {typed_hours!r}")
            elif value <= 0:  # (was rounded up to a 1 s timeout: the job was killed at once)
                self.add_error("timeout_hours", f"must be more than 0 hours, got {hours}")
            elif value * 3600 > settings.MAX_JOB_TIMEOUT_S:  # 1e308 hours: inf s, round() a 500 (sec19, F8)
                self.add_error("timeout_hours", f"is {hours} hours; the limit is {settings.MAX_JOB_TIMEOUT_S} s "
                                                f"({settings.MAX_JOB_TIMEOUT_S / 3600:g} hours)")
            else:
                document["timeout"] = max(1, round(value * 3600))
        if data["allow_duplicate"]:
            document["allow_duplicate"] = True
        return document

    def add_spec_errors(self, error: FieldErrors) -> None:
        for path, message in error.errors.items():
            field = form_field_for(path)
            if field == "timeout_hours" and "limit is" in message:
                message = f"{message} ({settings.MAX_JOB_TIMEOUT_S / 3600:g} hours)"
            self.add_error(field, message if field else f"{path}: {message}")


class YamlSpecForm(forms.Form):
    """The full spec as YAML, typed or uploaded (an upload wins over the text box)."""

    spec_text = forms.CharField(required=False, label="Job spec (YAML)",
                                widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false", "class": "code"}))
    spec_file = forms.FileField(required=False, label="…or upload a .yaml file")
    spec_file_used = ""  # the uploaded file's name once its text replaced the box's
    spec_file_bytes: int | None = None  # its size as sent (a UTF-16 file's text is larger as UTF-8)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        upload = data.get("spec_file")
        if upload is not None:
            if upload.size > settings.SPEC_MAX_BYTES:
                self.add_error("spec_file", f"is {upload.size} bytes; the limit is {settings.SPEC_MAX_BYTES} bytes")
                return data
            raw = upload.read(settings.SPEC_MAX_BYTES + 1)
            try:
                data["spec_text"] = text_decode(raw, field="spec_file", utf16=True)
            except YamlError as exc:
                self.add_error("spec_file", exc.errors["spec_file"])
                return data
            # A refused submit shows the text it read in the box, so that its problems point at what
            # was used, not at a spec pasted there too, which the upload replaced (trial25 F5).
            self.data = self.data.copy()
            self.data[self.add_prefix("spec_text")] = data["spec_text"]
            self.spec_file_used = upload.name
            self.spec_file_bytes = len(raw)
        if not (data.get("spec_text") or "").strip():
            self.add_error("spec_text", "paste a job spec or upload a file")
        return data

    def spec_document(self) -> Any:
        """Parse the YAML (YamlError on a size, syntax or alias problem)."""
        return load_yaml(self.cleaned_data["spec_text"], max_bytes=settings.SPEC_MAX_BYTES,
                         sent_bytes=self.spec_file_bytes)

    def add_spec_errors(self, error: FieldErrors) -> None:
        self.spec_errors = sorted(error.errors.items())
        self.add_error("spec_text", f"{len(error.errors)} problem(s) in the spec, listed below")


SWEEP_ROWS = 4
SWEEP_METRICS = [DEFAULT_METRIC, "metrics/mAP50(B)", "metrics/precision(B)", "metrics/recall(B)", "fitness",
                 "metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/accuracy_top1", "metrics/accuracy_top5"]
SWEEP_FIELDS = {"method": "method", "trials": "trials", "parallel": "parallel", "metric": "metric",
                "prune": "prune", "seed": "method"}


class SweepForm(JobForm):
    """The common fields plus a search: up to ``SWEEP_ROWS`` parameters, each a range (low, high,
    log scale, step) or choices (comma-separated). Errors such as ``sweep.parameters.lr0.low``
    come back at the row that named ``lr0``."""

    method = forms.ChoiceField(required=False, choices=[(m, m) for m in ("tpe", "random", "grid")], initial="tpe",
                               help_text="tpe: Optuna's TPE; grid: every combination")
    trials = number_field(initial="8", widget=text_input("grid: leave empty", inputmode="numeric"))
    parallel = number_field(initial="2", label="At once",
                            widget=text_input("trials queued or running at once", inputmode="numeric"))
    # Empty by default: the sweep then maximises its task's own figure (box mAP50-95 for detect, mask
    # for segment, top-1 accuracy for classify); a prefilled box metric would be sent for every task.
    metric = forms.CharField(required=False, initial="", label="Metric to maximise",
                             widget=text_input("the task's own (detect: metrics/mAP50-95(B))", list="sweep-metrics"),
                             help_text="empty: mAP50-95 of the task's masks, keypoints or boxes; top-1 for classify")
    prune = forms.ChoiceField(required=False, choices=[("", "no pruning")] + [(p, p) for p in PRUNERS],
                              initial="", label="Pruning")
    # Ultralytics' optimizer=auto ignores lr0 and momentum: a sweep names one (or sweeps it).
    optimizer = forms.ChoiceField(required=False, initial="SGD", help_text="auto ignores lr0 and momentum",
                                  choices=[(o, o) for o in ("SGD", "AdamW", "Adam", "RMSProp", "auto")])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["epochs"].initial = "3"
        for row in range(1, SWEEP_ROWS + 1):
            self.fields[f"p{row}_name"] = forms.CharField(
                required=False, label="Parameter", widget=text_input("e.g. lr0", list="train-args"))
            self.fields[f"p{row}_low"] = number_field(label="Low", widget=text_input("1e-4"))
            self.fields[f"p{row}_high"] = number_field(label="High", widget=text_input("0.1"))
            self.fields[f"p{row}_log"] = forms.BooleanField(required=False, label="log scale")
            self.fields[f"p{row}_step"] = number_field(label="Step", widget=text_input("grid step"))
            self.fields[f"p{row}_choices"] = number_field(label="…or choices", widget=text_input("SGD, AdamW"))
        if not self.is_bound:
            self.initial.update({"p1_name": "lr0", "p1_low": "1e-4", "p1_high": "1e-1", "p1_log": True})

    def rows(self) -> list[dict[str, Any]]:
        return [{key: self[f"p{row}_{key}"] for key in ("name", "low", "high", "log", "step", "choices")}
                for row in range(1, SWEEP_ROWS + 1)]

    def spec_document(self) -> dict[str, Any]:
        document = super().spec_document()
        data = self.cleaned_data
        if data["optimizer"]:
            document["train"]["optimizer"] = data["optimizer"]
        parameters: dict[str, Any] = {}
        self.row_of: dict[str, int] = {}
        for row in range(1, SWEEP_ROWS + 1):
            name = data[f"p{row}_name"].strip()
            if not name:
                continue
            if name in parameters:
                self.add_error(f"p{row}_name", f"{name} is already in row {self.row_of[name]}")
                continue
            self.row_of[name] = row
            choices = [typed(c) for c in data[f"p{row}_choices"].split(",") if c.strip()]
            ranged = any(str(data[f"p{row}_{key}"]).strip() for key in ("low", "high", "step")) or data[f"p{row}_log"]
            if choices and ranged:  # the API's refusal, at the row (the range was dropped silently: trial26)
                self.add_error(f"p{row}_choices", "give choices or a range (low, high), not both")
                parameters[name] = choices
                continue
            if choices:
                parameters[name] = choices
                continue
            value: dict[str, Any] = {"low": typed(data[f"p{row}_low"]), "high": typed(data[f"p{row}_high"])}
            value = {k: v for k, v in value.items() if v != ""}
            if data[f"p{row}_log"]:
                value["log"] = True
            if data[f"p{row}_step"].strip():
                try:
                    step = ascii_float(data[f"p{row}_step"])
                except ValueError:
                    # Kept without its step, so the row is not also reported missing ("parameters is required").
                    self.add_error(f"p{row}_step", f"must be a number, got {data[f'p{row}_step']!r}")
                else:
                    value["step"] = int(step) if step.is_integer() else step
            parameters[name] = value
        sweep: dict[str, Any] = {"method": data["method"] or "tpe", "parameters": parameters}
        if data["metric"].strip():  # else the task's own figure (apps.jobs.spec_sweep.sweep_default_metric)
            sweep["metric"] = data["metric"].strip()
        for key in ("trials", "parallel"):
            if data[key].strip():
                sweep[key] = typed(data[key])
        if data["prune"]:
            sweep["prune"] = data["prune"]
        document["sweep"] = sweep
        return document

    def sweep_field_for(self, path: str) -> str | None:
        """``sweep.parameters.lr0.low`` → ``p1_low`` (the row naming lr0); ``sweep.trials`` → ``trials``."""
        rest = path.removeprefix("sweep.")
        if rest in SWEEP_FIELDS:
            return SWEEP_FIELDS[rest]
        if rest == "parameters":
            return "p1_name"
        if not rest.startswith("parameters."):
            return None
        name, _, tail = rest.removeprefix("parameters.").partition(".")
        name = name.split("[")[0]
        row = getattr(self, "row_of", {}).get(name)
        if row is None:
            return None
        if tail in ("low", "high", "log", "step"):
            return f"p{row}_{tail}"
        if "[" in rest or tail == "choices" or tail.startswith("choices"):
            return f"p{row}_choices"
        return f"p{row}_name"

    def add_spec_errors(self, error: FieldErrors) -> None:
        for path, message in error.errors.items():
            field = (self.sweep_field_for(path) if path.startswith("sweep")
                     else "optimizer" if path == "train.optimizer" else form_field_for(path))
            if field == "timeout_hours" and "limit is" in message:
                message = f"{message} ({settings.MAX_JOB_TIMEOUT_S / 3600:g} hours)"
            self.add_error(field, message if field else f"{path}: {message}")


TRAIN_ARG_NAMES = sorted(name for name in TRAIN_ARGS if name not in {"data"})

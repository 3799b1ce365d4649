"""Browser forms. They only collect text: the job spec is validated by ``apps.jobs.spec``
and ``apps.jobs.services`` exactly as for the API, and their errors (keyed by field path,
e.g. ``train.epochs``) are put back next to the form field that caused them."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from apps.core.errors import FieldErrors
from apps.core.strict_yaml import load_yaml
from apps.jobs.spec import PRIORITIES

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


def text_input(placeholder: str = "", **attrs: Any) -> forms.TextInput:
    return forms.TextInput(attrs={"placeholder": placeholder, **attrs})


class JobForm(forms.Form):
    """The common fields. Every field is optional here: the spec parser says what is missing."""

    task_name = forms.CharField(required=False, max_length=300, widget=text_input("e.g. pcb-defects-v8s"))
    team = forms.ChoiceField(required=False, choices=())
    dataset = forms.CharField(required=False, widget=text_input("a dataset of your team", list="datasets"))
    model = forms.CharField(required=False, initial="yolov8n.yaml",
                            widget=text_input("yolov8n.yaml, name.pt or name:v1", list="models"))
    epochs = forms.CharField(required=False, initial="10", widget=text_input(inputmode="numeric"))
    imgsz = forms.CharField(required=False, initial="640", label="Image size",
                            widget=text_input(inputmode="numeric"))
    batch = forms.CharField(required=False, initial="16", widget=text_input("16, -1 = auto", inputmode="decimal"))
    gpus = forms.ChoiceField(required=False, choices=GPU_CHOICES, initial="1", label="GPUs")
    priority = forms.ChoiceField(required=False, choices=[(p, p) for p in PRIORITIES], initial="medium")
    timeout_hours = forms.CharField(required=False, initial="24", label="Timeout (hours)",
                                    widget=text_input(inputmode="decimal"))
    allow_duplicate = forms.BooleanField(required=False, label="Run even if an identical job is active")

    def __init__(self, *args: Any, teams: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(slug, slug) for slug in teams]

    def spec_document(self) -> dict[str, Any]:
        """The spec the fields describe (values as typed; the parser checks them)."""
        data = self.cleaned_data
        train = {"data": data["dataset"].strip(), "model": data["model"].strip()}
        for name in ("epochs", "imgsz", "batch"):
            if data[name].strip():
                train[name] = data[name].strip()
        document: dict[str, Any] = {
            "task_name": data["task_name"].strip(),
            "train": train,
            "resources": {"gpu": data["gpus"] or "1"},
            "priority": data["priority"] or "medium",
        }
        if data["team"]:
            document["team"] = data["team"]
        hours = data["timeout_hours"].strip()
        if hours:
            try:
                document["timeout"] = max(1, round(float(hours) * 3600))
            except ValueError:
                self.add_error("timeout_hours", f"must be a number of hours, got {hours!r}")
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

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        upload = data.get("spec_file")
        if upload is not None:
            if upload.size > settings.SPEC_MAX_BYTES:
                self.add_error("spec_file", f"is {upload.size} bytes; the limit is {settings.SPEC_MAX_BYTES} bytes")
                return data
            raw = upload.read(settings.SPEC_MAX_BYTES + 1)
            try:
                data["spec_text"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("spec_file", "is not UTF-8 text")
                return data
        if not (data.get("spec_text") or "").strip():
            self.add_error("spec_text", "paste a job spec or upload a file")
        return data

    def spec_document(self) -> Any:
        """Parse the YAML (YamlError on a size, syntax or alias problem)."""
        return load_yaml(self.cleaned_data["spec_text"], max_bytes=settings.SPEC_MAX_BYTES)

    def add_spec_errors(self, error: FieldErrors) -> None:
        self.spec_errors = sorted(error.errors.items())
        self.add_error("spec_text", f"{len(error.errors)} problem(s) in the spec, listed below")

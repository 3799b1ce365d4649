"""The job spec: the user's YAML or JSON → a validated :class:`JobSpec`.

Pure parsing and typing; no database. What needs the database (does the dataset
exist, is the caller in that team, does any node have that many GPUs) is checked by
``apps.jobs.services.spec_resolve``. Every error names the field path it is about,
e.g. ``{"command.epochs": "must be an integer, got 'ten'"}``.

``command`` follows the ``yolo`` CLI grammar (``yolo [TASK] MODE key=value …``) for the
modes ``train``, ``val``, ``predict`` and ``export``. It is tokenised with
:func:`shlex.split` and never handed to a shell; only allow-listed keys with typed values
pass, per mode. The structured form is a mapping under the mode's name (``train:``,
``val:``, ``predict:``); for an export job ``export:`` is a mapping too, while in a
training spec ``export: [onnx]`` is a *list* of formats to export after a successful run.
``JobSpec.train_args`` holds the arguments of whatever mode the job runs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from apps.core.errors import FieldErrors
from apps.core.values import ascii_float, ascii_int, bool_parse, first_found

from .spec_sweep import DECIMALS, SMALLEST, sweep_parse

TASKS = ("detect", "segment", "classify", "pose", "obb")
PRIORITIES = ("low", "medium", "high", "urgent")
FRACTIONS = (0.125, 0.25, 0.5)
MODES = ("train", "val", "predict", "export")
TOP_LEVEL_KEYS = {
    "task_name", "image", "command", "train", "val", "predict", "export", "task", "resources", "priority", "user",
    "team", "timeout", "retries", "allow_duplicate", "description", "sweep", "preemptible", "expected_duration",
}
EXPORT_FORMATS = ("onnx", "torchscript", "engine")
# [registry[:port]/]name[:tag][@digest]: starts with a letter or digit, never with '-'.
IMAGE_REFERENCE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]+)?/)?[A-Za-z0-9][A-Za-z0-9._/-]*"
                             r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?")
AUTO_EXPORT_FORMATS = ("onnx", "torchscript")  # engine needs a TensorRT node: an export job of its own
# Job fields the platform owns: giving one in a spec is mass assignment, refused with the reason.
PLATFORM_FIELDS = {
    "id": "the platform assigns it",
    "state": "the platform sets it as the job runs (use the cancel endpoint)",
    "node": "the scheduler chooses it",
    "gpus": "the scheduler allocates them (ask with resources.gpu)",
    "gpu_indices": "the scheduler allocates them (ask with resources.gpu)",
    "attempt": "the platform counts attempts",
    "attempt_id": "the platform sets it",
    "priority_class": "give it as 'priority' (low, medium, high, urgent)",
    "priority_factors": "the scheduler computes them",
    "queue_position": "the scheduler computes it",
    "estimated_start_at": "the scheduler computes it",
    "estimated_start_low_at": "the scheduler computes it",
    "estimated_start_high_at": "the scheduler computes it",
    "reason": "the scheduler sets it",
    "error": "the platform sets it",
    "exit_code": "the platform sets it",
    "weights_path": "the platform sets it",
    "created_at": "the platform sets it",
    "started_at": "the platform sets it",
    "finished_at": "the platform sets it",
    "spec": "the spec is this document itself",
}
# Arguments the platform sets itself: a user value would break isolation or bookkeeping.
RESERVED_ARGS = {
    "device": "chosen by the scheduler (the GPUs allocated to the job)",
    "project": "set by the platform (the job's own folder)",
    "name": "set by the platform (the job's own folder)",
    "exist_ok": "set by the platform",
    "resume": "managed by the platform (jobs resume from their own checkpoints)",
    "save_dir": "set by the platform",
    "plots": "set by the platform (plots need fonts that are downloaded)",
    "mode": "give the mode as the word after 'yolo' (train, val, predict, export)",
    "task": "give the task as the word after 'yolo' (e.g. 'yolo detect train …')",
    "save_txt": "set by the platform (predictions are stored as JSON)",
    "save_conf": "set by the platform",
    "show": "there is no display on a GPU node",
    "stream": "set by the platform",
    "cfg": "would replace every argument with a file's contents",
}


class SpecError(FieldErrors):
    """Validation failed; ``errors`` maps field paths to messages. ``partial``: what
    :func:`parse_spec` could read of the spec despite them (None when it refused the document as
    a whole), so the caller can check its references in the same answer
    (``apps.jobs.services.spec_parse``)."""

    def __init__(self, errors: dict[str, str], *, partial: JobSpec | None = None):
        super().__init__(errors)
        self.partial = partial


# --- typed value parsers --------------------------------------------------------------------


def _int(lo: int, hi: int | None) -> Callable[[Any], int]:
    """An integer in [lo, hi]; ``hi=None`` leaves the top to a limit from the settings, which
    ``apps.jobs.services`` checks and names (``workers``: TRAIN_MAX_WORKERS)."""

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"must be an integer, got {value!r}")
        if isinstance(value, str):
            # The match refuses what int() reads but no author means ("1_0", "3.0", words); ascii_int
            # what passes it only through strip(): a Unicode space around the digits ("3\u3000").
            if not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
                raise ValueError(f"must be an integer, got {value!r}")
            try:
                value = ascii_int(value)
            except ValueError:
                # Non-ASCII digits, or past int()'s 4300-digit limit (whose own words told the author to
                # call sys.set_int_max_str_digits).
                given = repr(value) if len(value) <= 100 else "a number of more than 100 digits"
                raise ValueError(f"must be an integer, got {given}") from None
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"must be an integer, got {value!r}")
            value = int(value)
        if not isinstance(value, int):
            raise ValueError(f"must be an integer, got {type(value).__name__}")
        if hi is None and value < lo:
            raise ValueError(f"must be at least {lo}, got {_given(value)}")
        if hi is not None and not lo <= value <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {_given(value)}")
        return value

    return parse


def _given(value: Any) -> str:
    """``repr(value)``, or words for an integer too long to write out: a YAML hex integer loads past
    Python's 4300-digit limit for ``str()`` (review27)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**100:
        return "a number of more than 100 digits"
    return repr(value)


def _float(lo: float, hi: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(f"must be a number, got {value!r}")
        try:
            number = ascii_float(value) if isinstance(value, str) else float(value)
        except OverflowError:  # an integer past a float's range (a YAML hex one): was a 500 (review27)
            raise ValueError(f"must be between {lo:g} and {hi:g}, got {_given(value)}") from None
        except (TypeError, ValueError):
            raise ValueError(f"must be a number, got {value!r}") from None
        if not math.isfinite(number) or not lo <= number <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g}, got {value!r}")
        if 0 < abs(number) < SMALLEST:
            raise ValueError(f"is too close to 0 (a grid keeps {DECIMALS} decimals): give 0 or at least "
                             f"{SMALLEST:g} in size; got {value!r}")
        return number

    return parse


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return value

    return parse


def _name(value: Any) -> str:
    """A dataset or model reference: a plain name or relative path, nothing a shell would love."""
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    if len(value) > 200:
        raise ValueError("is longer than 200 characters")
    if not re.fullmatch(r"[A-Za-z0-9._:/-]+", value):
        raise ValueError(f"may only contain letters, digits and . _ - / : (got {value!r})")
    if value.startswith("/") or ".." in value.split("/"):
        raise ValueError("must be a name or a path inside your team's storage (no '/' prefix, no '..')")
    return value


def _batch(value: Any) -> int | float:
    number = _float(-1, 4096)(value)
    if number == -1 or number >= 1:
        return _int(-1, 4096)(value if not isinstance(value, float) else number)
    if 0 < number < 1:
        return number  # a fraction of GPU memory (Ultralytics auto-batch)
    raise ValueError("must be -1 (auto), a positive integer, or a fraction between 0 and 1")


def _cache(value: Any) -> bool | str:
    if isinstance(value, str) and value in {"ram", "disk"}:
        return value
    try:
        return bool_parse(value)
    except ValueError:
        raise ValueError(f"must be true, false, ram or disk; got {value!r}") from None


_unit = _float(0, 1)


def _fraction(value: Any) -> float:
    """Ultralytics' ``fraction``: a share of the training images in (0, 1]; 0 failed at the job's
    start ("'fraction=0.0' invalid", trial26)."""
    number = _unit(value)
    if number == 0:
        raise ValueError(f"must be above 0 and at most 1 (the share of the training images to use), got {value!r}")
    return number


TRAIN_ARGS: dict[str, Callable[[Any], Any]] = {
    "data": _name,
    "model": _name,
    "epochs": _int(1, 10000),
    "imgsz": _int(32, 8192),
    "batch": _batch,
    "workers": _int(0, None),  # at most TRAIN_MAX_WORKERS: services.workers_limit_error
    "patience": _int(0, 10000),
    "optimizer": _choice("SGD", "Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSProp", "MuSGD", "auto"),
    "lr0": _float(0, 10),
    "lrf": _float(0, 10),
    "momentum": _float(0, 1),
    "weight_decay": _float(0, 1),
    "warmup_epochs": _float(0, 1000),
    "warmup_momentum": _unit,
    "warmup_bias_lr": _float(0, 10),
    "box": _float(0, 100),
    "cls": _float(0, 100),
    "dfl": _float(0, 100),
    "seed": _int(0, 2**31 - 1),
    "deterministic": bool_parse,
    "cos_lr": bool_parse,
    "close_mosaic": _int(0, 10000),
    "amp": bool_parse,
    "fraction": _fraction,
    "single_cls": bool_parse,
    "rect": bool_parse,
    "cache": _cache,
    "val": bool_parse,
    "save_period": _int(-1, 10000),
    "freeze": _int(0, 1000),
    "dropout": _unit,
    "pretrained": bool_parse,
    "time": _float(0, 10000),
    "multi_scale": _float(0, 1),
    "hsv_h": _unit,
    "hsv_s": _unit,
    "hsv_v": _unit,
    "degrees": _float(-360, 360),
    "translate": _unit,
    "scale": _float(0, 10),
    "shear": _float(-180, 180),
    "perspective": _float(0, 0.001),
    "flipud": _unit,
    "fliplr": _unit,
    "bgr": _unit,
    "mosaic": _unit,
    "mixup": _unit,
    "cutmix": _unit,
    "copy_paste": _unit,
    "erasing": _unit,
    "nbs": _int(1, 4096),
    "overlap_mask": bool_parse,
    "mask_ratio": _int(1, 64),
    "max_det": _int(1, 10000),
    "verbose": bool_parse,
}
TRAIN_DEFAULTS = {"epochs": 100, "imgsz": 640}

_split = _choice("val", "test", "train")
VAL_ARGS: dict[str, Callable[[Any], Any]] = {
    "data": _name,
    "model": _name,
    "split": _split,
    "imgsz": _int(32, 8192),
    "batch": _int(1, 1024),
    "conf": _unit,
    "iou": _unit,
    "max_det": _int(1, 10000),
    "half": bool_parse,
    "workers": _int(0, None),  # at most TRAIN_MAX_WORKERS: services.workers_limit_error
    "rect": bool_parse,
    "single_cls": bool_parse,
    "verbose": bool_parse,
}
PREDICT_ARGS: dict[str, Callable[[Any], Any]] = {
    "model": _name,
    "source": _name,
    "split": _split,
    "imgsz": _int(32, 8192),
    "conf": _unit,
    "iou": _unit,
    "max_det": _int(1, 1000),
    "half": bool_parse,
    "agnostic_nms": bool_parse,
    "line_width": _int(1, 20),
    "verbose": bool_parse,
}
EXPORT_ARGS: dict[str, Callable[[Any], Any]] = {
    "model": _name,
    "format": _choice(*EXPORT_FORMATS),
    "data": _name,
    "imgsz": _int(32, 8192),
    "batch": _int(1, 64),
    "half": bool_parse,
    "int8": bool_parse,
    "dynamic": bool_parse,
    "simplify": bool_parse,
    "opset": _int(7, 23),
    "verbose": bool_parse,
}
MODE_ARGS = {"train": TRAIN_ARGS, "val": VAL_ARGS, "predict": PREDICT_ARGS, "export": EXPORT_ARGS}
# A val's data= may be left out: the registered model's own training dataset (apps.jobs.inputs._data_of_model).
MODE_REQUIRED = {"train": ("data", "model"), "val": ("model",), "predict": ("model", "source"),
                 "export": ("model", "format")}
# What a missing required argument is for: a bare "is required" left a user who knows `yolo val
# model=…` (Ultralytics reads the model's own data.yaml) guessing what to give (new-user trial 23).
_WEIGHTS = "trained weights (name.pt) or a registered model (name:v1)"
MODE_REQUIRED_HINTS = {
    "train": {"data": "the dataset to train on (data=NAME, one of your team's datasets, e.g. data=demo)",
              "model": "a model YAML (e.g. model=yolov8n.yaml), weights (name.pt) or a registered model (name:v1)"},
    "val": {"data": "the dataset to validate on (data=NAME, one of your team's datasets; split=val by default)",
            "model": f"the model to validate: {_WEIGHTS}"},
    "predict": {"model": f"the model to predict with: {_WEIGHTS}",
                "source": "the images (source=NAME: an images upload, or a dataset with split=val/test/train)"},
    "export": {"model": f"the model to export: {_WEIGHTS}", "format": "onnx, torchscript or engine (format=onnx)"},
}
MODE_DEFAULTS: dict[str, dict[str, Any]] = {"train": TRAIN_DEFAULTS, "val": {"split": "val"},
                                            "predict": {"split": "val"}, "export": {}}


# --- resources ------------------------------------------------------------------------------

_MEMORY_UNITS = {"": 1 / 2**20, "k": 1e3 / 2**20, "m": 1e6 / 2**20, "g": 1e9 / 2**20, "t": 1e12 / 2**20,
                 "ki": 1 / 1024, "mi": 1, "gi": 1024, "ti": 1024**2}


def parse_memory_mb(value: Any) -> int:
    """Kubernetes-style quantities (``16Gi``, ``512Mi``, ``2G``) or plain bytes → MiB."""
    if isinstance(value, bool):
        raise ValueError(f"must be a quantity like 16Gi or 512Mi, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            mib = value / 2**20
        except OverflowError:  # an integer past a float's range: was a 500 (review27)
            mib = math.inf
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTkmgt]i?)?[bB]?\s*", str(value), re.ASCII)
        if not match:
            raise ValueError(f"must be a quantity like 16Gi or 512Mi, got {value!r}")
        mib = float(match.group(1)) * _MEMORY_UNITS[(match.group(2) or "").lower()]
    if not 0 <= mib <= 64 * 1024 * 1024:
        raise ValueError(f"is out of range: {_given(value)}")
    if 0 < mib < 1:
        # Memory is kept in MiB: "0.0000000001Gi" was rounded up to a 1 MiB limit, which no
        # training survives, where the writer surely meant something else (trial28).
        raise ValueError(f"is less than 1Mi: give 0 for none, or at least 1Mi; got {_given(value)}")
    return int(math.ceil(mib))


def parse_cpu_milli(value: Any) -> int:
    """``"4"``, ``4``, ``0.5`` or ``"500m"`` → millicores."""
    if isinstance(value, bool):
        raise ValueError(f"must be a CPU count like 4 or 500m, got {value!r}")
    text = str(value).strip()
    # strip() takes a Unicode space off too: the value as given must be ASCII
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", text, re.ASCII) if str(value).isascii() else None
    if not match:
        raise ValueError(f"must be a CPU count like 4 or 500m, got {value!r}")
    milli = float(match.group(1)) * (1 if match.group(2) else 1000)
    if not 0 <= milli <= 1024 * 1000:
        raise ValueError(f"is out of range: {value!r}")
    return int(math.ceil(milli))


MAX_GPUS = 64


def parse_gpus(value: Any) -> float:
    """A whole number of GPUs (1 to MAX_GPUS) or one of FRACTIONS of one GPU; every other value
    (0, -1, 1.5, 0.3, "two") gets the same message, which lists what is allowed."""
    try:
        number = _float(0, MAX_GPUS)(value)
    except ValueError:
        number = None
    if number is not None and ((number >= 1 and number.is_integer()) or number in FRACTIONS):
        return number
    fractions = ", ".join(f"{f:g}" for f in FRACTIONS[:-1]) + f" or {FRACTIONS[-1]:g}"
    raise ValueError(f"must be a whole number of GPUs from 1 to {MAX_GPUS}, or {fractions} of one GPU; "
                     f"got {_given(value)}")


# --- the spec -------------------------------------------------------------------------------


@dataclass
class JobSpec:
    task_name: str
    task: str
    train_args: dict[str, Any]
    # Whether the spec names its task ('yolo segment train …', ``task: segment``) or ``task`` is the
    # default detect: a named task must agree with the model's own (apps/jobs/inputs.py).
    task_named: bool = False
    gpus: float = 1.0
    mode: str = "train"  # train | val | predict | export
    export: list[str] = field(default_factory=list)  # formats to export after a successful training
    requires: list[str] = field(default_factory=list)  # node features it needs ("tensorrt" for format=engine)
    gpu_memory_mb: int = 0
    gpu_models: list[str] = field(default_factory=list)
    cpu_milli: int = 0
    memory_mb: int = 0
    priority: str = "medium"
    charge_to: str = ""  # team slug (or the caller's own username); resolved by the service
    timeout_s: int = 0  # 0 = the platform default
    # false: never preempted (charged at PolicyConfig.nonpreemptible_charge × usage, and it
    # must fit in the daily quota); docs/scheduling.md
    preemptible: bool = True
    expected_duration_s: int = 0  # the user's runtime estimate, used until history exists; 0 = none
    retries: int = 0
    allow_duplicate: bool = False
    image: str = ""
    command: str = ""
    description: str = ""
    # A hyperparameter sweep (apps.jobs.spec_sweep): this spec is then the sweep's parent, and
    # train_args the base arguments of its trials. Empty for every other job.
    sweep: dict[str, Any] = field(default_factory=dict)
    # Which key named ``charge_to`` (``user`` or ``team``), so that a refusal names the field the
    # client sent: `team: robotics` was refused as `user` (CI trial 17, H7). Not stored: it is how
    # the request was written, not what the job is.
    charge_field: str = field(default="team", compare=False)
    # Whether ``sweep`` names its ``metric``: when it does not, submit replaces the parsed default
    # with the task's own figure once the model's task is known (apps.jobs.services.spec_resolve).
    # Not stored either: the stored sweep holds the metric it was judged on.
    sweep_metric_given: bool = field(default=True, compare=False)
    # Whether the arguments name ``split`` (a val's or predict's default is val): an images upload
    # has no splits, so a predict on one that names a split is refused (apps/jobs/inputs.py). Not
    # stored either; False for a spec rebuilt from a stored one.
    split_given: bool = field(default=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The stored fields, each copied (``dataclasses.asdict`` without its deep copy of every
        string and number: a fifth of parsing a submit)."""
        return {name: _copied(getattr(self, name)) for name in _STORED_FIELDS}

    def runtime_signature(self) -> str:
        """What decides how long training takes; finished jobs with the same one estimate queued ones."""
        args = self.train_args
        what = [self.task, args.get("model"), args.get("data"), args.get("imgsz"), args.get("epochs"),
                args.get("batch"), args.get("fraction"), self.gpus]
        if self.mode != "train" or self.export:
            what += [self.mode, args.get("source"), args.get("format"), args.get("split"), self.export]
        return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()

    def fingerprint(self) -> str:
        """Identity for duplicate detection: what would run, not who asked or when."""
        what = {
            "task": self.task,
            "mode": self.mode,
            "export": self.export,
            "train_args": self.train_args,
            "gpus": self.gpus,
            "gpu_memory_mb": self.gpu_memory_mb,
            "gpu_models": sorted(self.gpu_models),
            "image": self.image,
        }
        if self.sweep:
            what["sweep"] = {key: value for key, value in self.sweep.items() if key != "seed"}
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


_STORED_FIELDS = tuple(f.name for f in fields(JobSpec) if f.name not in ("charge_field", "sweep_metric_given", "split_given"))
_PLAIN = (str, int, float, bool, type(None))


def _copied(value: Any) -> Any:
    """What ``dataclasses.asdict`` makes of a field's value: dicts, lists and tuples rebuilt,
    anything else deep-copied; plain scalars are immutable, so they are kept as they are."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict):
        return {_copied(key): _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_copied(item) for item in value)
    return copy.deepcopy(value)


# --- parsing --------------------------------------------------------------------------------


# Characters that make shlex do more than split at its whitespace (quotes, escapes), and its
# whitespace: a command with none of the first is split by the regular expression alone.
_SHLEX_SPECIAL = re.compile(r"""['"\\]""")
_SHLEX_WHITESPACE = re.compile(r"[ \t\r\n]+")


def command_words(command: str) -> list[str]:
    """``shlex.split(command)``; a command without quotes or backslashes (nearly all of them)
    is split at shlex's whitespace by a regular expression instead of shlex's
    character-by-character reader (a tenth of a submit's parsing). ValueError as shlex's."""
    if _SHLEX_SPECIAL.search(command):
        return shlex.split(command)
    return [word for word in _SHLEX_WHITESPACE.split(command) if word]


def command_parse(command: Any) -> tuple[str, str, dict[str, Any], dict[str, str]]:
    """``yolo [TASK] MODE k=v …`` → (task, mode, raw args, errors). Values stay strings here."""
    errors: dict[str, str] = {}
    if not isinstance(command, str) or not command.strip():
        return "detect", "train", {}, {"command": "must be a non-empty string like 'yolo train data=… model=…'"}
    if len(command) > 4000:
        return "detect", "train", {}, {"command": "is longer than 4000 characters"}
    try:
        tokens = command_words(command)
    except ValueError as exc:
        return "detect", "train", {}, {"command": f"cannot be split into words: {exc}"}
    if not tokens or tokens[0] != "yolo":
        return "detect", "train", {}, {"command": "must start with 'yolo' (only Ultralytics commands run here)"}
    words = tokens[1:]
    task = "detect"
    if words and words[0] in TASKS:
        task, words = words[0], words[1:]
    if not words or "=" in words[0]:
        return task, "train", {}, {"command": f"must name the mode after 'yolo' ({', '.join(MODES)})"}
    mode, words = words[0], words[1:]
    if mode in TASKS and words and words[0] in MODES:  # `yolo train detect` order is not valid either
        return task, "train", {}, {"command": f"put the task before the mode: 'yolo {mode} {words[0]} …'"}
    if mode not in MODES:
        return task, "train", {}, {"command": f"mode {mode!r} is not supported; jobs run {', '.join(MODES)}"}
    args: dict[str, Any] = {}
    stray: list[str] = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep and word in _BARE_FLAGS:
            # Ultralytics' entrypoint reads a bare boolean argument as =True (`yolo export … half`,
            # `yolo train … cos_lr`, `yolo train resume`): so does the spec, and the typed check below
            # answers one this mode does not take, or the platform's own (resume), by its name.
            key, sep, value = word, "=", "True"
        elif not sep and word in MODE_ARGS[mode]:
            errors[f"command.{word}"] = (f"is missing its value: write {word}=<value> "
                                         "(only true/false arguments may stand alone)")
            continue
        if not sep or not key:
            stray.append(word)
            continue
        if key in args:
            errors[f"command.{key}"] = "is given twice"
            continue
        args[key] = value
    if stray:
        # Every stray word, not the last one alone ("--epochs 3" was refused for '3'; new-user trial 20).
        shown = ", ".join(repr(word[:40]) for word in stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        hint = " (Ultralytics takes epochs=3, not --epochs 3)" if any(w.startswith("-") for w in stray) else ""
        errors["command"] = f"expected key=value words, got {shown}{hint}"
    return task, mode, args, errors


# Words Ultralytics takes alone as =True: its boolean arguments (those the modes here take, and the
# platform's own) and the export flags it lists itself ({"half", "int8", "end2end", "nms"}).
_BARE_FLAGS = frozenset(
    {key for allowed in MODE_ARGS.values() for key, parser in allowed.items() if parser in (bool_parse, _cache)}
    | {"resume", "plots", "exist_ok", "save_txt", "save_conf", "show", "stream", "half", "int8", "end2end", "nms"})


def _command_names_task(command: Any) -> bool:
    """Whether ``yolo TASK MODE …`` names its task (``yolo train …`` leaves it to the default)."""
    try:
        words = command_words(command) if isinstance(command, str) else []
    except ValueError:
        return False
    return len(words) > 1 and words[1] in TASKS


def parse_command(command: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``yolo [TASK] MODE k=v …`` → (task, raw args, errors); see :func:`command_parse` for the mode."""
    task, _, args, errors = command_parse(command)
    return task, args, errors


def _typed_args(raw: dict[str, Any], path: str, errors: dict[str, str], mode: str = "train") -> dict[str, Any]:
    typed: dict[str, Any] = {}
    allowed = MODE_ARGS[mode]
    for key, value in raw.items():
        where = f"{path}.{key}"
        if key in RESERVED_ARGS:
            errors[where] = f"cannot be set: {RESERVED_ARGS[key]}"
            continue
        parser = allowed.get(key)
        if parser is None:
            errors[where] = (f"is not an allowed {'training' if mode == 'train' else mode} argument"
                             + ("" if mode == "train" else f" (allowed: {', '.join(sorted(allowed))})"))
            continue
        if isinstance(value, str) and parser is not _name and value.lower() in {"none", "null"}:
            errors[where] = "must have a value"
            continue
        try:
            typed[key] = parser(value)
        except ValueError as exc:
            errors[where] = str(exc)
    for required in MODE_REQUIRED[mode]:
        if required not in raw and f"{path}.{required}" not in errors:
            errors[f"{path}.{required}"] = f"is required: {MODE_REQUIRED_HINTS[mode][required]}"
    for key, default in MODE_DEFAULTS[mode].items():
        typed.setdefault(key, default)
    if mode == "export" and typed.get("half") and typed.get("int8"):
        errors[f"{path}.int8"] = "give half or int8, not both"
    return typed


def _holds_nul(text: str) -> bool:
    return "\x00" in text


def _typed_train_args(raw: dict[str, Any], path: str, errors: dict[str, str]) -> dict[str, Any]:
    return _typed_args(raw, path, errors, "train")


def _export_after(value: Any, errors: dict[str, str]) -> list[str]:
    formats = [value] if isinstance(value, str) else value
    if not isinstance(formats, list):
        errors["export"] = f"must be a list of formats to export after training, e.g. [onnx] ({', '.join(AUTO_EXPORT_FORMATS)})"
        return []
    chosen: list[str] = []
    for item in formats:
        if item == "engine":
            errors["export"] = ("engine (TensorRT) is exported by an export job of its own "
                                "('yolo export model=NAME:vN format=engine'): it runs only on nodes that advertise TensorRT")
        elif item not in AUTO_EXPORT_FORMATS:
            errors["export"] = f"{item!r} is not a format exported after training (use {', '.join(AUTO_EXPORT_FORMATS)})"
        elif item not in chosen:
            chosen.append(item)
    return chosen


def export_requires(mode: str, args: dict[str, Any]) -> list[str]:
    """The node features an export job needs: TensorRT for an engine; a real GPU ("cuda") for an FP16
    TorchScript, which Ultralytics traces in half precision on the GPU only (on a CPU it refuses:
    "use device=0"). An FP16 ONNX is converted on the CPU, so any node does."""
    if mode != "export":
        return []
    if args.get("format") == "engine":
        return ["tensorrt"]
    if args.get("format") == "torchscript" and args.get("half"):
        return ["cuda"]
    return []


def parse_spec(document: Any) -> JobSpec:
    """Validate a decoded document (dict from YAML or JSON). Raises :class:`SpecError`."""
    if not isinstance(document, dict):
        raise SpecError({"spec": "must be a mapping of fields (task_name, command, resources, …)"})
    if found := first_found(document, _holds_nul, among=str, key_named="by_its_mapping"):
        # PostgreSQL stores no NUL in text or jsonb; no field has a use for one anyway. A key holding one
        # is named by its mapping ("spec" for the document's own).
        path, _ = found
        raise SpecError({path or "spec": "must not contain a NUL character"})
    errors: dict[str, str] = {}
    for key in document:
        if key in PLATFORM_FIELDS:
            errors[str(key)] = f"cannot be set: {PLATFORM_FIELDS[key]}"
        elif key not in TOP_LEVEL_KEYS:
            errors[str(key)] = f"is not a known field (known: {', '.join(sorted(TOP_LEVEL_KEYS))})"

    task_name = document.get("task_name")
    if task_name is not None and not isinstance(task_name, str):
        errors["task_name"] = f"must be a string (a short name for the job), got {task_name!r}"
    elif not task_name or not task_name.strip():
        errors["task_name"] = "is required (a short name for the job)"
    elif len(task_name) > 200 or not re.fullmatch(r"[\w .:+@()-]+", task_name):
        errors["task_name"] = "must be at most 200 letters, digits, spaces or . _ - : + @ ( )"

    command = document.get("command")
    export_value = document.get("export")
    structured_modes = [m for m in MODES if isinstance(document.get(m), dict)]
    task = "detect"
    task_named = split_given = False
    mode = "train"
    train_args: dict[str, Any] = {}
    export_after: list[str] = []
    for key in ("train", "val", "predict"):
        if key in document and not isinstance(document[key], dict):
            errors[key] = f"must be a mapping of {key} arguments"
    if command is not None and structured_modes:
        errors["command"] = f"give either command or {structured_modes[0]}, not both"
    elif len(structured_modes) > 1:
        errors[structured_modes[1]] = f"give one of {', '.join(MODES)}, not several"
    elif structured_modes:
        mode = structured_modes[0]
        train_args = _typed_args(document[mode], mode, errors, mode)
        split_given = "split" in document[mode]
        try:
            task = _choice(*TASKS)(document.get("task", "detect"))
        except ValueError as exc:
            errors["task"] = str(exc)
        task_named = "task" in document
        command = None
    elif command is not None:
        task, mode, raw_args, command_errors = command_parse(command)
        task_named = _command_names_task(command)
        errors.update(command_errors)
        if "command" not in command_errors:
            train_args = _typed_args(raw_args, "command", errors, mode)
            split_given = "split" in raw_args
        if "task" in document:
            errors["task"] = "give the task inside command ('yolo detect train …')"
    elif "export" not in errors and not any(k in errors for k in ("train", "val", "predict")):
        errors["command"] = "is required: e.g. 'yolo train data=demo model=yolov8n.yaml epochs=3'"
    # An empty list is "export nothing", as leaving the key out is (it was answered "must be a list").
    if export_value is not None and export_value != [] and not isinstance(export_value, dict):
        if mode != "train":
            errors["export"] = "a list of formats to export after training belongs in a training spec"
        else:
            export_after = _export_after(export_value, errors)

    spec = JobSpec(task_name=str(task_name or ""), task=task, task_named=task_named, train_args=train_args, mode=mode,
                   export=export_after,
                   command=command if isinstance(command, str) else "", requires=export_requires(mode, train_args),
                   split_given=split_given)

    resources = document.get("resources", {}) or {}
    if not isinstance(resources, dict):
        errors["resources"] = "must be a mapping like {gpu: 1, memory: 16Gi, cpu: '4'}"
        resources = {}
    for key, value in resources.items():
        where = f"resources.{key}"
        try:
            if key == "gpu":
                spec.gpus = parse_gpus(value)
            elif key == "memory":
                spec.memory_mb = parse_memory_mb(value)
            elif key == "cpu":
                spec.cpu_milli = parse_cpu_milli(value)
            elif key == "gpu_memory":
                spec.gpu_memory_mb = parse_memory_mb(value)
            elif key == "gpu_model":
                models = [value] if isinstance(value, str) else value
                if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
                    raise ValueError("must be a GPU model name or a list of them")
                spec.gpu_models = models
            else:
                errors[where] = "is not a known resource (gpu, memory, cpu, gpu_memory, gpu_model)"
        except ValueError as exc:
            errors[where] = str(exc)

    try:
        spec.priority = _choice(*PRIORITIES)(document.get("priority", "medium"))
    except ValueError as exc:
        errors["priority"] = str(exc)
    for key in ("user", "team"):
        if key in document:
            value = document[key]
            if not isinstance(value, str) or not re.fullmatch(r"[\w.@+-]{1,150}", value):
                errors[key] = "must be a team slug or your username"
            else:
                spec.charge_to, spec.charge_field = value, key
    if "user" in document and "team" in document:
        errors["team"] = "give either user or team, not both"
    if "timeout" in document:
        try:
            spec.timeout_s = _int(1, 10**9)(document["timeout"])
        except ValueError as exc:
            errors["timeout"] = str(exc)
    if "preemptible" in document:
        try:
            spec.preemptible = bool_parse(document["preemptible"])
        except ValueError as exc:
            errors["preemptible"] = str(exc)
    if "expected_duration" in document:
        try:
            spec.expected_duration_s = _int(1, 10**9)(document["expected_duration"])
            if spec.timeout_s and spec.expected_duration_s > spec.timeout_s:
                errors["expected_duration"] = f"must not exceed timeout ({spec.timeout_s} s)"
        except ValueError as exc:
            errors["expected_duration"] = f"{exc} (seconds)"
    if "retries" in document:
        try:
            spec.retries = _int(0, 5)(document["retries"])
        except ValueError as exc:
            errors["retries"] = str(exc)
    if "allow_duplicate" in document:
        try:
            spec.allow_duplicate = bool_parse(document["allow_duplicate"])
        except ValueError as exc:
            errors["allow_duplicate"] = str(exc)
    for key in ("image", "description"):
        value = document.get(key, "")
        if not isinstance(value, str) or len(value) > 300:
            errors[key] = "must be a string of at most 300 characters"
        elif key == "image" and value and not IMAGE_REFERENCE.fullmatch(value):
            # It is one argument of `podman run`: "--privileged" or "--volume=/:/host" was read as
            # an option of the run, not as the image (sec21, F8).
            errors[key] = (f"must be a container image reference like ultralytics/ultralytics:8.3.0 or "
                           f"registry.example.org/team/yolo@sha256:… (got {value[:60]!r})")
        else:
            setattr(spec, key, value)
    if "sweep" in document:
        if mode != "train":
            errors["sweep"] = f"only a training spec can be swept; this is a {mode} job"
        elif export_value is not None:
            errors["export"] = ("a sweep registers its best trial's weights as a model version: export that "
                                "version with an export job ('yolo export model=NAME:vN format=onnx')")
        else:
            spec.sweep = sweep_parse(document["sweep"], args=TRAIN_ARGS, reserved=RESERVED_ARGS, errors=errors,
                                     base=train_args)
            spec.sweep_metric_given = not isinstance(document["sweep"], dict) or "metric" in document["sweep"]
    if errors:
        raise SpecError(errors, partial=spec)
    return spec

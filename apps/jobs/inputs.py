"""What a job's spec names, found in the database at submit: datasets, weights, versions.

For every mode (train, val, predict, export) :func:`inputs_resolve` returns two records
the job keeps in its ``spec``:

- ``resolved``: what the worker needs — artifact *keys* (never absolute paths) and the
  sha256 the weights must still have;
- ``inputs``: what the job used, for lineage and reproducibility — the dataset version and
  its hash, the parent weights or model version and its hash, the source of a predict
  job. Shown to the team (``Job.public_spec``); it holds no server path.

Errors name the spec field (``command.data``, ``val.model``, …). Besides that each name
resolves, what would only fail once the job runs is refused here: a task the dataset's
labels cannot serve (a segment job on boxes; ``Dataset.task_problem``), a task the model is not
(``yolo segment train model=<detect weights>``: Ultralytics keeps the weights' task), a ``val`` of a model
on a dataset with other classes (its per-class table would carry the model's names over the
dataset's), an FP16 TorchScript export where no node has a real GPU, a ``freeze`` that leaves a model
YAML nothing to train (``freeze=99``; :func:`~apps.jobs.weights.freeze_problem`).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from apps.cluster.models import Node
from apps.datasets.models import Dataset
from apps.datasets.selectors import DataRef, dataset_reads_ahead, dataset_resolve
from apps.datasets.stats import label_task_problem
from apps.registry.models import ModelVersion

from .spec import JobSpec
from .weights import ModelRef, freeze_problem, model_resolve, model_yaml_known


def _field(spec: JobSpec, name: str) -> str:
    return f"{'command' if spec.command else spec.mode}.{name}"


def inputs_resolve(*, spec: JobSpec, team) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(resolved, inputs, errors) for the spec's mode."""
    errors: dict[str, str] = {}
    resolved: dict[str, Any] = {"mode": spec.mode}
    inputs: dict[str, Any] = {"mode": spec.mode}
    args = spec.train_args

    model: ModelRef | None = None
    task_refused = False
    try:
        model = model_resolve(team=team, reference=args.get("model", ""), yaml_allowed=spec.mode == "train")
    except ValueError as exc:
        errors[_field(spec, "model")] = str(exc)
    if model is not None:
        resolved["model"] = model.as_resolved()
        inputs["model"] = model.as_input()
        if model.task:
            resolved["task"] = model.task
            task_refused = _model_task_refused(spec, model, errors)
        if spec.mode == "train" and (problem := freeze_problem(freeze=args.get("freeze", 0), model=model.yaml)):
            errors[_field(spec, "freeze")] = problem

    from_model = ""
    if spec.mode == "val" and not args.get("data") and _field(spec, "data") not in errors:
        from_model = _data_of_model(spec, model, errors)
    if spec.mode in ("train", "val") and _field(spec, "data") not in errors:
        data = _data(spec, team, "data", errors, kinds=(Dataset.Kind.YOLO, Dataset.Kind.CLASSIFY))
        if data is not None:
            resolved["data_yaml"] = data.yaml_key
            inputs["data"] = data.lineage()
            if from_model:  # said in the job's spec (the submit's answer): what it validates on, and why
                inputs["data"]["chosen"] = (f"no data= given: {data.dataset.reference}, the dataset model "
                                            f"{from_model} was trained on")
            if not task_refused:  # which task would run is what that error is about
                _task_check(spec, data, resolved, errors)
            if spec.mode == "train" and args.get("val", True) is not False:
                _train_val_check(spec, data, errors)
            if spec.mode == "val":
                _split_check(spec, data, errors, "data")
                if _field(spec, "data") not in errors:  # a dataset of another task: its classes are beside the point
                    _classes_check(spec, data, model, errors)
    elif spec.mode == "predict":
        source = _data(spec, team, "source", errors,
                       kinds=(Dataset.Kind.YOLO, Dataset.Kind.IMAGES, Dataset.Kind.CLASSIFY))
        if source is not None:
            resolved["source"] = _source(spec, source, errors)
            inputs["source"] = {**source.lineage(), "split": resolved["source"].get("split", "")}
            inputs["data"] = source.lineage()
    elif spec.mode == "export":
        _export_inputs(spec, team, model, resolved, inputs, errors)
    if spec.export:
        resolved["export"] = [{"format": fmt} for fmt in spec.export]
    return resolved, inputs, errors


def inputs_reads_ahead(*, spec: JobSpec, team) -> list[tuple[Any, dict[str, Any]]]:
    """The dataset read :func:`inputs_resolve` makes first (``data=``, or a prediction's
    ``source=``), so a submit can read it ahead with its other reads (apps.core.prepared.reads_ahead)."""
    name = {"train": "data", "val": "data", "predict": "source"}.get(spec.mode)
    return dataset_reads_ahead(team=team, reference=spec.train_args.get(name, "")) if name else []


def _data(spec: JobSpec, team, name: str, errors: dict[str, str],
          kinds: tuple[str, ...] = (Dataset.Kind.YOLO,)) -> DataRef | None:
    try:
        return dataset_resolve(team=team, reference=spec.train_args.get(name, ""), kinds=kinds)
    except ValueError as exc:
        errors[_field(spec, name)] = str(exc)
    return None


def _data_of_model(spec: JobSpec, model: ModelRef | None, errors: dict[str, str]) -> str:
    """A ``val`` without ``data=``: as ``yolo val model=…`` does in Ultralytics (it reads the model's
    own data.yaml), the dataset version the registered model was trained on, when the registry
    recorded one of the team's. Sets ``data`` in the spec's arguments (so the stored spec and the
    submit's answer say which) and returns the model's reference; '' with the error on ``data`` else
    (trial30: it was refused even for a model trained here)."""
    where = _field(spec, "data")
    hint = "give the dataset to validate on (data=NAME, one of your team's datasets; split=val by default)"
    version = model.weights.version if model is not None and model.weights is not None else None
    if model is None:
        errors[where] = f"is required: {hint}, or name a registered model trained here (its dataset is used)"
        return ""
    reference = spec.train_args.get("model", "")
    if version is None or (not version.lineage.get("dataset") and version.dataset_id is None):
        errors[where] = f"is required: {reference} records no training dataset here, so {hint}"
        return ""
    dataset = version.dataset
    if dataset is None or dataset.team_id != version.team_id:
        gone = version.lineage.get("dataset") or {}
        name = f"{gone.get('name')}:v{gone.get('version')}" if gone.get("name") else "its dataset"
        errors[where] = f"is required: {reference} was trained on {name}, which is deleted, so {hint}"
        return ""
    spec.train_args["data"] = dataset.reference
    return reference


def _model_task_refused(spec: JobSpec, model: ModelRef, errors: dict[str, str]) -> bool:
    """Whether the spec names a task that is not the model's own (the error on the model field then
    says so): Ultralytics trains and runs weights as their own task whatever the command says
    (``yolo segment train model=<detect weights>`` trains detect), and a model YAML built as another
    task's model fails once it runs. A task left to the default is the model's (as ``yolo train
    model=yolov8n-seg.yaml`` is segment in Ultralytics' own CLI)."""
    if not spec.task_named or spec.task == model.task:
        return False
    reference = spec.train_args.get("model")
    where = "the command's task" if spec.command else "the spec's task"
    if model.weights:
        verb = {"train": "train", "val": "validate", "predict": "predict with", "export": "export"}[spec.mode]
        start = (f"Start from {spec.task} weights or a {spec.task} model YAML" if spec.mode == "train"
                 else f"Give {spec.task} weights")
        errors[_field(spec, "model")] = (
            f"{reference} holds a {model.task} model, and {where} is {spec.task}: Ultralytics would ignore "
            f"{spec.task} and {verb} it as {model.task}. {start}, or leave the task out to {verb} it as {model.task}")
    else:
        errors[_field(spec, "model")] = (
            f"{reference} builds a {model.task} model, and {where} is {spec.task}: give a {spec.task} model YAML "
            f"(e.g. {_yaml_for(reference, spec.task)}), or leave the task out to train {model.task}")
    return True


def _yaml_for(reference: str, task: str) -> str:
    """``yolov8n.yaml`` as the model YAML of another task (``yolov8n-seg.yaml``)."""
    suffix = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb", "classify": "-cls"}[task]
    stem = re.sub(r"-(seg|pose|obb|cls)$", "", reference.rsplit(".", 1)[0])
    return f"{stem}{suffix}.yaml" if model_yaml_known(f"{stem}{suffix}.yaml") else f"yolov8n{suffix}.yaml"


def _task_check(spec: JobSpec, data: DataRef, resolved: dict[str, Any], errors: dict[str, str]) -> None:
    """The task the job runs, as the worker decides it (the model's own task — its weights' or its
    YAML's —, else the spec's for a training; a val of weights whose task is unknown is left to
    Ultralytics), against what the dataset's labels can serve."""
    task = resolved.get("task") or (spec.task if spec.mode == "train" else "")
    if not task:
        return
    dataset = data.dataset
    # A path that is no registered version: its labels are unknown, but it is a data.yaml all the same.
    problem = dataset.task_problem(task) if dataset is not None else label_task_problem("", task)
    if not problem:
        return
    name = dataset.reference if dataset is not None else spec.train_args.get("data")
    if spec.task_named or not resolved.get("task"):
        source = f"the command's task is {task}" if spec.command else f"the spec's task is {task}"
    else:
        source = f"{spec.train_args.get('model')} is a {task} model"
    errors[_field(spec, "data")] = f"dataset {name} {problem} ({source})"


def _classes_check(spec: JobSpec, data: DataRef, model: ModelRef | None, errors: dict[str, str]) -> None:
    """A val job's dataset must have the model's classes, id for id: Ultralytics reports every class
    under the model's name for that id. Left to run when the model's classes are not known (a
    team's own weights file, a checkpoint whose names the scan could not read), and with
    ``single_cls`` (every class is one)."""
    weights = model.weights if model is not None else None
    if spec.train_args.get("single_cls") or weights is None or data.dataset is None:
        return
    version = weights.version
    ours = version.class_names if version is not None else weights.class_names
    theirs = [str(name) for name in data.dataset.names or []]
    if ours is None and version is not None and version.source == version.Source.TRAINING and theirs:
        # A version trained here always had classes: not knowing them is no reason to let a
        # mismatched evaluation be filed on it (new-user trial 16, G17).
        errors[_field(spec, "data")] = (
            f"dataset {data.dataset.reference} has {len(theirs)} classes ({_names(theirs)}) and the classes of "
            f"model {version.reference} are not known (it was trained on {_trained_on_name(version)}, which is gone, "
            f"before versions kept their class names), so the evaluation cannot be checked against them. "
            f"Evaluate with single_cls=true, or register the weights again")
        return
    if ours is None or not theirs or ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None)
    differs = (f"class {first} is {theirs[first]!r} in the dataset and {ours[first]!r} in the model"
               if first is not None else "the first classes agree")
    named = version.reference if version is not None else f"weights {spec.train_args.get('model')}"
    trained_on = _trained_on_name(version) if version is not None and version.source == version.Source.TRAINING else ""
    errors[_field(spec, "data")] = (
        f"dataset {data.dataset.reference} has {len(theirs)} classes ({_names(theirs)}) and model "
        f"{named} {len(ours)} ({_names(ours)}): {differs}; the per-class results would carry the "
        f"model's names. Evaluate on a dataset with the model's classes"
        f"{f' (it was trained on {trained_on})' if trained_on else ''}, or add single_cls=true")


def _trained_on_name(version) -> str:
    """The dataset version a model version was trained on, as its lineage names it (the row may be gone)."""
    if version.dataset is not None:
        return version.dataset.reference
    data = (version.lineage or {}).get("dataset") or {}
    return f"{data['name']}:v{data['version']}" if data.get("name") and data.get("version") else "its dataset"


def _names(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f", … {len(names) - shown} more" if len(names) > shown else "")


def _split_check(spec: JobSpec, data: DataRef, errors: dict[str, str], name: str) -> None:
    split = spec.train_args.get("split", "val")
    splits = ((data.dataset.stats or {}).get("splits") or {}) if data.dataset else None
    if splits is not None and split not in splits:
        errors[_field(spec, "split")] = (f"dataset {data.dataset.reference} has no {split!r} split "
                                         f"(it has {', '.join(splits) or 'none'})")
    elif name == "data" and splits is not None and split in data.dataset.unlabelled_splits():
        # A val of a split where no image has a labelled object ran, and recorded "mAP50-95 0 … 0 classes" as
        # the model's evaluation (Ultralytics: "cannot compute metrics without labels"; trial 31). A predict job
        # ("source") needs no labels.
        labelled = ", ".join(f"split={other}" for other, counts in splits.items()
                             if other != split and counts.get("instances"))
        errors[_field(spec, "split")] = (
            f"the {split!r} split of dataset {data.dataset.reference} has no labels ({splits[split]['images']} "
            f"images, none with a labelled object): every metric would be 0; validate on a split with labels"
            f"{f' ({labelled})' if labelled else ''} or upload the {split} labels")


def _train_val_check(spec: JobSpec, data: DataRef, errors: dict[str, str]) -> None:
    """A training validates on the dataset's val split every epoch (Ultralytics' trainer): on one where no image
    has a labelled object every metric was 0 each epoch and best.pt was picked by those zeros (trial31 left; T2
    refused only `yolo val`). Refused naming the split unless the spec says val=false, which skips validation
    during training (Ultralytics still validates the last epoch and best.pt: those figures stay 0)."""
    images = data.dataset.unlabelled_splits().get("val") if data.dataset else None
    if images:
        errors[_field(spec, "data")] = (
            f"the 'val' split of dataset {data.dataset.reference} has no labels ({images} images, none "
            "with a labelled object): a training validates on it every epoch, so every metric would be 0 and best.pt "
            "chosen by those zeros; upload the val labels, or train with val=false (no validation during training; "
            "the last epoch's is still 0)")


def _source(spec: JobSpec, data: DataRef, errors: dict[str, str]) -> dict[str, Any]:
    """Which images a predict job reads: a YOLO dataset's split, or all of an images upload."""
    dataset = data.dataset
    if dataset is not None and dataset.kind == Dataset.Kind.IMAGES:
        count = dataset.num_images
        if spec.split_given:
            # It was accepted and ignored, and made a duplicate of the same job without it (trial23).
            errors[_field(spec, "split")] = (
                f"an images upload has no splits: {dataset.reference} is images to predict on, and a predict job "
                f"annotates all {count} of them; leave split out (split chooses among a YOLO dataset's "
                "train/val/test)")
        source = {"folder_key": data.folder_key, "split": ""}
    else:
        split = spec.train_args.get("split", "val")
        _split_check(spec, data, errors, "source")
        stats = ((dataset.stats or {}).get("splits") or {}).get(split, {}) if dataset else {}
        count = stats.get("images", 0)
        source = {"data_yaml": data.yaml_key, "split": split}
    if count > settings.PREDICT_MAX_IMAGES:
        errors[_field(spec, "source")] = (f"has {count} images; a predict job annotates at most "
                                          f"{settings.PREDICT_MAX_IMAGES} (PREDICT_MAX_IMAGES)")
    return source


def _export_inputs(spec: JobSpec, team, model: ModelRef | None, resolved: dict, inputs: dict,
                   errors: dict[str, str]) -> None:
    """An export needs validation images to verify against (and to calibrate int8): ``data=`` or
    the dataset the version was trained on."""
    args = spec.train_args
    if args.get("format") == "engine" and not any(
            "tensorrt" in (features or []) for features in Node.objects.values_list("features", flat=True)):
        errors[_field(spec, "format")] = ("engine (TensorRT) is exported only on nodes that advertise TensorRT, and "
                                          "none of this cluster's nodes does: export onnx or torchscript here")
    simulated = list(Node.objects.values_list("simulated", flat=True)) if "cuda" in spec.requires else []
    if simulated and all(simulated):
        errors[_field(spec, "half")] = (
            "half precision (FP16) TorchScript is exported on a GPU, and every node of this cluster has simulated "
            "GPUs only (it runs jobs on its CPUs): drop half=true, or export format=onnx half=true (converted to "
            "FP16 on the CPU)")
    resolved["export"] = [{"format": args.get("format"), **{k: args[k] for k in (
        "half", "int8", "dynamic", "imgsz", "batch", "simplify", "opset") if k in args}}]
    if args.get("data"):
        # A classifier's export is verified on a classification dataset's images (or any YOLO dataset's).
        kinds = ((Dataset.Kind.YOLO, Dataset.Kind.CLASSIFY) if model is not None and model.task == "classify"
                 else (Dataset.Kind.YOLO,))
        data = _data(spec, team, "data", errors, kinds=kinds)
    else:
        version = model.weights.version if model is not None and model.weights else None
        dataset = _trained_on(version)
        data = DataRef(yaml_key=dataset.yaml_key, folder_key=dataset.key, dataset=dataset) if dataset else None
        if data is None and model is not None:
            # A version whose dataset was deleted since still names it (trial 20: "do not say" misled).
            trained = ((version.lineage or {}).get("dataset") or {}) if version is not None else {}
            why = (f"the dataset they were trained on, {trained['name']}:v{trained.get('version')}, has been deleted"
                   if trained.get("name") else "these weights do not say which dataset they were trained on")
            errors[_field(spec, "data")] = (f"is required here: the export is verified on validation images, and "
                                            f"{why}; name one with data=<dataset>")
    if data is not None:
        resolved["data_yaml"] = data.yaml_key
        inputs["data"] = data.lineage()


def _trained_on(version: ModelVersion | None) -> Dataset | None:
    if version is None:
        return None
    if version.dataset is not None and version.dataset.kind in (Dataset.Kind.YOLO, Dataset.Kind.CLASSIFY):
        return version.dataset
    return None

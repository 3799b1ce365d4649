"""The training child process: one Ultralytics job attempt — train, val, predict or export —
reported as events. ONE event contract for every kind of job (below).

The GPU worker runs ``python -m worker.train_child CONFIG.json`` in its own process
group with ``CUDA_VISIBLE_DEVICES`` already set, and learns what happened only from the
events file and the exit code. This module never imports Django, and imports neither
torch nor ultralytics at module level, so the parent may import it for its constants.
val, predict and export live in ``worker.model_modes`` and report through the same events.

Weights are pickles: before *any* ``.pt`` is loaded here (``model``, ``resume_from``) it
must still have the sha256 the job recorded at submit (``model_sha256``) and pass the
restricted unpickling check of ``apps.registry.checkpoint_scan`` (the check uploads went
through); Ultralytics then loads it with ``ULTRALYTICS_SAFE_LOAD=1`` (``weights_only``).

Config (JSON object)
--------------------
``mode``             ``train`` (default), ``val``, ``predict`` or ``export``
``model``            model YAML name (``yolov8n.yaml``, train only) or absolute ``.pt`` path
``model_sha256``     optional: the sha256 the ``.pt`` must have (checked before loading)
``data``             absolute path of a data.yaml (a ``download:`` key is refused); required
                     for train and val, optional for export (validation images to verify
                     against, int8 calibration) and predict (with ``split``)
``split``            val/predict: the dataset split (``val`` by default)
``source``           predict: absolute folder of images to annotate (instead of ``data``/``split``)
``export``           list of export options (``format`` onnx/torchscript/engine, ``half``,
                     ``int8``, ``dynamic``, ``imgsz``, ``batch``, ``simplify``, ``opset``): the
                     export job's one entry, or the formats a training exports afterwards
``engine_allowed``   whether this node advertises TensorRT (``format=engine``)
``output_dir``       val/predict/export: where their files go (default ``project/<mode>``)
``args``             extra kwargs of the mode (epochs, imgsz, batch, workers, lr0, conf, ...)
``device``           ``"cpu"``, ``"0"`` or ``"0,1"`` (indices inside CUDA_VISIBLE_DEVICES)
``project``, ``name`` run folder ``project/name``; reused by every attempt of a job
``resume_from``      absolute checkpoint path to resume from, or null (train)
``checkpoint_dir``   where verified per-epoch checkpoint copies go (train)
``events_path``      JSON-lines file the events are appended to
``progress_interval_s`` minimum seconds between progress events (default 0.25)
``config_dir``       YOLO_CONFIG_DIR (Ultralytics settings, DDP temp files); never $HOME
``weights_dir``      optional: local weights store (Ultralytics ``weights_dir`` setting)
``task``             optional: detect/segment/...; inferred from the model when absent
``cpu_threads``      optional: torch threads (the CPUs the job asked for); null = torch's default
``gpu_memory_fraction`` optional: a fractional job's share of each GPU's memory: the child
                     caps its allocator there (``torch.cuda.set_per_process_memory_fraction``)
                     and auto-batch (``batch=-1`` or a fraction) sizes against the share
``stop_file``        optional: when this file exists at the end of an epoch (its checkpoint
                     written), stop there: ``stopped`` event, exit 5 (the Slurm relay creates
                     it when the time limit is near)
``fault_cuda_oom_above_batch`` tests only: raise CUDA's out-of-memory error in the second
                     epoch (after a checkpoint) while training with a batch above this

Events (one JSON object per line, flushed per line; every event also has ``time``,
Unix seconds)
-----------------------------------------------------------------------------
``started``     every mode: ``mode``. train: ``epochs`` (total), ``start_epoch`` (1-based
                first epoch this process trains; > 1 when resuming), ``save_dir``, ``batch``
                (the batch size it trains with, after auto-batch).
                val: ``split``. predict: ``images``. export: ``formats``.
``progress``    train: ``epoch``, ``batch`` (1-based), ``batches``, ``losses``
                ({"box_loss", "cls_loss", "dfl_loss"}: running means over the epoch);
                at most one per ``progress_interval_s``, plus always the last batch.
                predict: ``done``, ``total`` (images).
``epoch``       train: ``epoch`` (1-based), ``epochs`` (total), ``values``: train/*,
                metrics/*, val/*, lr/pg*, fitness — plain floats, NaN/inf as null. Emitted
                just *before* that epoch's ``checkpoint`` event, so whoever holds
                checkpoint N also holds the metrics of epoch N. A resumed attempt may
                repeat an epoch that had metrics but no checkpoint: upsert by epoch.
``checkpoint``  train: ``epoch``, ``path``, ``sha256``, ``size``. The file is a complete,
                fsynced copy of that epoch's ``last.pt``; its sidecar ``epoch-NNNN.json``
                (epoch, sha256, size) is written after it. Only the newest
                ``KEEP_CHECKPOINTS`` are kept. A resumed attempt that redoes epoch N
                replaces ``epoch-NNNN.pt`` with new bytes: key checkpoints by epoch.
                ``best``: Ultralytics wrote this epoch's checkpoint as ``best.pt`` too
                (the same bytes), so this copy restores ``best.pt`` on another server.
``finished``    every mode: ``mode``, ``code`` (python/torch/ultralytics/onnx versions),
                ``exports`` (list, maybe empty). Exit 0.
                train: ``weights`` (best.pt, else last.pt), ``last``, ``metrics`` (final
                validation of best.pt), ``epochs``. When ``resume_from`` is the checkpoint
                of a run that already finished, ``finished`` is the only event
                (``resumed_finished_run: true``) and ``weights`` is the run folder's best.pt
                if present, else the checkpoint itself. With ``export`` formats, each is
                exported from ``weights`` after training; one that fails has an ``error``
                in its entry, and the training still succeeded.
                val: ``metrics``, ``per_class`` ([{class, name, of (box/mask/keypoints: the task's own), images, instances,
                precision, recall, map50, map50_95}]; a classifier's: [{class, name, of: top1, images,
                instances: null, correct, accuracy (correct / images, that class's top-1 accuracy)}]),
                ``speed``, ``split``.
                predict: ``folder`` (annotated ``NNNNN.jpg`` + ``predictions.json``),
                ``images``, ``boxes``.
                export: ``exports`` = [{``format``, ``path``, ``options``, ``seconds``,
                ``verification``: {runtime, images, outputs, precision, max_abs, max_rel,
                rtol, atol, passed}}] (see ``worker.model_modes``).
``error``       ``kind`` (``oom`` | ``data`` | ``checkpoint`` | ``weights`` | ``export`` |
                ``config`` | ``exception``), ``message``, ``advice``, ``traceback``; an
                ``export`` error also has ``verification`` when the comparison ran; an
                ``oom`` has ``cuda`` (true) when it was CUDA's (the worker then retries with
                half the batch) and ``batch``, the batch size it failed at.
``stopped``     ``epoch``, ``reason`` (``stop_file``): stopped after that epoch's checkpoint.

Exit codes: 0 success; 1 the job failed (error kinds oom, data, weights, export,
exception); 2 bad config (kind ``config``; no event at all if the config file itself is
unreadable); 4 the ``resume_from`` checkpoint is missing, corrupt or fails its sidecar
hash (kind ``checkpoint``): fall back to an older checkpoint; 5 stopped on request
(``stop_file``). Killed by a signal: no final event.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.core.hashing import file_sha256  # Django-free, like this module

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_CHECKPOINT = 4
EXIT_STOPPED = 5

KEEP_CHECKPOINTS = 3
CHECKPOINT_NAME = re.compile(r"^epoch-(\d{4,})\.pt$")

# Integrations that phone home or need their own servers; all off in the portal.
_INTEGRATIONS = ("clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard", "wandb")

# Train kwargs the child decides itself. `cfg` would replace every argument with a YAML
# file's contents; the others choose files, folders and devices the scheduler owns.
RESERVED_ARGS = frozenset(
    {"cfg", "model", "data", "device", "project", "name", "exist_ok", "resume", "save_dir", "mode"}
)


class ConfigError(Exception):
    """The child's own config is invalid (a bug in the parent, not in the user's job)."""


class DataConfigError(Exception):
    """The dataset YAML is unusable or unsafe."""


class CheckpointError(Exception):
    """The checkpoint to resume from cannot be used; the caller may try an older one."""


class WeightsError(Exception):
    """The weights to load changed since submit or fail the checkpoint check: never loaded."""


MODES = ("train", "val", "predict", "export")


class StopRequested(Exception):
    """The stop file appeared: training ends after the checkpoint of ``epoch``."""

    def __init__(self, epoch: int) -> None:
        super().__init__(f"stopped after epoch {epoch} on request")
        self.epoch = epoch


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ChildConfig:
    model: str
    data: Path | None
    args: dict[str, Any]
    device: str
    project: Path
    name: str
    resume_from: Path | None
    checkpoint_dir: Path
    events_path: Path
    config_dir: Path
    progress_interval_s: float = 0.25
    weights_dir: Path | None = None
    task: str | None = None
    mode: str = "train"
    model_sha256: str = ""
    split: str = "val"
    source: Path | None = None
    export: tuple[dict[str, Any], ...] = ()
    engine_allowed: bool = False
    output_dir: Path | None = None
    cpu_threads: int | None = None
    gpu_memory_fraction: float | None = None
    stop_file: Path | None = None
    fault_cuda_oom_above_batch: int | None = None

    @property
    def run_dir(self) -> Path:
        return self.project / self.name

    @property
    def mode_dir(self) -> Path:
        """Where val/predict/export write their files."""
        return self.output_dir or self.project / self.mode

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ChildConfig:
        """Validate a decoded config; raise ConfigError naming the first bad key."""

        def absolute(key: str, *, optional: bool = False) -> Path | None:
            value = raw.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, str) or not value or not os.path.isabs(value):
                raise ConfigError(f"'{key}' must be an absolute path, got {value!r}")
            return Path(value)

        for key in ("model", "device", "name"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ConfigError(f"'{key}' must be a non-empty string")
        model = raw["model"]
        # Anything else (a bare "yolov8n.pt" or "yolov8n") makes Ultralytics try a download.
        if not (model.endswith((".yaml", ".yml")) or (model.endswith(".pt") and os.path.isabs(model))):
            raise ConfigError(f"'model' must be a model YAML name or an absolute .pt path, got {model!r}")
        args = raw.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError("'args' must be an object")
        task = raw.get("task")
        if task is not None and not isinstance(task, str):
            raise ConfigError("'task' must be a string or null")
        interval = raw.get("progress_interval_s", 0.25)
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval < 0:
            raise ConfigError("'progress_interval_s' must be a non-negative number")
        mode = raw.get("mode", "train")
        if mode not in MODES:
            raise ConfigError(f"'mode' must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "train" and not model.endswith(".pt"):
            raise ConfigError(f"'model' must be an absolute .pt path for {mode}, got {model!r}")
        export = raw.get("export") or []
        if not isinstance(export, list) or not all(isinstance(e, dict) and e.get("format") for e in export):
            raise ConfigError("'export' must be a list of objects with a 'format'")
        if mode == "export" and len(export) != 1:
            raise ConfigError("an export job exports exactly one format ('export' with one entry)")
        data = absolute("data", optional=mode in ("predict", "export"))
        source = absolute("source", optional=True)
        if mode == "predict" and data is None and source is None:
            raise ConfigError("predict needs 'source' (a folder of images) or 'data' with a 'split'")
        threads = raw.get("cpu_threads")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ConfigError("'cpu_threads' must be a positive integer or null")
        fraction = raw.get("gpu_memory_fraction")
        if fraction is not None and (not isinstance(fraction, (int, float)) or isinstance(fraction, bool)
                                     or not 0 < fraction <= 1):
            raise ConfigError("'gpu_memory_fraction' must be a number in (0, 1] or null")
        fault = raw.get("fault_cuda_oom_above_batch")
        if fault is not None and (not isinstance(fault, int) or isinstance(fault, bool)):
            raise ConfigError("'fault_cuda_oom_above_batch' must be an integer or null")
        return cls(
            model=model,
            data=data,
            args=dict(args),
            device=raw["device"],
            project=absolute("project"),  # type: ignore[arg-type]
            name=raw["name"],
            resume_from=absolute("resume_from", optional=True),
            checkpoint_dir=absolute("checkpoint_dir"),  # type: ignore[arg-type]
            events_path=absolute("events_path"),  # type: ignore[arg-type]
            config_dir=absolute("config_dir"),  # type: ignore[arg-type]
            progress_interval_s=float(interval),
            weights_dir=absolute("weights_dir", optional=True),
            task=task or None,
            mode=mode,
            model_sha256=str(raw.get("model_sha256") or ""),
            split=str(raw.get("split") or "val"),
            source=source,
            export=tuple(dict(e) for e in export),
            engine_allowed=bool(raw.get("engine_allowed", False)),
            output_dir=absolute("output_dir", optional=True),
            cpu_threads=threads,
            gpu_memory_fraction=float(fraction) if fraction is not None else None,
            stop_file=absolute("stop_file", optional=True),
            fault_cuda_oom_above_batch=fault,
        )


# --------------------------------------------------------------------------- events


def json_safe(value: Any) -> Any:
    """Plain JSON values: tensors/numpy become floats or lists, NaN and inf become None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    # torch tensors and numpy scalars/arrays, without importing either here.
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    if hasattr(value, "item"):
        return json_safe(value.item())
    try:
        return json_safe(float(value))
    except (TypeError, ValueError):
        return str(value)


@dataclass
class EventLog:
    """Appends events to a JSON-lines file.

    The file is opened per event (append mode) rather than held open: the reporter is
    pickled into Ultralytics' DDP workers, and a held file handle would not pickle.
    At a few events per second the open/close cost is negligible.
    """

    path: Path

    def emit(self, type_: str, **fields: Any) -> None:
        event = {"type": type_, "time": round(time.time(), 3), **json_safe(fields)}
        line = json.dumps(event, allow_nan=False, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


# ---------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class CheckpointInfo:
    epoch: int
    path: Path
    sha256: str
    size: int


def copy_checkpoint(source: Path, checkpoint_dir: Path, epoch: int) -> CheckpointInfo:
    """Copy ``source`` to ``checkpoint_dir/epoch-NNNN.pt`` atomically and durably.

    1. Stream the bytes into a temp file in the destination directory, hashing them.
    2. flush + fsync the temp file, then os.replace it over the final name.
    3. Write the sidecar ``epoch-NNNN.json`` (epoch, sha256, size) the same way.
    4. fsync the directory so both renames survive a power cut.
    A crash at any point leaves either the previous complete file or none, never a
    truncated ``epoch-NNNN.pt`` under its final name.
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"epoch-{epoch:04d}.pt"
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=checkpoint_dir)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; the web and registry may read these
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    info = CheckpointInfo(epoch=epoch, path=final, sha256=digest.hexdigest(), size=size)
    _write_json_atomically(final.with_suffix(".json"), {"epoch": epoch, "sha256": info.sha256, "size": size})
    _fsync_dir(checkpoint_dir)
    return info


def prune_checkpoints(checkpoint_dir: Path, keep: int = KEEP_CHECKPOINTS) -> list[Path]:
    """Delete all but the ``keep`` highest-epoch checkpoints (and their sidecars)."""
    found = sorted(
        (int(m.group(1)), p) for p in checkpoint_dir.glob("epoch-*.pt") if (m := CHECKPOINT_NAME.match(p.name))
    )
    removed = []
    for _, path in found[: max(len(found) - keep, 0)]:
        # Sidecar first: a .json without its .pt would claim a checkpoint that is gone.
        path.with_suffix(".json").unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse to fsync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temp_files(checkpoint_dir: Path) -> None:
    """Temp files of an attempt killed mid-copy; only one attempt of a job runs at a time."""
    for tmp in checkpoint_dir.glob(".epoch-*.tmp"):
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------ reporter


def _is_main_rank() -> bool:
    # Ultralytics' DDP workers carry RANK; only rank 0 (or a non-DDP run, -1) reports.
    return int(os.environ.get("RANK", "-1")) in (-1, 0)



def _batch_trained(trainer: Any) -> int:
    """The batch Ultralytics really trains with: ``batch`` as asked, but never more than the
    training images (its dataloader takes ``min(batch, len(dataset))``). Reported, and halved by
    the portal after a CUDA out-of-memory error, as this: halving a ``batch=1024`` asked of 32
    images changed nothing for four tries before (seen on an H200, docs/gpu-check.md)."""
    batch = int(trainer.batch_size)
    try:
        images = len(trainer.train_loader.dataset)
    except (AttributeError, TypeError):
        return batch
    return min(batch, images) if batch >= 1 and images >= 1 else batch

@dataclass
class TrainingReporter:
    """Ultralytics callbacks that turn trainer state into events.

    Plain picklable state only: for multi-GPU runs Ultralytics cloudpickles the
    callbacks into its DDP worker processes, where rank 0 does the reporting.
    """

    events: EventLog
    checkpoint_dir: Path
    progress_interval_s: float = 0.25
    keep_checkpoints: int = KEEP_CHECKPOINTS
    stop_file: Path | None = None
    fault_cuda_oom_above_batch: int | None = None
    batch_size: int | None = None  # the batch being trained with (Ultralytics halves it on CUDA OOM in epoch 1)
    _epoch: int = -1  # 0-based epoch being trained, as Ultralytics counts
    _batch: int = 0
    _last_progress: float = 0.0
    _reported_epochs: set[int] = field(default_factory=set)

    def register(self, model: Any) -> None:
        for hook in (
            "on_train_start",
            "on_train_epoch_start",
            "on_train_batch_end",
            "on_model_save",
            "on_fit_epoch_end",
        ):
            model.add_callback(hook, getattr(self, hook))

    def on_train_start(self, trainer: Any) -> None:
        if _is_main_rank():
            self.events.emit(
                "started",
                mode="train",
                epochs=int(trainer.epochs),
                start_epoch=int(trainer.start_epoch) + 1,
                save_dir=str(trainer.save_dir),
                batch=_batch_trained(trainer),
            )

    def on_train_epoch_start(self, trainer: Any) -> None:
        # Also called again when Ultralytics restarts the first epoch after a CUDA OOM
        # with a halved batch, which is why the batch counter resets here.
        self._epoch = int(trainer.epoch)
        self._batch = 0
        self.batch_size = _batch_trained(trainer)

    def on_train_batch_end(self, trainer: Any) -> None:
        self._batch += 1
        fault = self.fault_cuda_oom_above_batch
        if fault is not None and int(trainer.epoch) >= 1 and int(trainer.batch_size) > fault:
            import torch

            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (simulated: batch={trainer.batch_size} is above "
                f"fault_cuda_oom_above_batch={fault})")
        if not _is_main_rank() or not trainer.tloss:
            return
        batches = len(trainer.train_loader)
        now = time.monotonic()
        if self._batch < batches and now - self._last_progress < self.progress_interval_s:
            return
        self._last_progress = now
        self.events.emit(
            "progress",
            epoch=self._epoch + 1,
            batch=self._batch,
            batches=batches,
            losses={str(k): v for k, v in trainer.tloss.items()},
        )

    def on_model_save(self, trainer: Any) -> None:
        """last.pt (and results.csv) for this epoch are on disk: report metrics, then the copy."""
        if not _is_main_rank():
            return
        self._emit_epoch(trainer)
        epoch = int(trainer.epoch) + 1
        info = copy_checkpoint(Path(trainer.last), self.checkpoint_dir, epoch)
        # save_model() writes best.pt with last.pt's very bytes on this condition (Ultralytics 8.4).
        best = trainer.best_fitness == trainer.fitness
        self.events.emit("checkpoint", epoch=epoch, path=str(info.path), sha256=info.sha256, size=info.size,
                         best=bool(best))
        prune_checkpoints(self.checkpoint_dir, self.keep_checkpoints)
        if self.stop_file is not None and self.stop_file.exists() and epoch < int(trainer.epochs):
            self.events.emit("stopped", epoch=epoch, reason="stop_file")
            raise StopRequested(epoch)

    def on_fit_epoch_end(self, trainer: Any) -> None:
        # Also fired once more by final_eval() with trainer.epoch bumped past the last
        # trained epoch; that call carries best.pt's metrics, reported by `finished`.
        # On a trained epoch the event was normally sent by on_model_save already;
        # this covers epochs Ultralytics did not save (save=False).
        if _is_main_rank() and int(trainer.epoch) == self._epoch:
            self._emit_epoch(trainer)

    def _emit_epoch(self, trainer: Any) -> None:
        epoch = int(trainer.epoch) + 1
        if epoch in self._reported_epochs:
            return
        self._reported_epochs.add(epoch)
        values: dict[str, Any] = {}
        if trainer.tloss:
            values.update(trainer.label_loss_items(trainer.tloss, prefix="train"))
        values.update(trainer.metrics or {})
        values.update(getattr(trainer, "lr", {}) or {})
        values["fitness"] = trainer.fitness
        self.events.emit("epoch", epoch=epoch, epochs=int(trainer.epochs), values=values)


# ------------------------------------------------------------------ ultralytics setup


def prepare_environment(config: ChildConfig) -> None:
    """Environment Ultralytics reads once, at import time; must run before importing it."""
    import_time_environment(config.config_dir)


def preload(config_dir: Path) -> None:
    """For the zygote (worker/zygote.py): import torch and Ultralytics once, set up as a child would."""
    import_time_environment(config_dir)
    # torch.cuda.is_available() through NVML, without initialising CUDA: CUDA does not
    # survive the fork that turns this process into a training child.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    import torch  # noqa: F401

    # init_seeds() -> torch.use_deterministic_algorithms() imports torch._inductor (~1.7 s
    # of CPU) on every run; import it once here. It starts no threads at import.
    import torch._inductor  # noqa: F401
    import torch._inductor.standalone_compile  # noqa: F401
    import ultralytics  # noqa: F401
    import ultralytics.data.build  # noqa: F401
    import ultralytics.engine.trainer  # noqa: F401
    import ultralytics.models.yolo  # noqa: F401
    from ultralytics import YOLO  # noqa: F401


def import_time_environment(config_dir: Path) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)  # settings.json, DDP temp files
    os.environ["YOLO_OFFLINE"] = "1"  # is_online() -> False: no update checks, no analytics
    os.environ["YOLO_AUTOINSTALL"] = "false"  # never pip-install a missing requirement
    # 8.4.190 honours this: checkpoints load with torch.load(weights_only=True) against an
    # allow-list of Ultralytics/torch classes instead of arbitrary unpickling.
    os.environ["ULTRALYTICS_SAFE_LOAD"] = "1"
    # matplotlib (imported by Ultralytics) would otherwise write its cache into $HOME.
    os.environ.setdefault("MPLCONFIGDIR", str(config_dir / "matplotlib"))
    # onnxruntime (export checks) writes a device id under the XDG cache, else $HOME/.cache.
    os.environ.setdefault("XDG_CACHE_HOME", str(config_dir / "cache"))
    # The Platform callbacks stream metrics and upload weights when a key is present.
    os.environ.pop("ULTRALYTICS_API_KEY", None)


def configure_ultralytics(config: ChildConfig) -> None:
    """Settings and patches that keep a training run local; call after prepare_environment."""
    import ultralytics.data.utils
    import ultralytics.engine.trainer
    from ultralytics.utils import LOGGER, SETTINGS

    # Writes config_dir/Ultralytics/settings.json (never $HOME, see prepare_environment).
    # Integrations are read per trainer, so this takes effect for the run below.
    updates: dict[str, Any] = {"sync": False, "api_key": "", "runs_dir": str(config.project)}
    updates.update(dict.fromkeys(_INTEGRATIONS, False))
    if config.weights_dir is not None:
        updates["weights_dir"] = str(config.weights_dir)
    SETTINGS.update(updates)

    # check_det_dataset() calls check_font() on every run, plots or not, and check_font()
    # sends an HTTP HEAD to GitHub when the font is not cached (YOLO_OFFLINE is not
    # consulted). Offline we use a local font if there is one, else none.
    def local_font(font: str = "Arial.ttf") -> Path | None:
        from ultralytics.utils import USER_CONFIG_DIR

        cached = USER_CONFIG_DIR / Path(font).name
        return cached if cached.exists() else None

    ultralytics.data.utils.check_font = local_font  # type: ignore[assignment]

    # On CUDA, check_amp() loads yolo26n.pt from weights_dir and, when it is missing,
    # *tries to download it first* (safe_download only consults YOLO_OFFLINE after the
    # request fails, which can hang on a firewalled node). Run the real check only when
    # the file is already local; otherwise trust AMP, as Ultralytics does when offline.
    original_check_amp = ultralytics.engine.trainer.check_amp

    def offline_check_amp(model: Any) -> bool:
        from ultralytics.utils import SETTINGS as settings

        device = next(model.parameters()).device
        if device.type in {"cpu", "mps"}:
            return False
        if (Path(settings["weights_dir"]) / "yolo26n.pt").is_file():
            return bool(original_check_amp(model))
        LOGGER.warning("AMP: checks skipped (offline, yolo26n.pt not in weights_dir); using AMP.")
        return True

    ultralytics.engine.trainer.check_amp = offline_check_amp  # type: ignore[assignment]
    hub_weights_only()


def hub_weights_only() -> None:
    """torch.hub loads the weights it caches with ``torch.load(weights_only=False)``: a file in the
    node's hub cache would run as code when a ``TorchVision`` layer (named in a checkpoint's model YAML,
    which fine-tuning rebuilds) asks for pretrained weights (sec22). Those files are plain state dicts,
    so load them with ``weights_only=True``, here and where torchvision bound the function at import."""
    import torch.hub

    original = getattr(torch.hub.load_state_dict_from_url, "__wrapped__", torch.hub.load_state_dict_from_url)

    @functools.wraps(original)
    def load_state_dict_from_url(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    torch.hub.load_state_dict_from_url = load_state_dict_from_url
    for name in ("torchvision._internally_replaced_utils", "torchvision.models._api"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "load_state_dict_from_url"):
            module.load_state_dict_from_url = load_state_dict_from_url


def apply_limits(config: ChildConfig) -> None:
    """Stay in the job's lane: torch threads = its CPUs; a fractional GPU's share of memory.

    The cgroup's CPU quota would throttle extra threads anyway, but threads beyond the
    quota only contend with each other. The GPU share is enforced by PyTorch's allocator
    (an allocation past it raises CUDA's out-of-memory error), and auto-batch is told the
    share instead of the whole GPU's free memory (:func:`share_autobatch`).
    """
    import torch

    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    fraction = config.gpu_memory_fraction
    if fraction is None:
        return
    share_autobatch(fraction)
    if config.device != "cpu" and torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, index)
        print(f"train_child: GPU memory capped at {fraction:g} of each GPU (a fractional job)", flush=True)


def share_fraction(fraction: float, *, share: float, total_gib: float, available_gib: float) -> float:
    """Auto-batch's "fraction of available memory" for a job that may use ``share`` of the GPU.

    Ultralytics sizes the batch to ``fraction`` of what the whole GPU has available; with a
    share the available memory is at most ``share × total``, so the fraction shrinks to keep
    the same proportion of *our* memory.
    """
    if available_gib <= 0:
        return fraction
    ours = min(available_gib, share * total_gib)
    return fraction * ours / available_gib


def share_autobatch(share: float) -> None:
    """Make Ultralytics' auto-batch (``batch=-1`` or a fraction) size against our share."""
    import ultralytics.utils.autobatch as autobatch_module

    original = autobatch_module.autobatch
    if getattr(original, "_yoloportal_share", None) is not None:
        return

    def autobatch(model, imgsz=640, fraction=0.60, *args, **kwargs):
        import torch

        device = next(model.parameters()).device
        if device.type == "cuda":
            gib = 1 << 30
            total = torch.cuda.get_device_properties(device).total_memory / gib
            available = (torch.cuda.memory_reserved(device) + torch.cuda.mem_get_info(device)[0]) / gib
            fraction = share_fraction(fraction, share=share, total_gib=total, available_gib=available)
        return original(model, imgsz, fraction, *args, **kwargs)

    autobatch._yoloportal_share = share
    autobatch_module.autobatch = autobatch


def ultralytics_data(data_yaml: Path, task: str) -> str:
    """What Ultralytics is given as ``data``: the data.yaml, or for a classify model the dataset's
    folder (``train/<class>/…``): Ultralytics reads a classification dataset only as a folder
    (check_cls_dataset refuses a file, and downloads a name it does not find)."""
    return str(data_yaml.parent) if task == "classify" else str(data_yaml)


def check_data_yaml(path: Path) -> None:
    """Refuse a dataset YAML Ultralytics would execute or cannot read."""
    import yaml

    if not path.is_file():
        raise DataConfigError(f"dataset YAML not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise DataConfigError(f"dataset YAML {path} is not readable YAML: {e}") from e
    if not isinstance(data, dict):
        raise DataConfigError(f"dataset YAML {path} must be a mapping")
    if "download" in data:
        # Ultralytics executes `download:` (shell or Python) when the val images are missing.
        raise DataConfigError(f"dataset YAML {path} has a 'download:' key, which is not allowed")
    for key in ("train", "val"):
        if not data.get(key):
            raise DataConfigError(f"dataset YAML {path} has no '{key}:' key")


@dataclass(frozen=True)
class ResumePoint:
    epoch: int  # 1-based epoch the checkpoint completed (0 for a stripped final weights file)
    epochs: int
    train_metrics: dict[str, Any]

    @property
    def finished(self) -> bool:
        # Ultralytics refuses (AssertionError "nothing to resume") when the next epoch
        # would be past the end; a stripped final weights file has epoch -1 (here 0).
        return self.epoch == 0 or self.epoch >= self.epochs


def inspect_checkpoint(path: Path) -> ResumePoint:
    """Load a resume checkpoint once up front, so damage surfaces as CheckpointError.

    Ultralytics would otherwise report a truncated file as "Resume checkpoint not found"
    (a FileNotFoundError) from deep inside the trainer.
    """
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        try:
            expected = json.loads(sidecar.read_text())
        except ValueError as e:
            raise CheckpointError(f"unreadable sidecar {sidecar}: {e}") from e
        if expected.get("size") != path.stat().st_size or expected.get("sha256") != file_sha256(path):
            raise CheckpointError(f"checkpoint {path} does not match the hash in {sidecar}")
    from ultralytics.nn.tasks import load_checkpoint

    try:
        _, ckpt = load_checkpoint(path)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {e}") from e
    train_args = ckpt.get("train_args") or {}
    epoch = ckpt.get("epoch", -1)
    if not isinstance(epoch, int) or "epochs" not in train_args:
        raise CheckpointError(f"{path} is not a training checkpoint (no epoch/train_args)")
    return ResumePoint(
        epoch=max(epoch, -1) + 1,
        epochs=int(train_args["epochs"]),
        train_metrics=dict(ckpt.get("train_metrics") or {}),
    )


# ------------------------------------------------------------------------- errors


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(kind, advice) for the error event."""
    chain = _exception_chain(exc)
    if any(isinstance(e, ExportFailed) for e in chain):
        return "export", ("The exported model's raw outputs disagree with the PyTorch model's beyond the stated "
                          "tolerance; try FP32 (no half/int8) or another opset.")
    # Checkpoint before weights: a resume checkpoint that fails the weights check is raised
    # as a CheckpointError from the WeightsError, and the caller must try an older one.
    if any(isinstance(e, CheckpointError) for e in chain):
        return "checkpoint", "Resume from an older checkpoint, or restart the job from scratch."
    if any(isinstance(e, WeightsError) for e in chain):
        return "weights", "Upload the weights again (or pick another version); they were not loaded."
    if any(_is_out_of_memory(e) for e in chain):
        return "oom", (
            "The GPU ran out of memory. Lower `batch` (or `imgsz`), or request a GPU with "
            "more memory. Ultralytics already halved the batch up to 3 times in epoch 1, and the "
            "portal retries from the last checkpoint with half the batch (CUDA_OOM_RETRIES)."
        )
    if any(_is_data_error(e) for e in chain):
        return "data", "Check the dataset: data.yaml keys and paths, images and label files."
    return "exception", "Unexpected failure; see the traceback and the job log."


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_out_of_memory(exc: BaseException) -> bool:
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
        return True
    message = str(exc).lower()
    return "out of memory" in message or "can't allocate memory" in message


def _is_cuda_oom(exc: BaseException) -> bool:
    """CUDA's out of memory (the worker retries it with half the batch), not the host's."""
    return any(type(e).__name__ == "OutOfMemoryError" or "cuda out of memory" in str(e).lower()
               for e in _exception_chain(exc))


def _is_data_error(exc: BaseException) -> bool:
    if isinstance(exc, DataConfigError):
        return True
    if str(exc).startswith("Dataset '"):  # BaseTrainer.get_dataset() wraps check_det_dataset()
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    # Raised by Ultralytics' dataset code: missing images, no labels, bad label rows.
    return tb is not None and f"{os.sep}ultralytics{os.sep}data{os.sep}" in tb.tb_frame.f_code.co_filename


# --------------------------------------------------------------------------- main


def train(config: ChildConfig, events: EventLog) -> int:
    """Run one attempt; emit ``finished`` and return 0, or raise."""
    prepare_environment(config)
    configure_ultralytics(config)
    apply_limits(config)
    check_data_yaml(config.data)
    if "," in config.device:
        try:
            import cloudpickle  # noqa: F401
        except ImportError as e:
            # Ultralytics pickles the trainer for its DDP workers and would try to pip-install this.
            raise RuntimeError("multi-GPU training needs the 'cloudpickle>=3.1.1' package") from e

    if config.resume_from is None and not config.model.endswith((".yaml", ".yml")):
        # Anything but a model YAML is weights to Ultralytics (".PT" too): checked before it loads.
        check_weights(Path(config.model), sha256=config.model_sha256)

    config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_files(config.checkpoint_dir)

    from ultralytics import YOLO
    from ultralytics.utils import LOGGER

    ignored = sorted(RESERVED_ARGS & config.args.keys())
    if ignored:
        LOGGER.warning(f"train_child: ignoring args set by the worker: {ignored}")
    user_args = {k: v for k, v in config.args.items() if k not in RESERVED_ARGS}

    # Forced for every run: no plots (they fetch fonts), the dataset and the device the
    # scheduler chose; fresh runs also save every epoch into the one folder per job
    # (a resumed run inherits those from its checkpoint).
    forced: dict[str, Any] = {"data": str(config.data), "device": config.device, "plots": False}
    if config.resume_from is not None:
        try:
            check_weights(config.resume_from)
        except WeightsError as exc:
            raise CheckpointError(str(exc)) from exc
        point = inspect_checkpoint(config.resume_from)
        if point.finished:
            return _report_already_finished(config, events, point)
        model = YOLO(str(config.resume_from))
        forced["data"] = ultralytics_data(config.data, model.task)
        # Always the explicit path: a bare resume=True would pick "the latest run" on disk.
        # Resume restores the checkpoint's own args; Ultralytics lets only a few (imgsz,
        # batch, device, workers, ...) be overridden and warns about the rest. `save_dir`
        # is one of them, which keeps the run folder the one the parent chose.
        kwargs = {
            **user_args,
            **forced,
            "resume": str(config.resume_from),
            "save_dir": str(config.run_dir),
        }
    else:
        model = YOLO(config.model, task=config.task)  # task None: inferred from the model
        forced["data"] = ultralytics_data(config.data, model.task)
        kwargs = {
            **user_args,
            **forced,
            "project": str(config.project),
            "name": config.name,
            "exist_ok": True,
            "save": True,
            "resume": False,
        }

    reporter = TrainingReporter(
        events=events,
        checkpoint_dir=config.checkpoint_dir,
        progress_interval_s=config.progress_interval_s,
        stop_file=config.stop_file,
        fault_cuda_oom_above_batch=config.fault_cuda_oom_above_batch,
    )
    reporter.register(model)
    try:
        model.train(**kwargs)
    except Exception as exc:
        exc.yoloportal_batch = reporter.batch_size  # the error event says which batch ran out of memory
        raise

    trainer = model.trainer
    best, last = Path(trainer.best), Path(trainer.last)
    weights = best if best.exists() else last
    events.emit(
        "finished",
        mode="train",
        weights=str(weights),
        last=str(last),
        metrics=_metrics_dict(model.metrics),
        epochs=int(trainer.epochs),
        code=_code_versions(),
        exports=_exports_after_training(config, weights),
    )
    return EXIT_OK


def _code_versions() -> dict[str, str]:
    from worker.model_modes import code_versions

    return code_versions()


def _exports_after_training(config: ChildConfig, weights: Path) -> list[dict[str, Any]]:
    """``export: [onnx]`` in a training spec: each format from the final weights, verified.

    A failed export is reported in its entry (``error``) and does not fail the training.
    """
    if not config.export or not weights.is_file():
        return []
    from worker.model_modes import ExportVerificationFailed, run_export

    images = _verify_images(config)
    entries = []
    for options in config.export:
        try:
            entries.append(run_export(model_path=str(weights), options=dict(options), device=config.device,
                                      data=config.data, verify_images=images,
                                      output_dir=config.project / "export", engine_allowed=config.engine_allowed))
        except ExportVerificationFailed as exc:
            entries.append({"format": options["format"], "error": str(exc), "verification": exc.verification})
        except Exception as exc:  # noqa: BLE001 - reported in the entry, the training itself succeeded
            entries.append({"format": options["format"], "error": f"{type(exc).__name__}: {exc}"[:2000]})
    return entries


def _verify_images(config: ChildConfig) -> list[Path]:
    from worker.model_modes import VERIFY_IMAGES, split_images

    if config.data is None:
        return []
    for split in ("val", "test", "train"):
        try:
            images = split_images(config.data, split)
        except FileNotFoundError:
            continue
        if images:
            return images[:VERIFY_IMAGES]
    return []


def check_weights(path: Path, *, sha256: str = "") -> None:
    """Right before loading a .pt: it still has the recorded hash and passes the checkpoint check."""
    from apps.registry.checkpoint_scan import CheckpointRefused, scan_checkpoint

    if not path.is_file():
        # A missing local file would send Ultralytics looking for it on GitHub.
        raise FileNotFoundError(f"model weights not found: {path}")
    if sha256 and file_sha256(path) != sha256:
        raise WeightsError(f"weights {path.name} changed since the job was submitted (sha256 differs): not loaded")
    try:
        scan_checkpoint(path)
    except CheckpointRefused as exc:
        raise WeightsError(f"weights {path.name} refused before loading: {exc}") from exc


def run_mode(config: ChildConfig, events: EventLog) -> int:
    """val, predict or export (worker.model_modes); emit ``finished`` and return 0, or raise."""
    prepare_environment(config)
    configure_ultralytics(config)
    apply_limits(config)
    from worker import model_modes

    if config.data is not None:
        check_data_yaml(config.data)
    check_weights(Path(config.model), sha256=config.model_sha256)
    output = config.mode_dir
    finished: dict[str, Any] = {"mode": config.mode, "exports": []}
    if config.mode == "val":
        assert config.data is not None
        finished.update(model_modes.run_val(model_path=config.model, data=config.data, split=config.split,
                                            device=config.device, args=dict(config.args), output_dir=output,
                                            events=events))
    elif config.mode == "predict":
        root = config.source or config.data.parent  # type: ignore[union-attr]
        images = model_modes.image_files(config.source) if config.source else \
            model_modes.split_images(config.data, config.split)  # type: ignore[arg-type]
        if not images:
            raise DataConfigError("there are no images to predict on")
        if config.source is None:
            root = _common_root(images)
        finished.update(model_modes.run_predict(model_path=config.model, images=images, source_root=root,
                                                device=config.device, args=dict(config.args),
                                                output_dir=output, events=events))
    else:
        (options,) = config.export
        events.emit("started", mode="export", formats=[options["format"]])
        try:
            entry = model_modes.run_export(model_path=config.model, options=dict(options), device=config.device,
                                           data=config.data, verify_images=_verify_images(config),
                                           output_dir=output, engine_allowed=config.engine_allowed)
        except model_modes.ExportVerificationFailed as exc:
            raise ExportFailed(str(exc), exc.verification) from exc
        finished["exports"] = [entry]
    events.emit("finished", code=_code_versions(), **finished)
    return EXIT_OK


class ExportFailed(Exception):
    def __init__(self, message: str, verification: dict[str, Any]):
        self.verification = verification
        super().__init__(message)


def _common_root(paths: list[Path]) -> Path:
    return Path(os.path.commonpath([str(p.parent) for p in paths]))


def _report_already_finished(config: ChildConfig, events: EventLog, point: ResumePoint) -> int:
    """The attempt died after the final checkpoint: the training itself is done."""
    weights_dir = config.run_dir / "weights"
    best, last = weights_dir / "best.pt", weights_dir / "last.pt"
    assert config.resume_from is not None
    weights = best if best.is_file() else config.resume_from
    events.emit(
        "finished",
        mode="train",
        weights=str(weights),
        last=str(last if last.is_file() else config.resume_from),
        metrics=point.train_metrics,
        epochs=point.epochs,
        resumed_finished_run=True,
        code=_code_versions(),
        exports=_exports_after_training(config, weights),
    )
    return EXIT_OK


def _metrics_dict(metrics: Any) -> dict[str, Any]:
    # Single process: a DetMetrics object; under DDP, the checkpoint's train_metrics dict.
    if metrics is None:
        return {}
    if hasattr(metrics, "results_dict"):
        return dict(metrics.results_dict)
    return dict(metrics) if isinstance(metrics, dict) else {}


def run(config_path: Path) -> int:
    """Load the config, run the mode, and turn every failure into an error event + exit code."""
    try:
        raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ConfigError("config must be a JSON object")
    except (OSError, ValueError, ConfigError) as e:
        print(f"train_child: cannot read config {config_path}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    events_path = raw.get("events_path")
    events = EventLog(Path(events_path)) if isinstance(events_path, str) and os.path.isabs(events_path) else None
    try:
        config = ChildConfig.from_dict(raw)
        config.events_path.parent.mkdir(parents=True, exist_ok=True)
        log = EventLog(config.events_path)
        return train(config, log) if config.mode == "train" else run_mode(config, log)
    except ConfigError as e:
        print(f"train_child: bad config: {e}", file=sys.stderr)
        if events is not None:
            _emit_error(events, "config", str(e), "Bug in the worker: the child config is invalid.", e)
        return EXIT_CONFIG
    except StopRequested as e:
        print(f"train_child: {e}", file=sys.stderr)
        return EXIT_STOPPED
    except Exception as e:
        kind, advice = classify_error(e)
        traceback.print_exc()
        if events is not None:
            extra = {"verification": e.verification} if isinstance(e, ExportFailed) else {}
            if kind == "oom" and _is_cuda_oom(e):
                extra["cuda"] = True
            if getattr(e, "yoloportal_batch", None) is not None:
                extra["batch"] = e.yoloportal_batch
            _emit_error(events, kind, str(e), advice, e, **extra)
        return EXIT_CHECKPOINT if kind == "checkpoint" else EXIT_FAILED


def _emit_error(events: EventLog, kind: str, message: str, advice: str, exc: BaseException, **extra: Any) -> None:
    with contextlib.suppress(OSError):  # nothing more to do if even the events file is gone
        events.emit(
            "error",
            kind=kind,
            message=message[:4000],
            advice=advice,
            traceback="".join(traceback.format_exception(exc))[-20000:],
            **extra,
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m worker.train_child CONFIG.json", file=sys.stderr)
        return EXIT_CONFIG
    return run(Path(argv[0]))


if __name__ == "__main__":
    # Run the importable module's main rather than this __main__ copy, so the callbacks
    # Ultralytics cloudpickles into DDP workers refer to `worker.train_child` by name.
    from worker.train_child import main as _main

    sys.exit(_main())

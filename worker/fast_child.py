"""A training child that trains nothing: for the scheduler stress tests only.

``python -m worker.fast_child CONFIG.json`` reads the same config as ``worker.train_child``
and follows the same event contract (see that module's docstring): ``started``,
``progress``, ``epoch`` with metric values, a real fsynced ``checkpoint`` file with its
sidecar per epoch (so a requeued attempt resumes from it), ``finished`` with a weights
file, exit 0. It never imports torch or Ultralytics, so hundreds of jobs run through the
real scheduler, RQ, work-horses and monitors in minutes on a CPU-only machine.

The GPU worker uses it instead of Ultralytics when ``YOLOPORTAL_FAST_TRAINER=1`` is in its
environment (worker.tasks.AttemptRunner.spawn): set by the stress tests, never in a real
installation. ``FAST_TRAINER_EPOCH_S`` (default 0.2) is the time one epoch takes.

Its ``metrics/mAP50-95(B)`` depends on ``lr0`` (:func:`fake_quality`: best at 0.01, lower a
decade away on either side) and grows linearly to that quality at the last epoch, so a sweep
run on it (tests/integration/test_sweeps_live.py) has something to find and trials to prune.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from worker.train_child import (
    EXIT_CHECKPOINT,
    EXIT_CONFIG,
    EXIT_OK,
    ChildConfig,
    ConfigError,
    EventLog,
    copy_checkpoint,
    prune_checkpoints,
)


def resume_epoch(checkpoint: Path) -> int:
    """The epoch a checkpoint holds (its sidecar says), or -1 if it is unusable."""
    sidecar = checkpoint.with_suffix(".json")
    try:
        return int(json.loads(sidecar.read_text())["epoch"]) if checkpoint.is_file() else -1
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def fake_quality(lr0: float) -> float:
    """1.0 at lr0 = 0.01, 0.5 a decade away (0.001 or 0.1), 1/3 two decades away."""
    return 1.0 / (1.0 + abs(math.log10(max(lr0, 1e-12) / 0.01)))


def run(config_path: Path) -> int:
    try:
        config = ChildConfig.from_dict(json.loads(config_path.read_text()))
    except (OSError, ValueError, ConfigError) as exc:
        print(f"fast_child: bad config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    events = EventLog(config.events_path)
    epochs = int(config.args.get("epochs") or 1)
    epoch_s = float(os.environ.get("FAST_TRAINER_EPOCH_S", "0.2"))
    start = 1
    if config.resume_from is not None:
        done = resume_epoch(config.resume_from)
        if done < 1:
            events.emit("error", kind="checkpoint", message=f"cannot resume from {config.resume_from.name}",
                        advice="an older checkpoint is tried next", traceback="")
            return EXIT_CHECKPOINT
        start = done + 1
    if start > epochs:  # the checkpoint is of the last epoch: nothing left to train
        weights = config.resume_from
        events.emit("finished", weights=str(weights), last=str(weights), metrics={}, epochs=epochs,
                    resumed_finished_run=True)
        return EXIT_OK
    run_dir = config.run_dir / "weights"
    run_dir.mkdir(parents=True, exist_ok=True)
    events.emit("started", epochs=epochs, start_epoch=start, save_dir=str(config.run_dir))
    last = run_dir / "last.pt"
    quality = fake_quality(float(config.args.get("lr0") or 0.01))
    for epoch in range(start, epochs + 1):
        time.sleep(epoch_s)
        loss = round(1.0 / epoch, 4)
        events.emit("progress", epoch=epoch, batch=1, batches=1,
                    losses={"box_loss": loss, "cls_loss": loss, "dfl_loss": loss})
        events.emit("epoch", epoch=epoch, epochs=epochs,
                    values={"train/box_loss": loss, "metrics/mAP50(B)": round(1 - loss / 2, 4), "fitness": 0.0,
                            "metrics/mAP50-95(B)": round(quality * epoch / epochs, 6)})
        last.write_bytes(f"fast trainer weights, epoch {epoch}\n".encode() * 64)
        info = copy_checkpoint(last, config.checkpoint_dir, epoch)
        events.emit("checkpoint", epoch=epoch, path=str(info.path), sha256=info.sha256, size=info.size)
        prune_checkpoints(config.checkpoint_dir)
    best = run_dir / "best.pt"
    best.write_bytes(last.read_bytes() if last.exists() else b"fast trainer weights\n")
    events.emit("finished", weights=str(best), last=str(last), epochs=epochs,
                metrics={"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": round(quality, 6)})
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m worker.fast_child CONFIG.json", file=sys.stderr)
        return EXIT_CONFIG
    return run(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())

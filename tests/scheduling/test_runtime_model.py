"""The runtime model: fitted over finished jobs, scaled by what differs, never the timeout."""

from __future__ import annotations

import math
import random

import pytest

from apps.scheduling.policy.runtime_model import RunFeatures, RuntimeModel, model_scale, remaining_from_epochs


def test_no_finished_job_means_no_model() -> None:
    assert RuntimeModel.fit([]) is None


def test_one_finished_job_predicts_its_twin_and_scales_by_epochs_and_imgsz() -> None:
    """With one sample the intercept fits it; epochs and imgsz scale it by the prior exponents."""
    seen = RunFeatures(epochs=30, images=200, imgsz=128, scale=1.0)
    model = RuntimeModel.fit([(seen, 60.0)])
    assert model.predict(seen) == pytest.approx(60.0, rel=0.15)
    assert model.predict(RunFeatures(epochs=60, images=200, imgsz=128, scale=1.0)) == pytest.approx(
        2 * model.predict(seen), rel=0.2
    )
    assert model.predict(RunFeatures(epochs=30, images=200, imgsz=256, scale=1.0)) > 3 * model.predict(seen)


def test_many_finished_jobs_learn_the_law_and_its_spread() -> None:
    """Runtimes ∝ epochs × images with 20% noise: predictions land near the law, sigma near 0.2."""
    rng = random.Random(3)
    samples = []
    for _ in range(200):
        f = RunFeatures(epochs=rng.choice((10, 30, 100)), images=rng.choice((100, 1000, 5000)), imgsz=640)
        samples.append((f, 0.05 * f.epochs * f.images * math.exp(rng.gauss(0, 0.2))))
    model = RuntimeModel.fit(samples)
    probe = RunFeatures(epochs=50, images=2000, imgsz=640)
    assert model.predict(probe) == pytest.approx(0.05 * 50 * 2000, rel=0.15)
    assert 0.15 <= model.sigma <= 0.3


def test_model_scale_is_read_from_the_model_name() -> None:
    assert model_scale("yolov8n.yaml") == 1.0
    assert model_scale("yolov8x.pt") > model_scale("yolo11m.yaml") > model_scale("yolov8s.yaml")
    assert model_scale("custom-net.pt") == model_scale(None)


def test_a_running_job_finishes_at_its_own_epoch_rate() -> None:
    assert remaining_from_epochs(30, 10, 5, 100.0) == pytest.approx(20 * 20.0)
    assert remaining_from_epochs(30, 0, 0, 0.0) is None

"""The runtime model: fitted over finished jobs, scaled by what differs, never the timeout."""

from __future__ import annotations

import math
import random

import pytest

from apps.scheduling.policy.runtime_model import (
    EpochTiming,
    RunFeatures,
    RuntimeModel,
    model_scale,
    remaining_from_epochs,
)


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


def test_the_overhead_measured_outside_epochs_is_added_not_scaled() -> None:
    """Tiny runs of 20 s overhead (12 s before the first epoch, 8 s after the last) and 0.5 s
    epochs: a 40-epoch twin is 20 + 40 × 0.5 s, and one at 4× the images costs 4× per epoch
    only (the overhead stays 20 s)."""
    tiny = [(RunFeatures(epochs=e, images=16, imgsz=64, scale=1.0), 20.0 + 0.5 * e, EpochTiming(0.5, 12.0, 8.0))
            for e in (3, 5, 10, 30)]
    model = RuntimeModel.fit(tiny)
    assert (model.overhead_s, model.start_s, model.end_s) == (20.0, 12.0, 8.0)
    assert model.predict(RunFeatures(epochs=40, images=16, imgsz=64, scale=1.0)) == pytest.approx(40.0, rel=0.01)
    assert model.predict(RunFeatures(epochs=40, images=64, imgsz=64, scale=1.0)) == pytest.approx(
        20.0 + 4 * 20.0, rel=0.1)


def test_runs_without_epoch_times_count_their_runtime_less_the_overhead_as_epochs() -> None:
    timed = (RunFeatures(epochs=10, images=16, imgsz=64), 25.0, EpochTiming(0.5, 12.0, 8.0))
    untimed = (RunFeatures(epochs=10, images=16, imgsz=64), 25.0)
    model = RuntimeModel.fit([timed, untimed])
    assert model.predict(RunFeatures(epochs=10, images=16, imgsz=64)) == pytest.approx(25.0, rel=0.01)


def test_a_requeued_job_pays_the_overhead_again_for_the_epochs_it_has_left() -> None:
    model = RuntimeModel.fit([(RunFeatures(epochs=10, images=16, imgsz=64), 25.0, EpochTiming(0.5, 12.0, 8.0))])
    x = RunFeatures(epochs=10, images=16, imgsz=64).vector()
    assert model.predict_vector(x, 4) == pytest.approx(20.0 + 4 * 0.5, rel=0.01)


def test_a_running_jobs_rate_is_measured_between_epoch_ends_and_the_usual_end_is_added() -> None:
    """12 s of start-up, then epochs of 0.5 s: after 3 epochs (13.5 s, 1 s between the first
    and last end), 37 × 0.5 s + the usual 8 s are left; after one epoch 14 s in, the usual
    12 s of start-up are taken off it (2 s an epoch)."""
    model = RuntimeModel.fit([(RunFeatures(epochs=10, images=16, imgsz=64), 25.0, EpochTiming(0.5, 12.0, 8.0))])
    assert remaining_from_epochs(40, 3, 3, 13.5, seconds_between=1.0, model=model) == pytest.approx(37 * 0.5 + 8)
    assert remaining_from_epochs(40, 1, 1, 14.0, seconds_between=0.0, model=model) == pytest.approx(39 * 2.0 + 8)


def test_a_slow_first_epoch_is_weighed_against_its_shapes_per_epoch_time() -> None:
    """One epoch done 20 s in, where its shape's runs had 12 s of start-up and 0.5 s epochs: the
    7.5 s beyond them are shared by the variances of start-up and epoch (each ∝ its size), so
    the epoch is ~0.51 s and 39 × 0.51 + 8 s are left, not 39 × 8 + 8 s (the excess all epoch)."""
    shape = RunFeatures(epochs=10, images=16, imgsz=64)
    model = RuntimeModel.fit([(shape, 25.0, EpochTiming(0.5, 12.0, 8.0))])
    x = RunFeatures(epochs=40, images=16, imgsz=64).vector()
    weight = 0.5**2 / (12.0**2 + 0.5**2)
    blended = (1 - weight) * 0.5 + weight * (20.0 - 12.0)
    assert remaining_from_epochs(40, 1, 1, 20.0, seconds_between=0.0, model=model, x=x) == pytest.approx(
        39 * blended + 8)
    assert 39 * blended + 8 < 30.0


def test_a_first_epoch_much_longer_than_the_start_up_is_mostly_taken_as_measured() -> None:
    """5 min epochs behind 12 s of start-up: a first epoch of 400 s is hardly a start-up delay."""
    shape = RunFeatures(epochs=10, images=5000, imgsz=1280)
    model = RuntimeModel.fit([(shape, 3020.0, EpochTiming(300.0, 12.0, 8.0))])
    left = remaining_from_epochs(10, 1, 1, 412.0, model=model, x=shape.vector())
    assert 9 * 390.0 + 8 <= left <= 9 * 400.0 + 8


def test_with_two_epochs_or_an_unseen_shape_the_first_epoch_is_not_blended() -> None:
    """Two epochs: the rate between their ends alone (8 s, however fast the shape was); one epoch
    of a shape no run had: that epoch less the usual start-up, as before."""
    model = RuntimeModel.fit([(RunFeatures(epochs=10, images=16, imgsz=64), 25.0, EpochTiming(0.5, 12.0, 8.0))])
    x = RunFeatures(epochs=40, images=16, imgsz=64).vector()
    assert remaining_from_epochs(40, 2, 2, 28.0, seconds_between=8.0, model=model, x=x) == pytest.approx(38 * 8.0 + 8)
    assert remaining_from_epochs(40, 3, 3, 13.5, seconds_between=1.0, model=model, x=x) == pytest.approx(37 * 0.5 + 8)
    unseen = RunFeatures(epochs=40, images=16, imgsz=96).vector()
    assert remaining_from_epochs(40, 1, 1, 20.0, model=model, x=unseen) == pytest.approx(39 * 8.0 + 8)
    assert remaining_from_epochs(40, 1, 1, 20.0, model=model) == pytest.approx(39 * 8.0 + 8)


def test_a_shape_that_ran_before_takes_its_own_per_epoch_time_and_the_spread_is_out_of_sample() -> None:
    """Epochs of 0.5 s where the law of the other shapes says less: a 40-epoch run of that
    shape is 20 + 40 × 0.5 s; runs of a shape run once are predicted by the fit when the
    spread is measured (not by themselves, which would leave no spread)."""
    odd = RunFeatures(epochs=10, images=16, imgsz=64)
    others = [(RunFeatures(epochs=10, images=i, imgsz=640), 20.0 + 10 * 0.001 * i * (1.3 if k % 2 else 0.7),
               EpochTiming(0.001 * i * (1.3 if k % 2 else 0.7), 12.0, 8.0)) for k, i in enumerate((500, 1000, 2000, 4000))]
    model = RuntimeModel.fit([(odd, 25.0, EpochTiming(0.5, 12.0, 8.0)), *others])
    assert model.predict(RunFeatures(epochs=40, images=16, imgsz=64)) == pytest.approx(40.0, rel=0.01)
    assert model.sigma > 0.1

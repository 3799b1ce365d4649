"""How long a training job will take: a fixed overhead plus epochs × a fitted per-epoch time.

Not an exact-signature match (a job nobody ran before would have no estimate, and one that
differs only in epochs would not learn from its twin): the runtime is modelled as

    runtime = overhead + epochs · exp(b0 + b2·log(images) + b3·log(imgsz / 640)
                                      + b4·log(model scale) + b5·log(GPUs))

The overhead (process start, imports, dataset scan before the first epoch; final
validation and weights upload after the last) is the median of what finished runs spent
outside their epochs, measured from their epochs' report times. It is *not* scaled by what
differs: a log-linear fit of whole runtimes scaled it with the rest, and with a dozen tiny
CPU jobs — mostly overhead — it predicted ~5 s for a 40-epoch job that took ~30 s, less
than a 5-epoch twin had taken (trial 18, P7). The per-epoch time is fitted by ridge
regression *toward a prior* (one epoch costs time proportional to the images seen, imgsz²,
the model's FLOPs; more GPUs help sub-linearly). With one finished job the intercept fits
it and the exponents stay at the prior — "scaled by what differs"; with many, the data
win. A run whose epochs were not timed counts its runtime less the overhead as epochs. The
residual spread of log runtime is the estimate's error (``sigma``), which the ETA ranges
use. With no finished job at all there is no model: the caller uses the spec's
``expected_duration`` or the stated default (``types.DEFAULT_RUNTIME_S``) — never the
timeout.

A running job's remaining time does not come from here but from its own epoch rate
(:func:`remaining_from_epochs`) once it has finished an epoch — after only one, weighed
against its shape's per-epoch time from here — plus the usual time after the last epoch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

# GFLOPs of the YOLOv8 detection models relative to the nano one (n 8.7, s 28.6, m 78.9,
# l 165.2, x 257.8); YOLO11 and other generations scale alike.
MODEL_SCALE = {"n": 1.0, "s": 3.3, "m": 9.1, "l": 19.0, "x": 29.6}
UNKNOWN_SCALE = 3.3
TYPICAL_IMAGES = 1000.0
# Prior coefficients of log seconds per epoch: intercept (an epoch of 1,000 images at 640
# on one GPU with the nano model: ~30 s), then the exponents of images, imgsz, model scale
# and GPUs described above.
PRIOR = (math.log(30.0 / TYPICAL_IMAGES), 1.0, 2.0, 1.0, -0.8)
PRIOR_WEIGHT = (0.01, 4.0, 4.0, 4.0, 4.0)  # pseudo-observations per coefficient
DEFAULT_SIGMA = 0.7  # error of a prediction from very few samples (lognormal sigma)


def model_scale(model: str | None) -> float:
    """Relative compute of a model from its name (``yolov8s.yaml``, ``yolo11m.pt``), else a middle guess."""
    if not model:
        return UNKNOWN_SCALE
    match = re.search(r"yolo(?:v?\d+)([nsmlx])(?:[-_.]|$)", model.lower())
    return MODEL_SCALE[match.group(1)] if match else UNKNOWN_SCALE


@dataclass(frozen=True)
class RunFeatures:
    """What decides how long a training run takes."""

    epochs: float
    images: float = TYPICAL_IMAGES  # training images seen per epoch (dataset size × fraction)
    imgsz: float = 640.0
    scale: float = UNKNOWN_SCALE  # model compute relative to a nano model
    gpus: float = 1.0  # a share of one GPU counts as that share

    def vector(self) -> tuple[float, ...]:
        return (
            1.0,
            math.log(max(self.epochs, 1.0)),
            math.log(max(self.images, 1.0)),
            math.log(max(self.imgsz, 32.0) / 640.0),
            math.log(max(self.scale, 0.1)),
            math.log(max(self.gpus, 0.05)),
        )


@dataclass(frozen=True)
class EpochTiming:
    """How one finished run spent its time, from its epochs' report times (its last attempt)."""

    per_epoch: float  # seconds from one epoch's end to the next one's
    start: float  # from the attempt's start to its first epoch's start (process, imports, dataset scan)
    end: float  # from the last epoch's end to the run's end (final validation, weights upload)


@dataclass(frozen=True)
class RuntimeModel:
    """runtime = ``overhead_s`` + epochs × per-epoch time (see the module)."""

    coefficients: tuple[float, ...]  # log seconds per epoch over rate_vector(features.vector())
    sigma: float  # residual spread of log runtime (the estimate's lognormal error)
    samples: int
    overhead_s: float = 0.0  # fixed seconds of a run: start + end
    start_s: float = 0.0  # of which before the first epoch
    end_s: float = 0.0  # of which after the last epoch
    # The mean log seconds per epoch of finished runs of each shape (rate_key): what the
    # same data, imgsz, model and GPUs took beats the fit, which extrapolates.
    observed: Mapping[tuple[float, ...], float] = field(default_factory=dict)

    @classmethod
    def fit(
        cls, samples: Iterable[tuple[RunFeatures, float] | tuple[RunFeatures, float, EpochTiming | None]]
    ) -> RuntimeModel | None:
        """Fixed overhead and per-epoch time from finished runs; None without any.

        1. The overhead: the median start and end of the runs whose epochs were timed
           (0 when none was: every second is then counted as epochs).
        2. Each run's per-epoch time: measured between its epoch ends, else its runtime
           less the overhead (at least 5 % of it) over its epochs.
        3. Log per-epoch time fitted by ridge regression toward :data:`PRIOR` (no epochs
           term: runtime is linear in epochs by construction), and its mean kept for
           each shape that ran (a run of a shape that ran before takes their geometric mean).
        4. ``sigma``: the spread of log runtime around the prediction, each run predicted
           without itself among the runs of its shape (else every run of a shape run once
           would predict itself: no spread at all).
        """
        rows = [(s[0], s[1], s[2] if len(s) > 2 else None) for s in samples]
        if not rows:
            return None
        timed = [t for _, _, t in rows if t is not None]
        start = _median([t.start for t in timed]) if timed else 0.0
        end = _median([t.end for t in timed]) if timed else 0.0
        overhead = start + end
        rates = []
        for f, runtime, timing in rows:
            epochs = max(f.epochs, 1.0)
            per_epoch = timing.per_epoch if timing is not None else max(runtime - overhead, 0.05 * runtime) / epochs
            rates.append((rate_vector(f.vector()), math.log(max(per_epoch, 1e-3))))
        shapes: dict[tuple[float, ...], list[float]] = {}
        for x, y in rates:
            shapes.setdefault(rate_key(x), []).append(y)
        fitted = cls(tuple(_ridge(rates, PRIOR, PRIOR_WEIGHT)), DEFAULT_SIGMA, len(rows), overhead, start, end)
        model = replace(fitted, observed={key: sum(ys) / len(ys) for key, ys in shapes.items()})
        n = len(rows)
        if n >= 5:
            residuals = []
            for (f, runtime, _), (x, y) in zip(rows, rates, strict=True):
                others = list(shapes[rate_key(x)])
                others.remove(y)
                per_epoch = math.exp(sum(others) / len(others)) if others else fitted.per_epoch(f.vector())
                residuals.append(math.log(max(runtime, 1.0)) - math.log(max(overhead + f.epochs * per_epoch, 1.0)))
            sigma = math.sqrt(sum(r * r for r in residuals) / (n - 1))
            model = replace(model, sigma=max(0.1, sigma * math.sqrt(1.0 + 1.0 / n)))
        return model

    def per_epoch(self, x: Sequence[float]) -> float:
        """Seconds per epoch of the run whose ``RunFeatures.vector()`` is ``x``."""
        seen = self.observed_per_epoch(x)
        if seen is not None:
            return seen
        return math.exp(sum(c * xi for c, xi in zip(self.coefficients, rate_vector(x), strict=True)))

    def observed_per_epoch(self, x: Sequence[float]) -> float | None:
        """Seconds per epoch that finished runs of this shape took (their geometric mean), None if none ran."""
        seen = self.observed.get(rate_key(rate_vector(x)))
        return math.exp(seen) if seen is not None else None

    def predict(self, features: RunFeatures) -> float:
        """Median runtime in seconds."""
        return self.predict_vector(features.vector())

    def predict_vector(self, x: Sequence[float], epochs: float | None = None) -> float:
        """``predict`` of the features whose ``vector()`` is ``x``; ``epochs``: only that many
        of them (a requeued job's epochs left; the overhead is paid again)."""
        epochs = math.exp(x[1]) if epochs is None else epochs
        return self.overhead_s + epochs * self.per_epoch(x)


def rate_vector(x: Sequence[float]) -> tuple[float, ...]:
    """``RunFeatures.vector()`` without the epochs term: what one epoch's time depends on."""
    return (x[0], *x[2:])


def rate_key(rx: Sequence[float]) -> tuple[float, ...]:
    """A run's shape (its ``rate_vector``) as a key: the same inputs, the same key."""
    return tuple(round(v, 9) for v in rx)


def remaining_from_epochs(
    epochs_total: int,
    epochs_done: int,
    epochs_this_attempt: int,
    seconds_this_attempt: float,
    *,
    seconds_between: float | None = None,
    model: RuntimeModel | None = None,
    x: Sequence[float] | None = None,
) -> float | None:
    """A running job's remaining seconds from its own epoch rate in this attempt, or None before its first epoch.

    ``seconds_this_attempt``: from the attempt's start to its last epoch's end;
    ``seconds_between``: from its first epoch's end to its last one's; ``x``: the job's
    ``RunFeatures.vector()``. The usual time after the last epoch (``model.end_s``: final
    validation, upload) is added to epochs left × a per-epoch time:

    1. Two epochs or more: measured between epoch ends (the start-up is not an epoch).
    2. One epoch: ``seconds_this_attempt`` = this attempt's start-up + one epoch, two
       unknowns. History expects ``model.start_s`` + ``p`` (``p``: what finished runs of
       this shape took an epoch); the excess (warm-up, caching, AMP checks beyond the
       usual, or a slower epoch) is shared between start-up and epoch in proportion to
       their variances, taken as equally uncertain relative to their size (the model's
       errors are lognormal). So the epoch is the weighted mean of ``p`` and the measured
       first epoch less the start-up, the measurement weighing p² / (start_s² + p²): a
       0.15 s epoch behind 12 s of start-up is all but ``p``, a 5 min epoch all but
       the measurement. (The measurement alone put the ETAs queued behind such a job at
       3–6x what they read one epoch later on ``make run``.)
    3. One epoch of a shape no finished run had (or no model, or no ``x``): the measured
       first epoch less the start-up, at least 5 % of it.
    """
    if epochs_this_attempt <= 0 or seconds_this_attempt <= 0:
        return None
    start = model.start_s if model else 0.0
    end = model.end_s if model else 0.0
    if epochs_this_attempt >= 2 and seconds_between:
        per_epoch = seconds_between / (epochs_this_attempt - 1)
    else:
        per_epoch = max(seconds_this_attempt - start, 0.05 * seconds_this_attempt) / epochs_this_attempt
        usual = model.observed_per_epoch(x) if model and x is not None and epochs_this_attempt == 1 else None
        if usual is not None:
            weight = usual * usual / (start * start + usual * usual)
            per_epoch = (1.0 - weight) * usual + weight * per_epoch
    return max(0.0, epochs_total - epochs_done) * per_epoch + end


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _ridge(rows: Sequence[tuple[Sequence[float], float]], prior: Sequence[float], weight: Sequence[float]) -> list[float]:
    """Ridge regression toward ``prior``: (XᵀX + Λ) b = Xᵀy + Λ p, Λ = diag(``weight``)."""
    k = len(prior)
    a = [[weight[i] if i == j else 0.0 for j in range(k)] for i in range(k)]
    b = [weight[i] * prior[i] for i in range(k)]
    for x, y in rows:
        for i in range(k):
            b[i] += x[i] * y
            for j in range(k):
                a[i][j] += x[i] * x[j]
    return _solve(a, b)


def _solve(a: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a small dense system)."""
    n = len(b)
    m = [list(row) + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                if factor:
                    for c in range(col, n + 1):
                        m[r][c] -= factor * m[col][c]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-12 else 0.0 for i in range(n)]

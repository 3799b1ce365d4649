"""How long a training job will take: a small log-linear model fitted over finished jobs.

Not an exact-signature match (a job nobody ran before would have no estimate, and one that
differs only in epochs would not learn from its twin): the runtime is modelled as

    log(runtime) = b0 + b1·log(epochs) + b2·log(images) + b3·log(imgsz / 640)
                   + b4·log(model scale) + b5·log(GPUs)

and fitted by ridge regression *toward a prior* (one epoch costs time proportional to the
images seen, imgsz², the model's FLOPs; more GPUs help sub-linearly). With one finished
job the intercept fits it and the exponents stay at the prior — "scaled by what differs";
with many, the data win. The residual spread is the estimate's error (``sigma``), which
the ETA ranges use. With no finished job at all there is no model: the caller uses the
spec's ``expected_duration`` or the stated default (``types.DEFAULT_RUNTIME_S``) — never
the timeout.

A running job's remaining time does not come from here but from its own epoch rate
(:func:`remaining_from_epochs`) once it has finished an epoch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# GFLOPs of the YOLOv8 detection models relative to the nano one (n 8.7, s 28.6, m 78.9,
# l 165.2, x 257.8); YOLO11 and other generations scale alike.
MODEL_SCALE = {"n": 1.0, "s": 3.3, "m": 9.1, "l": 19.0, "x": 29.6}
UNKNOWN_SCALE = 3.3
TYPICAL_IMAGES = 1000.0
# Prior coefficients: intercept (log seconds per epoch of 1,000 images at 640 on one GPU
# with the nano model: ~30 s), then the exponents described above.
PRIOR = (math.log(30.0 / TYPICAL_IMAGES), 1.0, 1.0, 2.0, 1.0, -0.8)
PRIOR_WEIGHT = (0.01, 4.0, 4.0, 4.0, 4.0, 4.0)  # pseudo-observations per coefficient
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
class RuntimeModel:
    coefficients: tuple[float, ...]
    sigma: float  # residual spread of log runtime (the estimate's lognormal error)
    samples: int

    @classmethod
    def fit(cls, samples: Iterable[tuple[RunFeatures, float]]) -> RuntimeModel | None:
        """Ridge regression of log runtime toward :data:`PRIOR`; None without any sample."""
        rows = [(f.vector(), math.log(max(runtime, 1.0))) for f, runtime in samples]
        if not rows:
            return None
        k = len(PRIOR)
        # Normal equations with the prior as pseudo-observations: (XᵀX + Λ) b = Xᵀy + Λ p.
        a = [[PRIOR_WEIGHT[i] if i == j else 0.0 for j in range(k)] for i in range(k)]
        b = [PRIOR_WEIGHT[i] * PRIOR[i] for i in range(k)]
        for x, y in rows:
            for i in range(k):
                b[i] += x[i] * y
                for j in range(k):
                    a[i][j] += x[i] * x[j]
        coefficients = _solve(a, b)
        residuals = [y - sum(c * xi for c, xi in zip(coefficients, x, strict=True)) for x, y in rows]
        n = len(rows)
        if n >= 5:
            sigma = math.sqrt(sum(r * r for r in residuals) / (n - 1))
            sigma = max(0.1, sigma * math.sqrt(1.0 + 1.0 / n))
        else:
            sigma = DEFAULT_SIGMA
        return cls(tuple(coefficients), sigma, n)

    def predict(self, features: RunFeatures) -> float:
        """Median runtime in seconds."""
        return self.predict_vector(features.vector())

    def predict_vector(self, x: Sequence[float]) -> float:
        """``predict`` of the features whose ``vector()`` is ``x``."""
        return math.exp(sum(c * xi for c, xi in zip(self.coefficients, x, strict=True)))


def remaining_from_epochs(
    epochs_total: int, epochs_done: int, epochs_this_attempt: int, seconds_this_attempt: float
) -> float | None:
    """A running job's remaining seconds from its own epoch rate in this attempt, or None before its first epoch."""
    if epochs_this_attempt <= 0 or seconds_this_attempt <= 0:
        return None
    per_epoch = seconds_this_attempt / epochs_this_attempt
    return max(0.0, epochs_total - epochs_done) * per_epoch


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

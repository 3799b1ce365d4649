"""The training child's other modes: val, predict and export (with its verification).

Called by :func:`worker.train_child.run` after the same setup as training (offline
Ultralytics, the checkpoint check, the device the scheduler chose); they report through
the same event contract (see the ``worker.train_child`` docstring). No Django here, and
torch/ultralytics are imported inside the functions only.

Export verification, the point of an export job: the exported file is loaded with its own
runtime (onnxruntime for ONNX, ``torch.jit`` for TorchScript, Ultralytics' AutoBackend
for a TensorRT engine) and run on a few validation images; its *raw output tensors* are
compared with those of the PyTorch model Ultralytics traced (``Exporter.model``, the
fused model with its head in export mode) on the same letterboxed inputs. Boxes alone
prove nothing when a tiny model detects nothing. Stored with the export:

- ``max_abs``: max |exported − pytorch| over every output element of every image;
- ``max_rel``: ``max_abs`` divided by the largest |pytorch| value (relative to the
  output's range; per-element ratios explode near zero);
- ``passed``: every element within ``atol + rtol·|pytorch|`` (numpy ``allclose``), with
  the tolerance for the precision: FP32 ``rtol=atol=1e-3``, FP16 ``1e-2``, INT8 ``0.1``
  (stated in :data:`TOLERANCES`). An export that fails it fails the job.

A classify model's output (its head in export mode) is each image's class probabilities (softmax);
its inputs are the images as Ultralytics' classify predictor feeds them (resized, centre-cropped,
``classify_transforms``), not letterboxed. The same element-wise tolerance applies to the
probabilities, and each image's top-1 class must be the same: ``top1_same`` counts the images whose
top-1 agrees; a different top-1 fails unless PyTorch's two likeliest classes are within the
tolerance of each other (a tie either runtime may break its own way; ``top1_ties`` counts those).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
VERIFY_IMAGES = 4
# precision → (rtol, atol) for the raw-output comparison
TOLERANCES = {"fp32": (1e-3, 1e-3), "fp16": (1e-2, 1e-2), "int8": (0.1, 0.1)}


class ExportVerificationFailed(Exception):
    def __init__(self, message: str, verification: dict[str, Any]):
        self.verification = verification
        super().__init__(message)


# --- shared helpers --------------------------------------------------------------------------------


def code_versions() -> dict[str, str]:
    """python / torch / ultralytics / onnx(runtime) versions, recorded in lineage."""
    import platform

    import torch
    import ultralytics

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "ultralytics": ultralytics.__version__}
    # From the installed metadata, not an import: importing onnxruntime writes a telemetry
    # device id under $XDG_CACHE_HOME (else $HOME/.cache), and training needs neither module.
    from importlib.metadata import PackageNotFoundError, version

    for name in ("onnx", "onnxruntime"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return versions


def split_images(data_yaml: Path, split: str) -> list[Path]:
    """The image files of a dataset split (the YAML's folder is the root when it has no ``path``)."""
    import yaml

    document = yaml.safe_load(data_yaml.read_text(encoding="utf-8")) or {}
    base = Path(document["path"]) if document.get("path") else data_yaml.parent
    value = document.get(split)
    if not value:
        raise FileNotFoundError(f"the dataset has no {split!r} split")
    folders = value if isinstance(value, list) else [value]
    images: list[Path] = []
    for folder in folders:
        images.extend(image_files(base / folder))
    return images


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _names(model: Any) -> dict[int, str]:
    names = getattr(model, "names", None) or {}
    return {int(k): str(v) for k, v in (names.items() if isinstance(names, dict) else enumerate(names))}


CPU_HALF_NOTE = "half precision needs a GPU: ran FP32"


def cpu_half_note(device: str, args: dict[str, Any]) -> str:
    """On a CPU (a simulated node) Ultralytics runs FP32 whatever ``half`` says, silently, while
    the job's spec records half: the job says so once (its log and its "started" event). ``half``
    leaves ``args``. '' on a GPU, or without half."""
    if device != "cpu" or not args.pop("half", False):
        return ""
    print(f"{CPU_HALF_NOTE} (this node's GPUs are simulated on the CPU)", flush=True)
    return CPU_HALF_NOTE


# --- val -------------------------------------------------------------------------------------------


def run_val(*, model_path: str, data: Path, split: str, device: str, args: dict[str, Any], output_dir: Path,
            events) -> dict[str, Any]:
    """Validate; return the ``finished`` fields: metrics, per_class, speed, split."""
    from ultralytics import YOLO

    from worker.train_child import ultralytics_data

    model = YOLO(model_path)
    note = cpu_half_note(device, args)
    events.emit("started", mode="val", split=split, **({"note": note} if note else {}))
    # A classify model reads the dataset's folder.
    metrics = model.val(data=ultralytics_data(data, model.task), split=split, device=device, plots=False,
                        project=str(output_dir),
                        name="val", exist_ok=True, **args)
    names = _names(metrics) or _names(model)
    per_class = []
    # The task's own figures per class: a segment model's masks (``seg``), a pose model's keypoints
    # (``pose``), else its boxes. ``box`` alone gave a segment model's per-class box mAP under the
    # same headings as its mask mAP (trial21).
    box = getattr(metrics, "box", None)
    own, of = box, "box"
    for attribute, name in (("seg", "mask"), ("pose", "keypoints")):
        if getattr(metrics, attribute, None) is not None:
            own, of = getattr(metrics, attribute), name
    counts = getattr(metrics, "nt_per_class", None)
    image_counts = getattr(metrics, "nt_per_image", None)
    if own is not None and getattr(box, "ap_class_index", None) is not None:
        for i, cls in enumerate(box.ap_class_index):
            precision, recall, map50, map50_95 = own.class_result(i)
            per_class.append({
                "class": int(cls), "name": names.get(int(cls), str(cls)), "of": of,
                "images": int(image_counts[int(cls)]) if image_counts is not None else None,
                "instances": int(counts[int(cls)]) if counts is not None else None,
                "precision": float(precision), "recall": float(recall), "map50": float(map50),
                "map50_95": float(map50_95)})
    if box is None and model.task == "classify":
        per_class = classify_per_class(metrics.confusion_matrix.matrix, names)
    return {"metrics": dict(metrics.results_dict), "per_class": per_class, "split": split,
            "speed": dict(getattr(metrics, "speed", {}) or {})}


def classify_per_class(matrix, names: dict[int, str]) -> list[dict[str, Any]]:
    """A classifier's per-class rows from the confusion matrix its validator computed.

    Ultralytics reports only overall top-1/top-5 accuracy for classify; its confusion matrix, indexed
    ``[predicted, true]`` and counting each image's top-1 class, has the rest: a class's column sums to
    its images, and the diagonal is those its top-1 got right. ``accuracy`` is that class's top-1
    accuracy (``correct / images``: the recall of the class); ``of: "top1"`` names the figures. A
    classify row has no instances (one label per image), precision or mAP.
    """
    rows = []
    for cls in range(len(matrix)):
        images = int(round(float(matrix[:, cls].sum())))
        correct = int(round(float(matrix[cls, cls])))
        rows.append({"class": cls, "name": names.get(cls, str(cls)), "of": "top1", "images": images,
                     "instances": None, "correct": correct,
                     "accuracy": correct / images if images else None})
    return rows


# --- predict ---------------------------------------------------------------------------------------


def run_predict(*, model_path: str, images: list[Path], source_root: Path, device: str, args: dict[str, Any],
                output_dir: Path, events) -> dict[str, Any]:
    """Annotate every image; write ``<output_dir>/<n>.jpg`` and ``predictions.json``. Returns ``finished`` fields.

    Each image gets a line on stdout (the job's stored log) like Ultralytics' own verbose one:
    Ultralytics prints nothing with ``verbose=False``, which is needed because it counts each
    one-image call as ``image 1/1``, and a predict job's log was otherwise empty.
    """
    import cv2
    from ultralytics import YOLO

    model = YOLO(model_path)
    output_dir.mkdir(parents=True, exist_ok=True)
    note = cpu_half_note(device, args)
    events.emit("started", mode="predict", images=len(images), **({"note": note} if note else {}))
    where = "CPU" if device == "cpu" else f"GPU {device}"
    print(f"predict: {len(images)} image{'s' * (len(images) != 1)} with {Path(model_path).name} on {where}", flush=True)
    names = _names(model)
    results_out: list[dict[str, Any]] = []
    total_boxes = 0
    line_width = args.pop("line_width", None)
    last_progress = 0.0
    for index, image in enumerate(images):
        (result,) = model.predict(str(image), device=device, save=False, verbose=False, **args)
        annotated = result.plot(line_width=line_width)
        out_name = f"{index:05d}.jpg"
        cv2.imwrite(str(output_dir / out_name), annotated)
        boxes = []
        if result.boxes is not None:
            # A segment model's masks and a pose model's keypoints go with their boxes, in pixels of
            # the original image: only the boxes were kept, so a segment job's JSON had no masks (trial21).
            masks = getattr(result, "masks", None)
            polygons = masks.xy if masks is not None else None
            keypoints = getattr(result, "keypoints", None)
            points = keypoints.xy.tolist() if keypoints is not None else None
            for i, (xyxy, conf, cls) in enumerate(zip(result.boxes.xyxy.tolist(), result.boxes.conf.tolist(),
                                                      result.boxes.cls.tolist(), strict=True)):
                box = {"class": int(cls), "name": names.get(int(cls), str(int(cls))),
                       "conf": round(float(conf), 4), "xyxy": [round(float(v), 1) for v in xyxy]}
                if polygons is not None:
                    box["polygon"] = [[round(float(x), 1), round(float(y), 1)] for x, y in polygons[i].tolist()]
                if points is not None:
                    box["keypoints"] = [[round(float(x), 1), round(float(y), 1)] for x, y in points[i]]
                boxes.append(box)
        top5 = []
        if getattr(result, "probs", None) is not None:
            # A classifier's answer: its five likeliest classes (no boxes). They were written as boxes
            # without coordinates, counted as five boxes per image.
            probs = result.probs
            top5 = [{"class": int(c), "name": names.get(int(c), str(c)), "conf": round(float(p), 4)}
                    for c, p in zip(probs.top5, probs.top5conf.tolist(), strict=True)]
        total_boxes += len(boxes)
        source = image.relative_to(source_root).as_posix()
        item = {"image": out_name, "source": source, "size": [int(result.orig_shape[1]), int(result.orig_shape[0])],
                "boxes": boxes}
        if top5:
            item["top5"] = top5
        results_out.append(item)
        print(f"image {index + 1}/{len(images)} {source}: {result.orig_shape[0]}x{result.orig_shape[1]} "
              f"{result.verbose() or '(no detections), '}{(result.speed or {}).get('inference') or 0:.1f}ms", flush=True)
        now = time.monotonic()
        if now - last_progress >= 0.5 or index == len(images) - 1:
            last_progress = now
            events.emit("progress", done=index + 1, total=len(images))
    (output_dir / "predictions.json").write_text(json.dumps(results_out))
    print(f"{len(results_out)} images annotated, {total_boxes} boxes: {output_dir.name}/NNNNN.jpg and "
          f"{output_dir.name}/predictions.json", flush=True)
    return {"folder": str(output_dir), "images": len(results_out), "boxes": total_boxes}


# --- export ----------------------------------------------------------------------------------------


def precision_of(options: dict[str, Any]) -> str:
    return "int8" if options.get("int8") else "fp16" if options.get("half") else "fp32"


def run_export(*, model_path: str, options: dict[str, Any], device: str, data: Path | None,
               verify_images: list[Path], output_dir: Path, engine_allowed: bool) -> dict[str, Any]:
    """Export one format and verify it; returns one entry of ``finished.exports``.

    The weights are copied into ``output_dir`` first: Ultralytics writes the export next
    to the ``.pt`` it loaded, which must be the job's folder, never the registry's.
    """
    from ultralytics import YOLO
    from ultralytics.engine.exporter import Exporter

    from worker.train_child import ultralytics_data

    fmt = options["format"]
    # One device exports: the first of the job's GPUs ("0" of "0,1"), or "cpu" on a simulated node.
    # The whole list would reach torch.jit.load as map_location "cuda:0,1" when verifying.
    device = device.split(",")[0]
    if fmt == "engine" and not engine_allowed:
        raise RuntimeError("format=engine (TensorRT) runs only on nodes that advertise TensorRT; this one does not")
    output_dir.mkdir(parents=True, exist_ok=True)
    local = output_dir / Path(model_path).name
    if not local.exists():
        shutil.copyfile(model_path, local)
    yolo = YOLO(str(local))
    imgsz = options.get("imgsz") or yolo.model.args.get("imgsz", 640)
    overrides = {**yolo.overrides, "imgsz": imgsz, "batch": options.get("batch", 1), "device": device,
                 "verbose": False, "mode": "export", "format": fmt,
                 # int8 calibrates on the dataset: a classifier's as the folder Ultralytics reads it as.
                 "data": ultralytics_data(data, yolo.task) if data is not None and options.get("int8") else None}
    # half/int8 are the user's words; Ultralytics 8.4 reads them as quantize=16/8.
    quantize = 8 if options.get("int8") else 16 if options.get("half") else None
    if quantize:
        overrides["quantize"] = quantize
    for key in ("dynamic", "simplify", "opset"):
        if key in options:
            overrides[key] = options[key]
    started = time.monotonic()
    exporter = Exporter(overrides=overrides, _callbacks=yolo.callbacks)
    exported = Path(exporter(model=yolo.model))
    seconds = time.monotonic() - started
    verification = verify_export(exporter=exporter, exported=exported, fmt=fmt, images=verify_images,
                                 precision=precision_of(options), device=device)
    entry = {"format": fmt, "path": str(exported), "options": {k: v for k, v in options.items() if k != "format"},
             "verification": verification, "seconds": round(seconds, 2)}
    if not verification["passed"]:
        classes = (f"top-1 class the same on {verification['top1_same']} of {verification['images']} images, "
                   if "top1_same" in verification else "")
        raise ExportVerificationFailed(
            f"{fmt} export disagrees with the PyTorch model: {classes}max abs diff {verification['max_abs']:.3g}, "
            f"max rel diff {verification['max_rel']:.3g} (tolerance rtol={verification['rtol']}, "
            f"atol={verification['atol']})", verification)
    return entry


def _letterboxed(images: list[Path], imgsz: tuple[int, int], stride: int) -> list[Any]:
    """Each image as Ultralytics' predictor feeds it: letterboxed to the export size, RGB, 0-1, NCHW."""
    import cv2
    import numpy as np
    from ultralytics.data.augment import LetterBox

    letterbox = LetterBox(imgsz, auto=False, stride=stride)
    batches = []
    for image in images:
        bgr = cv2.imread(str(image))
        if bgr is None:
            continue
        boxed = letterbox(image=bgr)
        rgb = np.ascontiguousarray(boxed[..., ::-1].transpose(2, 0, 1))[None].astype(np.float32) / 255.0
        batches.append(rgb)
    return batches


def _flat_outputs(value: Any) -> list[Any]:
    import numpy as np

    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            out.extend(_flat_outputs(item))
        return out
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy()
    return [np.asarray(value, dtype=np.float32)]


def verify_export(*, exporter: Any, exported: Path, fmt: str, images: list[Path], precision: str,
                  device: str) -> dict[str, Any]:
    """Run the exported file and the traced PyTorch model on the same inputs; compare raw outputs."""
    import numpy as np
    import torch

    rtol, atol = TOLERANCES[precision]
    reference = exporter.model
    batch = int(exporter.args.batch or 1)
    classify = getattr(reference, "task", "") == "classify"
    inputs = (_classify_inputs(images[:VERIFY_IMAGES], tuple(exporter.imgsz)) if classify
              else _letterboxed(images[:VERIFY_IMAGES], tuple(exporter.imgsz), int(max(reference.stride))))
    if not inputs:
        raise RuntimeError("no validation image could be read to verify the export")
    run = _runner(fmt, exported, exporter, device)
    ref_dtype = next(reference.parameters()).dtype
    ref_device = next(reference.parameters()).device
    max_abs = 0.0
    max_ref = 0.0
    passed = True
    shapes: list[list[int]] = []
    top1_same = top1_ties = 0
    for array in inputs:
        if batch > 1:
            array = np.repeat(array, batch, axis=0)  # a static batch: fill it with copies
        with torch.no_grad():
            expected = _flat_outputs(reference(torch.from_numpy(array).to(ref_device, ref_dtype)))
        got = _flat_outputs(run(array))
        if len(got) != len(expected):
            raise RuntimeError(f"the export has {len(got)} outputs, the PyTorch model {len(expected)}")
        for e, g in zip(expected, got, strict=True):
            if e.shape != g.shape:
                raise RuntimeError(f"output shape {list(g.shape)} differs from PyTorch's {list(e.shape)}")
            diff = np.abs(e - g)
            max_abs = max(max_abs, float(diff.max(initial=0.0)))
            max_ref = max(max_ref, float(np.abs(e).max(initial=0.0)))
            passed = passed and bool(np.all(diff <= atol + rtol * np.abs(e)))
            if len(shapes) < len(expected):
                shapes.append(list(e.shape))
        if classify:
            verdict = top1_verdict(expected[0][0], got[0][0], rtol=rtol, atol=atol)  # first of a filled batch
            top1_same += verdict == "same"
            top1_ties += verdict == "tie"
            passed = passed and verdict != "different"
    verification = {"runtime": _runtime_name(fmt), "images": len(inputs), "outputs": shapes, "precision": precision,
                    "max_abs": max_abs, "max_rel": max_abs / max_ref if max_ref else 0.0, "rtol": rtol, "atol": atol,
                    "passed": passed}
    if classify:
        verification.update(compared="class probabilities", top1_same=top1_same, top1_ties=top1_ties)
    return verification


def top1_verdict(pytorch: Any, exported: Any, *, rtol: float, atol: float) -> str:
    """One image's top-1 class, exported against PyTorch: ``same``; ``tie`` when it differs but
    PyTorch's two likeliest probabilities are within the tolerance of each other (either answer is
    as good, and rounding may break the tie its own way); else ``different``."""
    import numpy as np

    if int(np.argmax(pytorch)) == int(np.argmax(exported)):
        return "same"
    first, second = np.sort(np.asarray(pytorch, dtype=np.float64))[::-1][:2]
    return "tie" if first - second <= atol + rtol * first else "different"


def _classify_inputs(images: list[Path], imgsz: tuple[int, int]) -> list[Any]:
    """Each image as Ultralytics' classify predictor feeds it: RGB, resized and centre-cropped to the
    export size (``classify_transforms``), NCHW float32."""
    import numpy as np
    from PIL import Image
    from ultralytics.data.augment import classify_transforms

    transform = classify_transforms(size=imgsz)
    batches = []
    for image in images:
        try:
            with Image.open(image) as opened:
                rgb = opened.convert("RGB")
        except OSError:
            continue
        batches.append(np.ascontiguousarray(transform(rgb).numpy()[None], dtype=np.float32))
    return batches


def _runtime_name(fmt: str) -> str:
    if fmt == "onnx":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    if fmt == "torchscript":
        import torch

        return f"torch.jit {torch.__version__}"
    return "ultralytics AutoBackend (TensorRT)"


def _runner(fmt: str, exported: Path, exporter: Any, device: str):
    """A function: NCHW float32 array → the exported model's raw outputs."""
    import numpy as np

    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
        inp = session.get_inputs()[0]
        dtype = np.float16 if inp.type == "tensor(float16)" else np.float32

        def run_onnx(array):
            return session.run(None, {inp.name: array.astype(dtype)})

        return run_onnx
    import torch

    if fmt == "torchscript":
        module = torch.jit.load(str(exported), map_location="cpu" if device == "cpu" else f"cuda:{device}")
        module.eval()
        dtype = next(exporter.model.parameters()).dtype
        dev = next(exporter.model.parameters()).device

        def run_ts(array):
            with torch.no_grad():
                return module(torch.from_numpy(array).to(dev, dtype))

        return run_ts
    from ultralytics.nn.autobackend import AutoBackend

    backend = AutoBackend(str(exported), device=torch.device("cuda:0"), fp16=bool(exporter.args.half))

    def run_engine(array):
        with torch.no_grad():
            return backend(torch.from_numpy(array).to("cuda:0"))

    return run_engine

"""Check a ``.pt`` before anything loads it: a restricted unpickling pass over its pickle.

A PyTorch checkpoint is a zip (``torch.save`` since 1.6): ``<archive>/data.pkl`` is a
pickle, ``<archive>/data/<n>`` hold the tensors' bytes. ``torch.load(weights_only=False)``
— Ultralytics' default — runs whatever that pickle says: a ``.pt`` can call
``os.system``. So uploaded weights are checked here before they are stored, and again by
the training child right before it loads them (worker/train_child.py); only training
children ever load weights, never the web process.

How: :class:`_RestrictedUnpickler` reads ``data.pkl`` with a ``find_class`` that raises
for every global outside the allow-list and, for an allowed one, returns an *inert
stand-in*: a class that accepts any arguments, state and items and does nothing. Tensor
storages (persistent ids) become stand-ins too. So the whole pickle is walked — every
``GLOBAL``/``STACK_GLOBAL``/``INST``/``OBJ``/extension opcode reaches ``find_class`` — and
nothing from the file is imported, constructed or called. This module imports neither
torch nor ultralytics, nor Django (the training child imports it).

The allow-list is what a real Ultralytics/torch checkpoint needs (checked against
checkpoints built locally for detect, segment, classify, pose and obb, YOLOv8 and YOLO11,
fresh and trained: tests/registry/test_checkpoint_scan.py), mirroring Ultralytics' own
restricted loader (``ultralytics.nn.tasks._SafeLoad``):

- exact names: tensor rebuild functions, storage and dtype types, ``torch.Size``,
  ``collections.OrderedDict``, ``set``, numpy scalars, ``IterableSimpleNamespace``,
  ``pathlib`` paths, the classification transforms, Ultralytics' legacy aliases, and
  ``getattr`` (replaced by a stand-in that only hands back stand-ins);
- layer classes by exact name (:data:`apps.registry.checkpoint_layers.LAYER_CLASSES`):
  every ``nn.Module`` class of ``torch.nn.modules``, ``ultralytics.nn.modules`` and
  ``ultralytics.nn.tasks`` and the loss/assigner classes, generated from the installed
  libraries by ``scripts/checkpoint_allowlist.py`` (a test fails when it is out of date).
  Classes only, never a function or an object, and never a dotted attribute path
  (``Module.register_forward_hook``).

Zip layout checks come first: one top folder, exactly one ``data.pkl`` in it, no other
``.pkl`` (``constants.pkl`` is a TorchScript archive), stored (uncompressed) members only,
safe member names, declared sizes that add up to the file.

What the scan reads besides: the model classes the pickle names (the task) and the model's
class ``names``. The stand-in of an Ultralytics model class keeps the state the pickle hands it
(what unpickling already built: plain dicts, lists, strings, numbers and other stand-ins), and
the ``names`` of the checkpoint's model (``ema``, else ``model``, as Ultralytics loads it) are
read from there when they are a plain {id: name} mapping or list of strings.
"""

from __future__ import annotations

import io
import pickle
import posixpath
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint_layers import LAYER_CLASSES

MAX_PICKLE_BYTES = 64 * 1024**2  # data.pkl of YOLO11x with optimizer state is ~2 MB
MAX_MEMBERS = 100_000
MAX_CLASSES, MAX_CLASS_NAME = 10_000, 200  # as a dataset's data.yaml may have

_STORAGES = ("Float", "Half", "BFloat16", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool",
             "ComplexFloat", "ComplexDouble")
_DTYPES = ("float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16", "int32",
           "int64", "uint8", "bool", "long", "int", "complex64", "complex128")
ALLOWED_GLOBALS = frozenset({
    "collections.OrderedDict",
    "builtins.set", "__builtin__.set", "builtins.frozenset", "__builtin__.frozenset", "builtins.slice",
    "builtins.complex", "builtins.bytearray", "_codecs.encode",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device",
    "torch.storage.UntypedStorage",
    *(f"torch.{name}Storage" for name in _STORAGES),
    *(f"torch.{name}" for name in _DTYPES),
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype",
    "ultralytics.utils.IterableSimpleNamespace", "ultralytics.yolo.utils.IterableSimpleNamespace",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib._local.PosixPath", "pathlib._local.WindowsPath",
    "torchvision.transforms.transforms.Compose", "torchvision.transforms.transforms.Normalize",
    "torchvision.transforms.transforms.Resize", "torchvision.transforms.transforms.CenterCrop",
    "torchvision.transforms.transforms.ToTensor", "torchvision.transforms.functional.InterpolationMode",
    # Ultralytics' legacy aliases (YOLOv9e, YOLOv10), as its temporary_modules() maps them.
    "ultralytics.nn.modules.block.Silence", "ultralytics.nn.tasks.YOLOv10DetectionModel",
    "ultralytics.utils.loss.v10DetectLoss",
    "builtins.getattr",  # `Detect.forward`, `InterpolationMode.BILINEAR`: a stand-in, see _inert_getattr
})
# numpy dtype classes (numpy.dtypes.Float64DType, …) arrive as GLOBALs too.
_NUMPY_DTYPE = re.compile(r"^numpy\.dtypes\.[A-Z][A-Za-z0-9]*DType$")
_SAFE_ATTR = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class CheckpointRefused(ValueError):
    """The file is not a checkpoint we accept; ``message`` says why (and names the global)."""

    def __init__(self, message: str, *, offending: str = ""):
        self.offending = offending
        super().__init__(message)


@dataclass
class CheckpointReport:
    """What the scan found: the globals the pickle references (all allowed) and its layout."""

    globals: set[str] = field(default_factory=set)
    archive: str = ""
    tensors: int = 0
    model_classes: list[str] = field(default_factory=list)
    class_names: list[str] | None = None  # the model's ``names`` by class id; None when not plainly there

    @property
    def task(self) -> str:
        """The Ultralytics task the model class implies ('' when unknown)."""
        names = {name.rsplit(".", 1)[-1] for name in self.model_classes}
        for cls, task in (("SegmentationModel", "segment"), ("PoseModel", "pose"), ("OBBModel", "obb"),
                          ("ClassificationModel", "classify"), ("DetectionModel", "detect"),
                          ("YOLOv10DetectionModel", "detect")):
            if cls in names:
                return task
        return ""

    def as_dict(self) -> dict:
        return {"globals": len(self.globals), "tensors": self.tensors, "task": self.task,
                "model_classes": sorted(set(self.model_classes)), "class_names": self.class_names}


def global_allowed(name: str) -> bool:
    return name in ALLOWED_GLOBALS or name in LAYER_CLASSES or bool(_NUMPY_DTYPE.match(name))


# --- inert stand-ins ----------------------------------------------------------------------------


class _Inert:
    """Stands for an allowed object: takes any arguments, state and items; does nothing."""

    __slots__ = ()

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __setstate__(self, state) -> None:
        pass

    def __setitem__(self, key, value) -> None:
        pass

    def append(self, value) -> None:
        pass

    def extend(self, values) -> None:
        pass

    def __call__(self, *args, **kwargs) -> _Inert:
        return _Inert()


class _InertModel(_Inert):
    """Stands for an Ultralytics model class: keeps the state the pickle gives it (already-built plain
    data and stand-ins; nothing is called on it), so the scan can read the model's ``names``."""

    __slots__ = ("state",)

    def __setstate__(self, state) -> None:
        self.state = state


def _class_names(checkpoint) -> list[str] | None:
    """The ``names`` of the checkpoint's model, by class id, when they are plain: {0: name, 1: …} with
    ids 0…n-1, or a list; None otherwise."""
    if not isinstance(checkpoint, dict):
        return None
    model = checkpoint.get("ema") or checkpoint.get("model")
    state = getattr(model, "state", None) if isinstance(model, _InertModel) else None
    names = state.get("names") if isinstance(state, dict) else None
    if isinstance(names, dict) and set(names) == set(range(len(names))) \
            and not any(isinstance(key, bool) for key in names):
        names = [names[i] for i in range(len(names))]
    if (not isinstance(names, list) or not 0 < len(names) <= MAX_CLASSES
            or not all(isinstance(name, str) and len(name) <= MAX_CLASS_NAME for name in names)):
        return None
    return names


def _inert_getattr(obj, name, *default):
    """``getattr`` in a checkpoint: only a plain attribute name, and the answer is a stand-in."""
    if not isinstance(name, str) or not _SAFE_ATTR.match(name):
        raise CheckpointRefused(f"the checkpoint calls getattr(…, {str(name)[:60]!r}), which is not allowed",
                                offending="builtins.getattr")
    return _Inert()


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, report: CheckpointReport) -> None:
        super().__init__(io.BytesIO(data))
        self.report = report
        self.stand_ins: dict[str, type] = {}

    def find_class(self, module: str, name: str):
        qualified = f"{module}.{name}"
        if not global_allowed(qualified):
            raise CheckpointRefused(
                f"the checkpoint references {qualified!r}, which a YOLO checkpoint never needs: refused "
                "(only torch tensors, torch.nn / ultralytics.nn layers and plain data types are allowed)",
                offending=qualified)
        self.report.globals.add(qualified)
        if module == "ultralytics.nn.tasks":
            self.report.model_classes.append(qualified)
        if qualified == "builtins.getattr":
            return _inert_getattr
        if qualified not in self.stand_ins:
            base = _InertModel if module == "ultralytics.nn.tasks" else _Inert
            self.stand_ins[qualified] = type(name, (base,), {"__slots__": ()})
        return self.stand_ins[qualified]

    def persistent_load(self, pid):
        # torch's persistent id for a tensor storage: ("storage", StorageType, key, location, numel)
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise CheckpointRefused(f"the checkpoint has an unknown persistent id {str(pid)[:80]!r}",
                                    offending="persistent_load")
        self.report.tensors += 1
        return _Inert()


# --- the archive ----------------------------------------------------------------------------------


def _archive_problems(infos: list[zipfile.ZipInfo], size: int) -> tuple[str, str]:
    """(the archive folder, the data.pkl member) or CheckpointRefused."""
    if not infos:
        raise CheckpointRefused("the file is an empty zip, not a PyTorch checkpoint")
    if len(infos) > MAX_MEMBERS:
        raise CheckpointRefused(f"the archive has {len(infos)} entries; a checkpoint has far fewer")
    tops = set()
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or ".." in parts or any(ord(c) < 32 for c in name):
            raise CheckpointRefused(f"the archive has an unsafe entry name {name[:120]!r}")
        if info.flag_bits & 0x1:
            raise CheckpointRefused(f"the archive entry {name[:120]!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointRefused(f"the archive entry {name[:120]!r} is compressed; torch.save stores entries "
                                    "uncompressed, so this was not written by torch.save")
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise CheckpointRefused(f"the archive entry {name[:120]!r} is a symbolic link")
        tops.add(parts[0])
    if len(tops) != 1:
        raise CheckpointRefused(f"the archive has {len(tops)} top folders; torch.save writes exactly one")
    top = tops.pop()
    declared = sum(i.file_size for i in infos)
    if declared > size:
        raise CheckpointRefused("the archive declares more data than the file holds (a zip bomb or a damaged file)")
    pickles = [i.filename for i in infos if i.filename.endswith(".pkl")]
    if f"{top}/constants.pkl" in pickles:
        raise CheckpointRefused("this is a TorchScript archive, not an Ultralytics checkpoint (.pt from training "
                                "or model.save())")
    if pickles != [f"{top}/data.pkl"]:
        raise CheckpointRefused(f"the archive must hold exactly one pickle, {top}/data.pkl; it holds "
                                f"{', '.join(p[:80] for p in pickles[:5]) or 'none'}")
    return top, f"{top}/data.pkl"


def scan_checkpoint(path: Path | str) -> CheckpointReport:
    """Check the file at ``path``; return what it references, or raise :class:`CheckpointRefused`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise CheckpointRefused(f"the weights file cannot be read ({exc.strerror or exc})") from None
    if size == 0:
        raise CheckpointRefused("the weights file is empty")
    if head[:2] == b"\x80\x02" or head[:1] == b"\x80":
        raise CheckpointRefused("this is a bare pickle (the pre-1.6 torch.save format), not a zip checkpoint: "
                                "load and save it again with a current torch")
    if head != b"PK\x03\x04":
        raise CheckpointRefused("this is not a PyTorch checkpoint (torch.save writes a zip archive)")
    report = CheckpointReport()
    try:
        with zipfile.ZipFile(path) as archive:
            top, member = _archive_problems(archive.infolist(), size)
            report.archive = top
            info = archive.getinfo(member)
            if info.file_size > MAX_PICKLE_BYTES:
                raise CheckpointRefused(f"{member} is {info.file_size} bytes; a checkpoint's pickle is far smaller")
            with archive.open(info) as stream:
                data = stream.read(MAX_PICKLE_BYTES + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as exc:
        if isinstance(exc, CheckpointRefused):
            raise
        raise CheckpointRefused(f"the checkpoint archive is damaged ({exc})") from None
    try:
        report.class_names = _class_names(_RestrictedUnpickler(data, report).load())
    except CheckpointRefused:
        raise
    except RecursionError:
        raise CheckpointRefused("the checkpoint's pickle nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is a refusal, never a 500
        raise CheckpointRefused(f"the checkpoint's pickle is malformed ({type(exc).__name__}: {str(exc)[:200]})") \
            from None
    if not report.model_classes:
        raise CheckpointRefused("the file holds no Ultralytics model (no ultralytics.nn.tasks model class): "
                                "upload a .pt written by Ultralytics training or model.save()")
    return report


def member_name_ok(name: str) -> bool:
    """A plain weights file name: ``yolov8s.pt``, ``my-model_v2.pt``."""
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.pt", name)) and posixpath.basename(name) == name

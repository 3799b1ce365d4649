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
  ``getattr`` (a stand-in: an enum member, a layer class's attribute or a layer's ``forward``,
  as Ultralytics' own loader allows, answered by a stand-in that cannot be called);
- layer classes by exact name (:data:`apps.registry.checkpoint_layers.LAYER_CLASSES`):
  every ``nn.Module`` class of ``torch.nn.modules``, ``ultralytics.nn.modules`` and
  ``ultralytics.nn.tasks`` and the loss/assigner classes, generated from the installed
  libraries by ``scripts/checkpoint_allowlist.py`` (a test fails when it is out of date).
  Classes only, never a function or an object, and never a dotted attribute path
  (``Module.register_forward_hook``).

Referencing a global is not calling it: the pickle may call only :data:`CALLABLE_GLOBALS` (plain-data
constructors, tensor rebuild functions). A layer class is built the way torch.save pickles it
(NEWOBJ, ``cls.__new__``), never called with the file's arguments, and nothing the pickle built is
ever called (sec22: the child's weights_only loader runs those calls for real).

Zip layout checks come first: the central directory exactly where the end record says (else
Python's zipfile and torch's reader see different entries), no archive comment, one top folder, exactly one ``data.pkl`` in it, no other
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

from apps.core.values import first_surrogate

from .checkpoint_layers import LAYER_CLASSES

MAX_PICKLE_BYTES = 64 * 1024**2  # data.pkl of YOLO11x with optimizer state is ~2 MB
MAX_MEMBERS = 100_000
MAX_CLASSES, MAX_CLASS_NAME = 10_000, 200  # as a dataset's data.yaml may have

_STORAGES = ("Float", "Half", "BFloat16", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool",
             "ComplexFloat", "ComplexDouble")
_DTYPES = ("float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16", "int32",
           "int64", "uint8", "bool", "long", "int", "complex64", "complex128")
# What a real checkpoint *calls* (REDUCE): plain-data constructors and the tensor rebuild functions. Every
# other allowed global is only referenced or built with NEWOBJ (``cls.__new__``, no ``__init__``), which is
# how torch.save pickles a module. The child's loader (Ultralytics' weights_only allow-list) would run a
# layer's constructor with the pickle's arguments: ``TorchVision("resnet18", "DEFAULT")`` fetches and
# torch.hub-loads weights, ``Linear(200000, 200000)`` allocates 160 GB, ``DetectionModel(cfg)`` builds
# whatever the pickle describes (sec22).
CALLABLE_GLOBALS = frozenset({
    "collections.OrderedDict",
    "builtins.set", "__builtin__.set", "builtins.frozenset", "__builtin__.frozenset", "builtins.slice",
    "builtins.complex", "builtins.bytearray", "_codecs.encode",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype",
    "ultralytics.utils.IterableSimpleNamespace", "ultralytics.yolo.utils.IterableSimpleNamespace",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib._local.PosixPath", "pathlib._local.WindowsPath",
    "torchvision.transforms.functional.InterpolationMode",  # an Enum pickles as Enum(value) before Python 3.12
})
# Everything else a checkpoint may name: referenced, or built with NEWOBJ (``cls.__new__``, no ``__init__``).
ALLOWED_GLOBALS = CALLABLE_GLOBALS | frozenset({
    "torch.storage.UntypedStorage",
    *(f"torch.{name}Storage" for name in _STORAGES),
    *(f"torch.{name}" for name in _DTYPES),
    "torchvision.transforms.transforms.Compose", "torchvision.transforms.transforms.Normalize",
    "torchvision.transforms.transforms.Resize", "torchvision.transforms.transforms.CenterCrop",
    "torchvision.transforms.transforms.ToTensor",
    # Ultralytics' legacy aliases (YOLOv9e, YOLOv10), as its temporary_modules() maps them.
    "ultralytics.nn.modules.block.Silence", "ultralytics.nn.tasks.YOLOv10DetectionModel",
    "ultralytics.utils.loss.v10DetectLoss",
    # `Detect.forward`, `InterpolationMode.BILINEAR`: a stand-in, see _inert_getattr. Protocol 2 (torch.save)
    # names builtins `__builtin__` and an overridden find_class sees that name unmapped.
    "builtins.getattr", "__builtin__.getattr",
})
# getattr(cls, name) of these (an enum member, a layer's method), as Ultralytics' own loader allows it.
_ENUMS = frozenset({"torchvision.transforms.functional.InterpolationMode"})
_BOUND_METHODS = frozenset({"forward", "forward_fuse"})  # getattr(layer, name): a bound method the model keeps
_STORAGE_TYPES = frozenset({"torch.storage.UntypedStorage", *(f"torch.{name}Storage" for name in _STORAGES)})
_STORAGE_KEY = re.compile(r"^[A-Za-z0-9_]{1,64}$")
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
    """Stands for an allowed global, or for what the pickle built from one: takes any state and items and
    does nothing. Calling it is refused unless real checkpoints call that global (:data:`CALLABLE_GLOBALS`):
    ``__init__`` runs only when the pickle calls the class (REDUCE, INST/OBJ with arguments) — NEWOBJ runs
    ``__new__`` alone — and ``__call__`` when it calls what it built."""

    __slots__ = ()
    qualified = ""  # the global this class stands for (set on each generated subclass)
    callable_global = False

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        if not type(self).callable_global:
            name = type(self).qualified or "an object"
            raise CheckpointRefused(f"the checkpoint calls {name}(…), which would run its code with the file's "
                                    "arguments: refused (torch.save never pickles a call of it)", offending=name)

    def __setstate__(self, state) -> None:
        pass

    def __setitem__(self, key, value) -> None:
        pass

    def append(self, value) -> None:
        pass

    def extend(self, values) -> None:
        pass

    def add(self, value) -> None:
        pass

    def __call__(self, *args, **kwargs):
        name = type(self).qualified or "a value it built: a getattr answer or a tensor storage"
        raise CheckpointRefused(f"the checkpoint calls an object it built ({name}): refused",
                                offending=type(self).qualified or "call")


def _opaque() -> _Inert:
    """A stand-in for a value (a tensor storage, a getattr answer): never callable."""
    return object.__new__(_Inert)


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
            or not all(isinstance(name, str) and len(name) <= MAX_CLASS_NAME for name in names)
            or first_surrogate(names)  # half a UTF-16 pair, which pickle keeps: no page can show it (trial27 F1)
            # A NUL went into the version's lineage: a 500 on PostgreSQL (trial28 F5); a data.yaml's are refused.
            or any(ord(c) < 32 or ord(c) == 127 for name in names for c in name)):
        return None
    return names


def _inert_getattr(obj, name, *default):
    """``getattr`` in a checkpoint, as Ultralytics' own loader allows it and no further: an enum member
    (``InterpolationMode.BILINEAR``), an attribute of a layer class, or ``forward``/``forward_fuse`` of a
    layer. The answer is a stand-in that cannot be called. ``getattr(PosixPath(…), "write_text")`` would be a
    file write when the pickle calls it (sec22)."""
    shown = f"getattr(…, {str(name)[:60]!r})"
    if default or not isinstance(name, str) or not _SAFE_ATTR.match(name):
        raise CheckpointRefused(f"the checkpoint calls {shown}, which is not allowed", offending="builtins.getattr")
    if isinstance(obj, type) and issubclass(obj, _Inert) and (obj.qualified in _ENUMS or obj.qualified in LAYER_CLASSES):
        return _opaque()
    if isinstance(obj, _Inert) and type(obj).qualified in LAYER_CLASSES and name in _BOUND_METHODS:
        return _opaque()
    what = getattr(obj, "qualified", "") or type(obj).__name__
    raise CheckpointRefused(f"the checkpoint calls {shown} on {what}: only enum members, layer classes' "
                            "attributes and a layer's forward are allowed", offending="builtins.getattr")


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
        if qualified in ("builtins.getattr", "__builtin__.getattr"):
            return _inert_getattr
        if qualified not in self.stand_ins:
            base = _InertModel if module == "ultralytics.nn.tasks" else _Inert
            self.stand_ins[qualified] = type(name, (base,), {
                "__slots__": (), "qualified": qualified, "callable_global": qualified in CALLABLE_GLOBALS})
        return self.stand_ins[qualified]

    def persistent_load(self, pid):
        # torch's persistent id for a tensor storage: ("storage", StorageType, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], type) and getattr(pid[1], "qualified", "") in _STORAGE_TYPES
                and isinstance(pid[2], str) and _STORAGE_KEY.match(pid[2]) and isinstance(pid[3], str)
                and len(pid[3]) <= 32 and isinstance(pid[4], int) and pid[4] >= 0):
            raise CheckpointRefused(f"the checkpoint has an unknown persistent id {str(pid)[:80]!r}",
                                    offending="persistent_load")
        self.report.tensors += 1
        return _opaque()


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


def _directory_problems(archive: zipfile.ZipFile, path: Path) -> None:
    """The archive's central directory must be exactly where its end record says, with as many entries,
    and no archive comment. torch's zip reader (miniz) takes the declared offset as it is; Python's
    zipfile, finding the directory elsewhere (bytes prepended, a second archive appended), shifts every
    offset by the difference and reads *another* directory: a file built that way showed this scan one
    ``data.pkl`` and ``torch.load`` a different one (sec22). torch.save writes no comment."""
    with open(path, "rb") as handle:
        # zipfile's own end-record reader (private, unchanged since Python 2): the declared values.
        end = zipfile._EndRecData(handle)  # noqa: SLF001
    if end is None:
        raise CheckpointRefused("the checkpoint archive has no end record")
    if end[zipfile._ECD_COMMENT]:  # noqa: SLF001
        raise CheckpointRefused("the archive has a comment; torch.save writes none")
    if archive.start_dir != end[zipfile._ECD_OFFSET] or end[zipfile._ECD_ENTRIES_TOTAL] != len(archive.infolist()):  # noqa: SLF001
        raise CheckpointRefused("the archive's directory is not where its end record says (data before the "
                                "archive, or two archives in one file): torch would read other entries than "
                                "the ones checked")


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
            _directory_problems(archive, path)
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


def member_name_problem(name: str) -> str | None:
    """Why ``name`` is no plain weights file name (:func:`member_name_ok`), in words; None when it is one.

    A name of 101+ characters before ``.pt`` got the rule for letters and folders, which it kept
    (new-user trial 27, F5): its length is said instead.
    """
    if member_name_ok(name):
        return None
    stem = name.removesuffix(".pt")
    if name.endswith(".pt") and len(stem) > 100 and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", stem):
        return f"the file name has {len(stem)} characters before .pt; at most 100 are allowed"
    return ("the file name must be a plain name ending in .pt, like yolov8s.pt (letters, digits, '.', '_', '-', "
            "at most 100 before .pt; no folders)")

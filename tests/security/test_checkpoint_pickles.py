"""Uploaded weights that get past the checkpoint check would run as the worker's user on a GPU node
(sec22). Each file here passed ``scan_checkpoint`` before the fix; each payload would create a marker
file if anything ran it, and none may."""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.registry.checkpoint_scan import CheckpointRefused, scan_checkpoint
from apps.registry.models import ModelVersion
from tests.conftest import api_client
from tests.registry.conftest import build_checkpoint


@pytest.fixture(scope="module")
def real_pt(tmp_path_factory):
    return build_checkpoint("yolov8n.yaml", tmp_path_factory.mktemp("weights"))


# --- hand-written pickles (protocol 2, as torch.save writes them) ----------------------------------


def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


MODEL = g("ultralytics.nn.tasks", "DetectionModel") + b")\x81"  # DetectionModel.__new__ (NEWOBJ), as torch.save


def checkpoint(evil: bytes) -> bytes:
    """``{"model": DetectionModel(), "x": <evil>}``: passes as an Ultralytics checkpoint but for ``evil``."""
    return b"\x80\x02}(" + s("model") + MODEL + s("x") + evil + b"u."


def path_method(marker, method: str, *args: str) -> bytes:
    """``getattr(PosixPath(marker), method)(*args)``."""
    call = b"(" + b"".join(s(a) for a in args) + b"tR" if args else b")R"
    return (g("builtins", "getattr") + b"(" + g("pathlib", "PosixPath") + b"(" + s(str(marker)) + b"tR"
            + s(method) + b"tR" + call)


def zip_bytes(payload: bytes, top: str = "archive") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{top}/data.pkl", payload)
        archive.writestr(f"{top}/version", b"3\n")
    return buffer.getvalue()


def write_pt(path, payload: bytes):
    path.write_bytes(zip_bytes(payload))
    return path


# --- names torch and numpy would load or run a second pickle through ------------------------------------


@pytest.mark.parametrize(("module", "name"), [
    ("torch.storage", "_load_from_bytes"), ("torch.serialization", "load"), ("torch", "load"), ("torch.hub", "load"),
    ("torch.jit", "load"), ("torch._C", "import_ir_module"), ("numpy", "load"), ("numpy.lib.npyio", "load"),
    ("operator", "attrgetter"), ("functools", "partial"), ("builtins", "exec"), ("__builtin__", "eval"),
    ("copyreg", "_reconstructor"), ("numpy.core.multiarray", "_reconstruct"), ("torch.nn.modules.module", "Module.apply"),
])
@pytest.mark.parametrize("opcode", ["GLOBAL+REDUCE", "INST", "OBJ", "STACK_GLOBAL"])
def test_loaders_and_call_helpers_are_refused_by_name_however_they_are_named(module, name, opcode, tmp_path):
    marker = tmp_path / "ran"
    arg = s(str(marker))
    payload = {
        "GLOBAL+REDUCE": b"\x80\x02" + g(module, name) + b"(" + arg + b"tR.",
        "INST": b"(" + arg + b"i" + module.encode() + b"\n" + name.encode() + b"\n.",
        "OBJ": b"(" + g(module, name) + arg + b"o.",
        "STACK_GLOBAL": b"\x80\x04" + s(module) + s(name) + b"\x93(" + arg + b"tR.",
    }[opcode]
    with pytest.raises(CheckpointRefused) as refused:
        scan_checkpoint(write_pt(tmp_path / "w.pt", payload))
    assert refused.value.offending == f"{module}.{name}"
    assert not marker.exists()


# --- getattr on a plain object: a method of it called ------------------------------------------------


@pytest.mark.parametrize(("method", "args"), [("touch", ()), ("write_text", ("import os",))])
def test_getattr_of_an_allowed_objects_method_is_refused_and_nothing_runs(method, args, tmp_path):
    marker = tmp_path / "ran"
    evil = path_method(marker, method, *args)
    with pytest.raises(CheckpointRefused, match=rf"getattr\(…, '{method}'\) on pathlib.PosixPath") as refused:
        scan_checkpoint(write_pt(tmp_path / "w.pt", checkpoint(evil)))
    assert refused.value.offending == "builtins.getattr"
    assert not marker.exists()
    # The payload is live: plain unpickling (torch.load(weights_only=False)) runs it.
    pickle.loads(b"\x80\x02" + evil + b".")
    assert marker.exists()


def test_calling_what_a_getattr_answered_is_refused(tmp_path):
    """``getattr(DetectionModel, "register_forward_hook")(…)``: an allowed getattr, but never called."""
    evil = g("builtins", "getattr") + b"(" + g("ultralytics.nn.tasks", "DetectionModel") + s("register_forward_hook") \
        + b"tR)R"
    with pytest.raises(CheckpointRefused, match="calls an object it built"):
        scan_checkpoint(write_pt(tmp_path / "w.pt", checkpoint(evil)))


def test_calling_a_layer_the_pickle_built_is_refused(tmp_path):
    """REDUCE on a module instance would run its forward."""
    with pytest.raises(CheckpointRefused, match="calls an object it built"):
        scan_checkpoint(write_pt(tmp_path / "w.pt", checkpoint(MODEL + b"(K\x01tR")))


# --- constructors run with the file's arguments -------------------------------------------------------


CFG = (b"}(" + s("nc") + b"K\x01" + s("backbone") + b"]](J\xff\xff\xff\xffK\x01" + s("Conv") + b"]K\x03aea"
       + s("head") + b"]u")


@pytest.mark.parametrize(("evil", "offending"), [
    # 200000 x 200000 floats: 160 GB allocated on the GPU node by the child's weights_only load
    (g("torch.nn.modules.linear", "Linear") + b"(J\x40\x0d\x03\x00J\x40\x0d\x03\x00tR",
     "torch.nn.modules.linear.Linear"),
    # torchvision's model builder, then torch.hub's torch.load(weights_only=False) of the cached weights
    (g("ultralytics.nn.modules.block", "TorchVision") + b"(" + s("resnet18") + s("DEFAULT") + b"tR",
     "ultralytics.nn.modules.block.TorchVision"),
    # a model built from whatever architecture the file describes
    (g("ultralytics.nn.tasks", "DetectionModel") + b"(" + CFG + b"tR", "ultralytics.nn.tasks.DetectionModel"),
], ids=["huge-linear", "torchvision", "model-from-cfg"])
def test_a_pickle_that_calls_a_layer_class_is_refused(evil, offending, tmp_path):
    with pytest.raises(CheckpointRefused, match="would run its code with the file's arguments") as refused:
        scan_checkpoint(write_pt(tmp_path / "w.pt", checkpoint(evil)))
    assert refused.value.offending == offending


@pytest.mark.parametrize("pid", [
    b"(" + s("storage") + g("torch", "FloatStorage") + s("../../etc/passwd") + s("cpu") + b"K\x01t",
    b"(" + s("storage") + g("collections", "OrderedDict") + s("0") + s("cpu") + b"K\x01t",
    b"(" + s("storage") + g("torch", "FloatStorage") + s("0") + b"t",
], ids=["path-as-key", "not-a-storage-type", "short"])
def test_a_persistent_id_that_is_not_a_plain_storage_reference_is_refused(pid, tmp_path):
    with pytest.raises(CheckpointRefused, match="unknown persistent id"):
        scan_checkpoint(write_pt(tmp_path / "w.pt", checkpoint(pid + b"Q")))


# --- the zip torch reads is not the zip the scan read ----------------------------------------------------


def two_archives_in_one(benign: bytes, evil: bytes) -> bytes:
    """The evil archive without its end record, then the benign one whose end record declares the evil
    archive's central directory: Python's zipfile finds the benign directory (it corrects the offset),
    torch's reader (miniz) takes the declared one. (Padded to one length so both directories sit at the
    same offset; unpickling stops at the evil pickle's STOP.)"""
    assert len(evil) <= len(benign)
    first, second = zip_bytes(evil.ljust(len(benign), b"\0")), zip_bytes(benign)
    end_first, end_second = first.rfind(b"PK\x05\x06"), second.rfind(b"PK\x05\x06")
    (directory_first,) = struct.unpack("<I", first[end_first + 16:end_first + 20])
    record = bytearray(second[end_second:])
    record[16:20] = struct.pack("<I", directory_first)
    return first[:end_first] + second[:end_second] + bytes(record)


def test_a_second_archive_behind_the_checked_one_is_refused(tmp_path, real_pt):
    marker = tmp_path / "ran"
    with zipfile.ZipFile(real_pt) as real:
        benign = real.read(next(n for n in real.namelist() if n.endswith("/data.pkl")))
    path = tmp_path / "w.pt"
    path.write_bytes(two_archives_in_one(benign, b"\x80\x02" + path_method(marker, "touch") + b"."))
    with zipfile.ZipFile(path) as archive:  # what the scan used to read
        assert archive.read("archive/data.pkl") == benign
    with pytest.raises(CheckpointRefused, match="directory is not where its end record says"):
        scan_checkpoint(path)
    assert not marker.exists()


def test_torch_reads_the_other_archive_of_such_a_file(tmp_path):
    """Why the check above exists: the two readers disagree (shown with harmless pickles)."""
    import torch

    path = tmp_path / "two.pt"
    path.write_bytes(two_archives_in_one(pickle.dumps({"read": "checked"}, protocol=2),
                                         pickle.dumps({"read": "other"}, protocol=2)))
    with zipfile.ZipFile(path) as archive:
        assert pickle.loads(archive.read("archive/data.pkl")) == {"read": "checked"}
    assert torch.load(path, weights_only=True) == {"read": "other"}


def test_an_archive_comment_is_refused(tmp_path, real_pt):
    path = tmp_path / "w.pt"
    path.write_bytes(real_pt.read_bytes())
    with zipfile.ZipFile(path, "a") as archive:
        archive.comment = b"written by something else than torch.save"
    with pytest.raises(CheckpointRefused, match="comment"):
        scan_checkpoint(path)


def test_real_checkpoints_still_pass(real_pt):
    assert scan_checkpoint(real_pt).task == "detect"


# --- through the API --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_upload_of_such_a_file_is_refused_with_the_reason(bob, tmp_path, settings):
    settings.MODELS_DIR = tmp_path / "models"
    marker = tmp_path / "ran"
    upload = SimpleUploadedFile("yolov8s.pt", zip_bytes(checkpoint(path_method(marker, "write_text", "x"))),
                                content_type="application/octet-stream")
    response = api_client(bob).post("/api/v1/weights/", {"file": upload, "team": "vision"}, format="multipart")
    assert response.status_code == 400, response.content
    assert "getattr(…, 'write_text') on pathlib.PosixPath" in response.json()["file"][0]
    assert not marker.exists() and not ModelVersion.objects.exists()


# --- the training child: torch.hub's cached weights ---------------------------------------------------


def test_the_child_loads_torch_hub_weights_as_data_only(tmp_path, monkeypatch):
    """A ``TorchVision`` layer in a checkpoint's model YAML (fine-tuning rebuilds the model from it) asks
    torch.hub for pretrained weights; torch.hub would unpickle the cached file with weights_only=False."""
    import torch
    import torch.hub

    from worker.train_child import hub_weights_only

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    for module in (torch.hub, *(sys.modules[name] for name in ("torchvision._internally_replaced_utils",
                                                              "torchvision.models._api") if name in sys.modules)):
        monkeypatch.setattr(module, "load_state_dict_from_url", module.load_state_dict_from_url)  # restored after
    cached = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    cached.parent.mkdir(parents=True)
    torch.save({"x": Payload()}, cached)
    hub_weights_only()
    with pytest.raises(pickle.UnpicklingError):
        torch.hub.load_state_dict_from_url("https://download.pytorch.org/models/resnet18-f37072fd.pth")
    assert not marker.exists()

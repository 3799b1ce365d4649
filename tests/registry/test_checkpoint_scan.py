"""The checkpoint check: real checkpoints of every task pass, hostile pickles and zip tricks are refused
by name — and nothing in them is ever executed."""

from __future__ import annotations

import importlib
import inspect
import io
import os
import pickle
import zipfile

import pytest

from apps.registry.checkpoint_scan import CheckpointRefused, global_allowed, scan_checkpoint

from .conftest import build_checkpoint, trained_checkpoint

TASK_MODELS = [
    ("yolov8n.yaml", "detect"), ("yolov8n-seg.yaml", "segment"), ("yolov8n-cls.yaml", "classify"),
    ("yolov8n-pose.yaml", "pose"), ("yolov8n-obb.yaml", "obb"),
    ("yolo11n.yaml", "detect"), ("yolo11n-seg.yaml", "segment"), ("yolo11n-cls.yaml", "classify"),
    ("yolo11n-pose.yaml", "pose"), ("yolo11n-obb.yaml", "obb"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    return {name: build_checkpoint(name, folder) for name, _ in TASK_MODELS}


@pytest.mark.parametrize(("model_yaml", "task"), TASK_MODELS)
def test_a_locally_built_checkpoint_of_every_task_passes(model_yaml, task, built):
    report = scan_checkpoint(built[model_yaml])
    assert report.task == task and report.tensors > 100
    assert all(global_allowed(name) for name in report.globals)


def test_the_scan_reads_the_models_class_names_by_id(tmp_path):
    """What Ultralytics saved as the model's names, read from the scanned pickle (nothing loaded)."""
    assert scan_checkpoint(build_checkpoint("yolov8n.yaml", tmp_path, names={0: "scratch", 1: "dent"})) \
        .class_names == ["scratch", "dent"]


@pytest.mark.parametrize("names", [{0: "scratch", 2: "dent"}, {0: ["not", "a", "name"]}, {"0": "scratch"},
                                   {0: "scratch", 1: "dent \ud800"}, {0: "scratch", 1: "de\x00nt"},
                                   {0: "scratch", 1: "de\nnt"}])
def test_names_that_are_not_a_plain_mapping_from_ids_are_not_known(names, tmp_path):
    """A name holding a lone UTF-16 surrogate (pickle keeps one; no page or answer can show it:
    trial27 F1) is not plain either, nor one holding a control character (a NUL was a 500 on
    PostgreSQL: trial28 F5; a data.yaml's class names are refused them)."""
    assert scan_checkpoint(build_checkpoint("yolov8n.yaml", tmp_path, names=names)).class_names is None


@pytest.mark.integration
def test_a_trained_checkpoint_with_optimizer_state_passes(tmp_path):
    """last.pt as training writes it: EMA, optimizer state, train_args (IterableSimpleNamespace, torch.Size)."""
    report = scan_checkpoint(trained_checkpoint(tmp_path))
    assert report.task == "detect" and report.class_names == ["rectangle", "circle", "triangle"]
    assert "ultralytics.utils.IterableSimpleNamespace" in report.globals or "torch.Size" in report.globals


def test_the_layer_list_is_generated_from_the_installed_libraries():
    """After upgrading torch or Ultralytics: scripts/checkpoint_allowlist.py, then review the diff."""
    import subprocess
    import sys

    from django.conf import settings

    result = subprocess.run([sys.executable, "scripts/checkpoint_allowlist.py", "--check"], cwd=settings.BASE_DIR,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)})
    assert result.returncode == 0, result.stderr


def test_every_admitted_layer_is_a_class_never_a_function_or_an_object():
    import torch.nn

    from apps.registry.checkpoint_layers import LAYER_CLASSES

    for name in LAYER_CLASSES:
        module, _, attr = name.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        assert inspect.isclass(obj), name
        assert issubclass(obj, torch.nn.Module) or module.startswith(("ultralytics.utils.loss",
                                                                        "ultralytics.utils.tal")), name
    assert len(LAYER_CLASSES) > 300


# --- the hostile corpus ---------------------------------------------------------------------------


def torch_zip(payload: bytes, path, *, members: dict[str, bytes] | None = None, top: str = "archive",
              compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr(f"{top}/data.pkl", payload)
        archive.writestr(f"{top}/version", b"3\n")
        for name, data in (members or {}).items():
            archive.writestr(name, data)
    return path


class Reduce:
    """Pickles as ``func(*args)``: what an attacker puts in a .pt."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def model_dict(evil) -> bytes:
    from collections import OrderedDict

    return pickle.dumps({"model": evil, "state": OrderedDict(a=1)}, protocol=4)


@pytest.mark.parametrize(("evil", "offending"), [
    (Reduce(os.system, ("touch /tmp/owned",)), "posix.system"),
    (Reduce(eval, ("1+1",)), "builtins.eval"),
    (Reduce(exec, ("import os",)), "builtins.exec"),
    (Reduce(__import__("subprocess").Popen, (["id"],)), "subprocess.Popen"),
    (Reduce(__import__("importlib").import_module, ("os",)), "importlib.import_module"),
    (Reduce(open, ("/etc/passwd",)), "io.open"),
])
def test_a_pickle_that_calls_anything_outside_the_list_is_refused_by_name(evil, offending, tmp_path):
    path = torch_zip(model_dict(evil), tmp_path / "evil.pt")
    with pytest.raises(CheckpointRefused) as refused:
        scan_checkpoint(path)
    assert refused.value.offending == offending and offending in str(refused.value)
    assert not os.path.exists("/tmp/owned")


def test_a_dotted_name_under_an_allowed_module_is_refused(tmp_path):
    """protocol 4 resolves ``Module.register_forward_hook`` by attribute walk: never admitted."""
    payload = (b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x17torch.nn.modules.module\x94"
               b"\x8c\x1cModule.register_forward_hook\x94\x93\x94.")
    with pytest.raises(CheckpointRefused) as refused:
        scan_checkpoint(torch_zip(payload, tmp_path / "dotted.pt"))
    assert "Module.register_forward_hook" in str(refused.value)


def test_getattr_may_only_name_plain_attributes(tmp_path):
    payload = pickle.dumps(Reduce(getattr, (Reduce(__import__("collections").OrderedDict, ()), "__class__")),
                           protocol=4)
    with pytest.raises(CheckpointRefused) as refused:
        scan_checkpoint(torch_zip(payload, tmp_path / "dunder.pt"))
    assert refused.value.offending == "builtins.getattr"


@pytest.mark.parametrize(("build", "words"), [
    (lambda p: torch_zip(model_dict(1), p, members={"other/data.pkl": b"x"}), "top folders"),
    (lambda p: torch_zip(model_dict(1), p, members={"archive/extra.pkl": b"x"}), "exactly one pickle"),
    (lambda p: torch_zip(model_dict(1), p, members={"archive/constants.pkl": b"x"}), "TorchScript"),
    (lambda p: torch_zip(model_dict(1), p, members={"archive/../../etc/x": b"x"}), "unsafe entry name"),
    (lambda p: torch_zip(model_dict(1), p, compression=zipfile.ZIP_DEFLATED), "compressed"),
    (lambda p: p.write_bytes(pickle.dumps({"model": 1}, protocol=2)) and p, "pre-1.6"),
    (lambda p: p.write_bytes(b"") or p, "empty"),
    (lambda p: p.write_bytes(b"GIF89a not a checkpoint") and p, "not a PyTorch checkpoint"),
    (lambda p: p.write_bytes(b"PK\x03\x04 truncated") and p, "damaged"),
    (lambda p: torch_zip(b"\x80\x02}q\x00(X\x05", p), "malformed"),
    (lambda p: torch_zip(pickle.dumps({"weights": [1, 2]}, protocol=2), p), "no Ultralytics model"),
])
def test_zip_tricks_and_non_checkpoints_are_refused_with_the_reason(build, words, tmp_path):
    path = tmp_path / "w.pt"
    built = build(path)
    with pytest.raises(CheckpointRefused) as refused:
        scan_checkpoint(built or path)
    assert words in str(refused.value)


def test_a_symlink_member_is_refused(tmp_path):
    path = tmp_path / "link.pt"
    torch_zip(model_dict(1), path)
    with zipfile.ZipFile(path, "a") as archive:
        info = zipfile.ZipInfo("archive/data/0")
        info.external_attr = 0o120777 << 16
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(CheckpointRefused, match="symbolic link"):
        scan_checkpoint(path)


def test_the_check_never_imports_torch_or_ultralytics(tmp_path):
    """The web process runs it: a fresh interpreter scanning a checkpoint loads neither."""
    import subprocess
    import sys

    path = torch_zip(model_dict(Reduce(__import__("collections").OrderedDict, ())), tmp_path / "plain.pt")
    probe = ("import sys; from apps.registry.checkpoint_scan import scan_checkpoint as s\n"
             f"try: s({str(path)!r})\nexcept Exception: pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ultralytics', 'django')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=str(__import__("django.conf").conf.settings.BASE_DIR))
    assert out.stdout.strip() == "[]"


def test_a_huge_pickle_member_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from apps.registry import checkpoint_scan

    monkeypatch.setattr(checkpoint_scan, "MAX_PICKLE_BYTES", 1024)
    path = torch_zip(io.BytesIO(b"\x80\x02" + b"N" * 4096 + b".").getvalue(), tmp_path / "big.pt")
    with pytest.raises(CheckpointRefused, match="far smaller"):
        scan_checkpoint(path)

"""Spec parsing of the other job kinds: val, predict, export, and exports after training."""

from __future__ import annotations

import pytest

from apps.jobs.spec import SpecError, command_parse, parse_spec


def spec(command: str | None = None, **fields):
    document = {"task_name": "t", **({"command": command} if command else {}), **fields}
    return parse_spec(document)


def errors(command: str | None = None, **fields) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        spec(command, **fields)
    return caught.value.errors


def test_val_takes_a_registered_version_a_dataset_and_a_split():
    parsed = spec("yolo val model=pcb:v2 data=pcb_defect.yaml split=test conf=0.25")
    assert parsed.mode == "val"
    assert parsed.train_args == {"model": "pcb:v2", "data": "pcb_defect.yaml", "split": "test", "conf": 0.25}


def test_val_defaults_to_the_validation_split():
    assert spec("yolo val model=pcb:v2 data=pcb").train_args["split"] == "val"


def test_predict_takes_a_source_and_optional_split():
    parsed = spec("yolo detect predict model=pcb:latest source=shots conf=0.5")
    assert (parsed.mode, parsed.task) == ("predict", "detect")
    assert parsed.train_args == {"model": "pcb:latest", "source": "shots", "conf": 0.5, "split": "val"}


def test_export_takes_a_format_and_precision_flags():
    parsed = spec("yolo export model=pcb:v3 format=onnx half=true dynamic=true imgsz=128")
    assert parsed.mode == "export" and parsed.requires == []
    assert parsed.train_args == {"model": "pcb:v3", "format": "onnx", "half": True, "dynamic": True, "imgsz": 128}


def test_an_engine_export_needs_a_tensorrt_node():
    assert spec("yolo export model=pcb:v3 format=engine").requires == ["tensorrt"]


@pytest.mark.parametrize(("command", "field", "words"), [
    ("yolo val data=demo", "command.model", "is required"),
    ("yolo val model=pcb:v1 data=d split=holdout", "command.split", "must be one of val, test, train"),
    ("yolo val model=pcb:v1 data=d epochs=3", "command.epochs", "not an allowed val argument"),
    ("yolo predict model=pcb:v1", "command.source", "is required"),
    ("yolo predict model=pcb:v1 source=/etc", "command.source", "no '/' prefix"),
    ("yolo predict model=pcb:v1 source=s save_txt=true", "command.save_txt", "cannot be set"),
    ("yolo export model=pcb:v1", "command.format", "is required"),
    ("yolo export model=pcb:v1 format=coreml", "command.format", "must be one of onnx, torchscript, engine"),
    ("yolo export model=pcb:v1 format=onnx half=true int8=true", "command.int8", "not both"),
    ("yolo benchmark model=pcb:v1", "command", "not supported"),
])
def test_a_bad_argument_of_another_mode_is_named(command, field, words):
    assert words in errors(command)[field]


def test_a_missing_argument_says_what_to_give():
    """Trial 23: a missing argument was answered "is required", nothing more. (A val's ``data=`` may
    be left out: the registered model's own dataset, resolved at submit, tests/registry/test_lineage.py.)"""
    assert "data" not in spec("yolo val model=pcb:v1").train_args
    assert errors("yolo export model=pcb:v1")["command.format"] == (
        "is required: onnx, torchscript or engine (format=onnx)")


def test_a_training_spec_may_export_after_success():
    parsed = spec("yolo train data=demo model=yolov8n.yaml", export=["onnx", "torchscript"])
    assert parsed.mode == "train" and parsed.export == ["onnx", "torchscript"]
    assert parsed.as_dict()["export"] == ["onnx", "torchscript"]


@pytest.mark.parametrize(("value", "words"), [
    (["engine"], "export job of its own"),
    (["coreml"], "is not a format exported after training"),
    (7, "must be a list of formats"),
])
def test_exports_after_training_are_checked(value, words):
    assert words in errors("yolo train data=demo model=yolov8n.yaml", export=value)["export"]


def test_an_empty_list_of_exports_is_no_export():
    """``export: []`` was answered "must be a list of formats" (it is a list): it means export nothing."""
    assert spec("yolo train data=demo model=yolov8n.yaml", export=[]).export == []
    assert spec("yolo val model=p:v1 data=d", export=[]).mode == "val"


def test_a_list_of_exports_belongs_to_training_only():
    assert "belongs in a training spec" in errors("yolo val model=p:v1 data=d", export=["onnx"])["export"]


def test_the_structured_forms_of_the_other_modes():
    assert spec(val={"model": "p:v1", "data": "d"}).mode == "val"
    assert spec(predict={"model": "p:v1", "source": "s"}).train_args["source"] == "s"
    exported = spec(export={"model": "p:v1", "format": "torchscript"})
    assert (exported.mode, exported.export, exported.train_args["format"]) == ("export", [], "torchscript")
    assert "val.model" in errors(val={"data": "d"})


def test_two_modes_at_once_are_refused():
    assert "not several" in " ".join(errors(val={"model": "p:v1", "data": "d"},
                                              predict={"model": "p:v1", "source": "s"}).values())
    assert "not both" in errors("yolo train data=d model=yolov8n.yaml", val={"model": "p", "data": "d"})["command"]


def test_the_mode_is_part_of_what_makes_a_job_a_duplicate():
    val = spec("yolo val model=p:v1 data=d")
    predict = spec("yolo predict model=p:v1 source=d")
    assert val.fingerprint() != predict.fingerprint()
    assert val.runtime_signature() != predict.runtime_signature()


def test_the_command_grammar_names_the_mode():
    assert command_parse("yolo segment export model=m:v1 format=onnx")[:2] == ("segment", "export")

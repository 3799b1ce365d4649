"""Spec parsing: the seed example is accepted; every invalid field is named in the error."""

from __future__ import annotations

import pytest
import yaml

from apps.core.strict_yaml import YamlError, load_yaml
from apps.jobs.spec import SpecError, parse_command, parse_spec
from tests.conftest import SEED_SPEC

DESIGN_SEED = """\
task_name: yolo-v8s-industrial-inspection
image: ultralytics/yolov8:latest        # recorded; used by container backends
command: "yolo train data=pcb_defect.yaml model=yolov8s.pt epochs=100 imgsz=640"
resources: {gpu: 1, memory: 16Gi, cpu: "4"}   # gpu may be fractional (0.25, 0.5)
priority: medium                        # low | medium | high | urgent
user: team-a                            # the team to charge (or the caller's own name)
timeout: 72000                          # seconds, hard limit, also the backfill walltime
"""


def spec_from(text: str):
    return parse_spec(load_yaml(text, max_bytes=64 * 1024))


def errors_of(document) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(document)
    return caught.value.errors


def seed(**changes) -> dict:
    document = yaml.safe_load(SEED_SPEC)
    for key, value in changes.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    return document


def test_it_accepts_the_design_seed_example_as_is():
    spec = spec_from(DESIGN_SEED)
    assert spec.task_name == "yolo-v8s-industrial-inspection"
    assert spec.task == "detect"
    assert spec.train_args == {"data": "pcb_defect.yaml", "model": "yolov8s.pt", "epochs": 100, "imgsz": 640}
    assert spec.gpus == 1 and spec.memory_mb == 16 * 1024 and spec.cpu_milli == 4000
    assert spec.priority == "medium" and spec.charge_to == "team-a" and spec.timeout_s == 72000
    assert spec.image == "ultralytics/yolov8:latest"


def test_a_spec_may_say_it_must_not_be_preempted_and_how_long_it_expects_to_run():
    spec = parse_spec(seed(preemptible=False, expected_duration=1800))
    assert spec.preemptible is False and spec.expected_duration_s == 1800
    default = parse_spec(seed())
    assert default.preemptible is True and default.expected_duration_s == 0


def test_it_accepts_structured_train_arguments_and_fractional_gpus():
    spec = parse_spec({"task_name": "s", "task": "segment", "train": {"data": "demo", "model": "yolov8n-seg.yaml",
                                                                      "epochs": "3", "lr0": 0.01},
                       "resources": {"gpu": 0.25}})
    assert spec.task == "segment" and spec.train_args["epochs"] == 3 and spec.gpus == 0.25


def test_it_reads_the_task_word_before_the_mode():
    task, args, errors = parse_command("yolo pose train data=d model=yolov8n-pose.yaml")
    assert (task, errors) == ("pose", {}) and args == {"data": "d", "model": "yolov8n-pose.yaml"}


def test_the_fingerprint_ignores_who_and_when_but_not_what():
    a, b = parse_spec(seed()), parse_spec(seed(task_name="other", priority="high"))
    c = parse_spec(seed(command="yolo train data=demo model=yolov8n.yaml epochs=3 imgsz=128"))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


INVALID_FIELDS = [
    ({"task_name": None}, "task_name"),
    ({"task_name": "x" * 201}, "task_name"),
    ({"task_name": "rm -rf /; echo"}, "task_name"),
    ({"command": None}, "command"),
    ({"command": "python train.py"}, "command"),
    ({"command": "yolo benchmark data=demo model=yolov8n.yaml"}, "command"),
    ({"command": "yolo train data=demo model=yolov8n.yaml 'unterminated"}, "command"),
    ({"command": "yolo train data=demo model=yolov8n.yaml ; rm -rf /"}, "command"),
    ({"command": "yolo train model=yolov8n.yaml"}, "command.data"),
    ({"command": "yolo train data=demo"}, "command.model"),
    ({"command": "yolo train data=demo model=yolov8n.yaml epochs=ten"}, "command.epochs"),
    ({"command": "yolo train data=demo model=yolov8n.yaml epochs=0"}, "command.epochs"),
    ({"command": "yolo train data=demo model=yolov8n.yaml imgsz=1e9"}, "command.imgsz"),
    ({"command": "yolo train data=demo model=yolov8n.yaml lr0=nan"}, "command.lr0"),
    ({"command": "yolo train data=demo model=yolov8n.yaml device=0"}, "command.device"),
    ({"command": "yolo train data=demo model=yolov8n.yaml project=/etc"}, "command.project"),
    ({"command": "yolo train data=demo model=yolov8n.yaml resume=True"}, "command.resume"),
    ({"command": "yolo train data=demo model=yolov8n.yaml exec=os.system"}, "command.exec"),
    ({"command": "yolo train data=/etc/passwd model=yolov8n.yaml"}, "command.data"),
    ({"command": "yolo train data=../../etc model=yolov8n.yaml"}, "command.data"),
    ({"command": "yolo train data=$(id) model=yolov8n.yaml"}, "command.data"),
    ({"command": "yolo train data=demo model=`id`.pt"}, "command.model"),
    ({"command": "yolo train data=demo model=yolov8n.yaml optimizer=SGD;id"}, "command.optimizer"),
    ({"command": "yolo train data=demo model=yolov8n.yaml epochs=1 epochs=2"}, "command.epochs"),
    ({"command": "yolo train data=demo model=yolov8n.yaml batch=0"}, "command.batch"),
    # trial26: passed submit, then failed at once ("'fraction=0.0' invalid. Use … ratio (0, 1]").
    ({"command": "yolo train data=demo model=yolov8n.yaml fraction=0"}, "command.fraction"),
    ({"command": "yolo train data=demo model=yolov8n.yaml amp=maybe"}, "command.amp"),
    ({"command": "yolo train data=demo model=yolov8n.yaml epochs=None"}, "command.epochs"),
    ({"resources": "lots"}, "resources"),
    ({"resources": {"gpu": 1.5}}, "resources.gpu"),
    ({"resources": {"gpu": 0.3}}, "resources.gpu"),
    ({"resources": {"gpu": -1}}, "resources.gpu"),
    ({"resources": {"gpu": True}}, "resources.gpu"),
    ({"resources": {"memory": "lots"}}, "resources.memory"),
    ({"resources": {"cpu": "four"}}, "resources.cpu"),
    ({"resources": {"tpu": 1}}, "resources.tpu"),
    ({"resources": {"gpu_model": [1]}}, "resources.gpu_model"),
    ({"priority": "critical"}, "priority"),
    ({"user": "team a; rm"}, "user"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": "forever"}, "timeout"),
    ({"retries": 99}, "retries"),
    ({"allow_duplicate": "sure"}, "allow_duplicate"),
    ({"preemptible": "never"}, "preemptible"),
    ({"expected_duration": "a while"}, "expected_duration"),
    ({"expected_duration": 0}, "expected_duration"),
    ({"timeout": 600, "expected_duration": 3600}, "expected_duration"),
    ({"image": ["x"]}, "image"),
    ({"description": "d" * 301}, "description"),
    ({"shell": "bash"}, "shell"),
    ({"task": "detect"}, "task"),
    ({"train": {"data": "demo", "model": "yolov8n.yaml"}}, "command"),
]


@pytest.mark.parametrize(("changes", "field"), INVALID_FIELDS, ids=[f for _, f in INVALID_FIELDS])
def test_each_invalid_field_is_named_in_the_error(changes, field):
    errors = errors_of(seed(**changes))
    assert field in errors, errors
    assert errors[field]


@pytest.mark.parametrize("field", ["state", "node", "gpus", "attempt", "priority_factors", "queue_position", "id"])
def test_platform_fields_are_refused_as_mass_assignment(field):
    errors = errors_of(seed(**{field: "x"}))
    assert errors[field].startswith("cannot be set")


def test_structured_train_arguments_name_their_path():
    errors = errors_of({"task_name": "s", "train": {"data": "demo", "model": "m.yaml", "epochs": -1, "bogus": 1},
                        "task": "dance"})
    assert {"train.epochs", "train.bogus", "task"} <= set(errors)


def test_a_document_that_is_not_a_mapping_is_refused():
    assert "spec" in errors_of(["task_name", "x"])


def test_several_problems_are_reported_together():
    errors = errors_of(seed(priority="critical", timeout=-5, resources={"gpu": 0.3}))
    assert {"priority", "timeout", "resources.gpu"} <= set(errors)


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n",
    "task_name: !!python/object/apply:os.system ['id']\n",
    "[" * 100 + "]" * 100,
    "task_name: " + "1" * 5000 + "\n",
    "task_name: [unclosed\n",
    b"task_name: \xff\xfe\n",
])
def test_hostile_yaml_is_a_spec_error_not_a_crash(text):
    with pytest.raises(YamlError) as caught:
        load_yaml(text, max_bytes=64 * 1024)
    assert "spec" in caught.value.errors


@pytest.mark.parametrize("gpu", [0, -1, 65, 1.5, 0.3, "two", True])
def test_every_refused_gpu_count_says_what_is_allowed(gpu):
    """0 and -1 got different stories ("whole number … got 0", "between 0 and 64"), neither the whole truth."""
    assert errors_of(seed(resources={"gpu": gpu}))["resources.gpu"] == (
        f"must be a whole number of GPUs from 1 to 64, or 0.125, 0.25 or 0.5 of one GPU; got {gpu!r}")


@pytest.mark.parametrize("gpu", [0.125, 0.25, 0.5, 1, 2, "4", 64])
def test_the_gpu_counts_the_message_names_are_accepted(gpu):
    assert parse_spec(seed(resources={"gpu": gpu})).gpus == float(gpu)


@pytest.mark.parametrize(("task_name", "message"), [
    (5, "must be a string (a short name for the job), got 5"),
    (["a"], "must be a string (a short name for the job), got ['a']"),
    (None, "is required (a short name for the job)"),
    ("  ", "is required (a short name for the job)"),
])
def test_a_task_name_of_the_wrong_type_is_not_called_missing(task_name, message):
    assert errors_of(seed(task_name=task_name))["task_name"] == message


@pytest.mark.parametrize(("text", "path", "lines"), [
    ("task_name: a\ntask_name: b\n", "task_name", "lines 1 and 2"),
    ("resources:\n  gpu: 1\n  gpu: 2\n", "resources.gpu", "lines 2 and 3"),
    ("args: [{x: 1, x: 2}]\n", "args[0].x", "line 1"),
    ("1: a\n01: b\n", "1", "lines 1 and 2"),  # equal once built: the dict would have merged them
])
def test_a_key_given_twice_is_refused_under_its_path(text, path, lines):
    with pytest.raises(YamlError) as caught:
        load_yaml(text, max_bytes=64 * 1024)
    assert caught.value.errors == {path: f"given twice in the YAML ({lines})"}


def test_the_same_key_in_two_mappings_is_not_a_duplicate():
    assert load_yaml("a: {b: 1}\nc: {b: 2}\n", max_bytes=1024) == {"a": {"b": 1}, "c": {"b": 2}}


def test_yaml_over_the_size_cap_is_refused_before_parsing():
    with pytest.raises(YamlError, match="limit"):
        load_yaml("a: b\n" * 20000, max_bytes=64 * 1024)


def test_any_document_either_parses_or_raises_a_named_spec_error():
    """Property: whatever JSON-like document arrives, the parser answers with a spec or field errors."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=10), inner, max_size=3), max_leaves=8)
    keys = st.sampled_from(["task_name", "command", "train", "task", "resources", "priority", "user", "team",
                            "timeout", "retries", "allow_duplicate", "image", "description", "state"]) | st.text()
    argument = st.builds("{}={}".format, st.sampled_from(["data", "model", "epochs", "batch", "lr0", "device", "x"]),
                         st.text(max_size=8))
    command = st.builds(lambda words: "yolo train " + " ".join(words), st.lists(argument, max_size=5))

    @given(st.dictionaries(keys, values | command, max_size=6))
    @settings(max_examples=120, deadline=None, database=None)
    def check(document):
        try:
            parse_spec(document)
        except SpecError as exc:
            assert exc.errors and all(isinstance(k, str) and v for k, v in exc.errors.items())

    check()


@pytest.mark.parametrize(("changes", "field"), [
    ({"description": "a\x00b"}, "description"),
    ({"task_name": "x\x00"}, "task_name"),
    ({"resources": {"gpu_model": ["A100", "H\x00"]}}, "resources.gpu_model[1]"),
])
def test_a_nul_character_anywhere_is_refused_by_name(changes, field):
    """PostgreSQL cannot store NUL in text or jsonb: it is a 400 naming the field, never a 500."""
    assert errors_of(seed(**changes)) == {field: "must not contain a NUL character"}


@pytest.mark.parametrize(("command", "message"), [
    ("yolo train data=demo model=yolov8n.yaml --epochs 3",
     "expected key=value words, got '--epochs', '3' (Ultralytics takes epochs=3, not --epochs 3)"),
    ("yolo train data=demo model=yolov8n.yaml epochs=1 ; rm -rf /",
     "expected key=value words, got ';', 'rm', '-rf', '/' (Ultralytics takes epochs=3, not --epochs 3)"),
    ("yolo train data=demo a b c d e f g", "expected key=value words, got 'a', 'b', 'c', 'd', 'e' and 2 more"),
])
def test_every_word_that_is_no_key_value_is_named(command, message):
    """Trial 20: "--epochs 3" was refused naming only '3', the last stray word."""
    assert errors_of({"task_name": "t", "command": command})["command"] == message


@pytest.mark.parametrize(("command", "args"), [
    ("yolo train data=demo model=yolov8n.yaml epochs=3 cos_lr", {"cos_lr": True}),
    ("yolo train data=demo model=yolov8n.yaml rect single_cls epochs=3", {"rect": True, "single_cls": True}),
    ("yolo train data=demo model=yolov8n.yaml cache", {"cache": True}),
    ("yolo export model=yolov8n.pt format=onnx half", {"half": True}),
    ("yolo predict model=yolov8n.pt source=demo agnostic_nms", {"agnostic_nms": True}),
])
def test_a_bare_boolean_argument_is_true_as_ultralytics_reads_it(command, args):
    """Trial 31: `yolo export … half` and `yolo train … cos_lr` are Ultralytics commands (its entrypoint
    takes a bare boolean argument as =True); they were refused "expected key=value words, got 'half'"."""
    spec = parse_spec({"task_name": "t", "command": command, "resources": {"gpu": 1}})
    assert {key: spec.train_args[key] for key in args} == args


@pytest.mark.parametrize(("command", "field", "message"), [
    ("yolo train data=demo model=yolov8n.yaml resume", "command.resume",
     "cannot be set: managed by the platform (jobs resume from their own checkpoints)"),
    ("yolo train data=demo model=yolov8n.yaml plots", "command.plots",
     "cannot be set: set by the platform (plots need fonts that are downloaded)"),
    ("yolo train data=demo model=yolov8n.yaml epochs", "command.epochs",
     "is missing its value: write epochs=<value> (only true/false arguments may stand alone)"),
    ("yolo val model=yolov8n.pt data=demo cos_lr", "command.cos_lr",
     "is not an allowed val argument (allowed: batch, conf, data, half, imgsz, iou, max_det, model, rect, "
     "single_cls, split, verbose, workers)"),
])
def test_a_bare_argument_that_cannot_stand_alone_is_refused_by_its_name(command, field, message):
    """`yolo train … resume` (Ultralytics' own way to resume) was "expected key=value words, got 'resume'":
    the answer now says why resume is not the user's to set."""
    errors = errors_of({"task_name": "t", "command": command, "resources": {"gpu": 1}})
    assert errors.get(field) == message, errors
    assert "command" not in errors


def test_a_command_is_split_into_the_words_shlex_gives():
    """Property: the quick split (no quotes or backslashes) gives shlex's words, or shlex's error."""
    import shlex

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from apps.jobs.spec import command_words

    @given(st.text(alphabet=" \t\r\n\x0b\x0c\xa0\u2003ab=.'\"\\#;|\x00", max_size=20))
    @settings(max_examples=400, deadline=None, database=None)
    def check(command):
        try:
            expected = shlex.split(command)
        except ValueError:
            with pytest.raises(ValueError):
                command_words(command)
            return
        assert command_words(command) == expected

    check()


def test_the_stored_spec_is_what_dataclasses_asdict_gives_and_shares_nothing_with_the_spec():
    """as_dict copies what it keeps (submit writes a sweep's seed into the stored copy)."""
    from dataclasses import asdict

    spec = parse_spec({"task_name": "s", "command": "yolo train data=demo model=yolov8n.yaml epochs=3 optimizer=SGD",
                       "resources": {"gpu_model": ["A100", "H100"]},
                       "sweep": {"trials": 2, "seed": 7, "parameters": {"lr0": {"low": 0.001, "high": 0.01},
                                                                       "batch": [8, 16]}}})
    expected = asdict(spec)
    del expected["charge_field"], expected["sweep_metric_given"], expected["split_given"]
    stored = spec.as_dict()
    assert stored == expected
    stored["sweep"]["seed"] = 8
    stored["sweep"]["parameters"]["batch"]["choices"].append(32)
    stored["train_args"]["epochs"] = 99
    stored["gpu_models"].append("T4")
    assert spec.sweep["seed"] == 7
    assert spec.sweep["parameters"]["batch"]["choices"] == [8, 16]
    assert spec.train_args["epochs"] == 3
    assert spec.gpu_models == ["A100", "H100"]


def test_a_number_too_large_for_a_float_is_refused_naming_its_field():
    """``lr0: 0xfff…`` or ``resources: {gpu: 0xfff…}`` (a YAML hex integer): float() of it raised
    OverflowError, which no parser caught (a 500 at submit, review27)."""
    huge = int("f" * 4000, 16)
    errors = errors_of(seed(train={"data": "demo", "model": "yolov8n.yaml", "lr0": huge}, command=None,
                            resources={"gpu": huge}))
    assert errors["train.lr0"] == "must be between 0 and 10, got a number of more than 100 digits"
    assert errors["resources.gpu"].startswith("must be a whole number of GPUs from 1 to")
    assert errors["resources.gpu"].endswith("got a number of more than 100 digits")


def test_an_integer_too_long_to_write_out_is_refused_in_words():
    """``epochs: 0xfff…``: the refusal was Python's own "Exceeds the limit (4300 digits) for integer
    string conversion", the error its formatting raised (review27)."""
    huge = int("f" * 4000, 16)
    errors = errors_of(seed(train={"data": "demo", "model": "yolov8n.yaml", "epochs": huge}, command=None))
    assert errors["train.epochs"] == "must be between 1 and 10000, got a number of more than 100 digits"


@pytest.mark.parametrize("key", ["memory", "gpu_memory"])
def test_a_memory_past_a_floats_range_is_refused_naming_its_field(key):
    """``resources: {memory: 10**400}`` (a JSON integer of 401 digits): dividing it into MiB raised
    OverflowError, a 500 at submit (review27)."""
    errors = errors_of(seed(resources={"gpu": 1, key: 10**400}))
    assert errors[f"resources.{key}"] == "is out of range: a number of more than 100 digits"


@pytest.mark.parametrize("lr0", ["5e-324", "1e-13"])
def test_a_training_number_that_rounds_to_zero_is_refused_naming_it(lr0):
    """trial28: lr0 of 5e-324 was taken (a sweep of them trained with no learning rate at all)."""
    errors = errors_of(seed(command=f"yolo train data=demo model=yolov8n.yaml lr0={lr0}"))
    assert errors == {"command.lr0": "is too close to 0 (a grid keeps 12 decimals): give 0 or at least 1e-12 in "
                                     f"size; got {lr0!r}"}


@pytest.mark.parametrize("key", ["memory", "gpu_memory"])
@pytest.mark.parametrize("memory", ["0.0000000001Gi", "1Ki", "1000", 1, 1e-300, "0.5Mi"])
def test_a_memory_below_one_mebibyte_is_refused_not_rounded_up(key, memory):
    """trial28: "0.0000000001Gi" was taken as a 1 MiB limit, which no training survives."""
    errors = errors_of(seed(resources={"gpu": 1, key: memory}))
    assert errors == {f"resources.{key}": f"is less than 1Mi: give 0 for none, or at least 1Mi; got {memory!r}"}


@pytest.mark.parametrize(("memory", "mib"), [(0, 0), ("0Gi", 0), ("1Mi", 1), ("1.5Mi", 2), (2**20, 1), ("96Mi", 96)])
def test_no_memory_and_a_mebibyte_or_more_are_taken(memory, mib):
    assert parse_spec(seed(resources={"gpu": 1, "memory": memory})).memory_mb == mib

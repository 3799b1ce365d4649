"""yoloq and the model registry against a live server: list the versions, show one, move one to
another stage, pull a version's weights and an export job's file (CI trial 17, H13: all of it was
API-only, though docs/lifecycle.md says it all works from yoloq)."""

from __future__ import annotations

import hashlib
import json

import pytest

from apps.registry.models import Export, ModelVersion
from tests.portal.test_job_modes import pcb, submit, succeed  # noqa: F401 - fixture

from .test_yoloq_manager import login, run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_model_list_gives_every_version_of_the_callers_teams_page_after_page(web, config, bob, carol, teams, capsys):
    """models/ is a paged list (1000 at most a page): yoloq reads every page."""
    ModelVersion.objects.bulk_create(ModelVersion(team=teams["vision"], name="pcb", version=n) for n in range(1, 1002))
    ModelVersion.objects.create(team=teams["vision"], name="belt", version=1, stage="production", task="detect", source="upload",
                                metrics={"metrics/mAP50-95(B)": 0.4125})
    ModelVersion.objects.create(team=teams["robotics"], name="arm", version=1)
    login(web, bob, capsys)

    code, out, _ = run(capsys, "model", "list")

    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "MODEL", "TEAM", "STAGE", "TASK", "FROM", "mAP50-95", "CREATED"]
    assert len(lines) == 1 + 1002 and "arm:v1" not in out
    assert {line.split()[1] for line in lines[1:]} >= {"pcb:v1", "pcb:v1001", "belt:v1"}
    assert any(line.split()[1:7] == ["belt:v1", "vision", "production", "detect", "upload", "0.4125"]
               for line in lines)

    code, out, _ = run(capsys, "model", "list", "--stage", "production", "--json")
    assert code == 0 and [v["reference"] for v in json.loads(out)] == ["belt:v1"]
    code, out, _ = run(capsys, "model", "list", "--name", "arm")
    assert code == 0 and out == "No model versions match.\n"
    code, _, err = run(capsys, "model", "list", "--stage", "bogus")  # the API's 400, naming its field
    assert code == 1 and "stage: must be one of none, staging, production, archived, got 'bogus'" in err
    code, _, err = run(capsys, "model", "list", "--team", "robotics")
    assert code == 1 and "team: you are not a member of a team named 'robotics'" in err


def test_a_manager_promotes_a_version_by_its_reference_and_the_previous_one_is_archived(web, config, alice, bob,
                                                                                        teams, capsys):
    old = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, stage="production")
    new = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=2, stage="staging")
    login(web, bob, capsys)
    code, _, err = run(capsys, "model", "stage", "pcb:v2", "production")
    assert code == 1 and "Only a manager of the team may change a model's stage." in err

    login(web, alice, capsys)
    code, out, err = run(capsys, "model", "stage", "pcb:v2", "production")
    assert code == 0, err
    assert out == "pcb:v2 (vision): staging → production.\n  and pcb:v1: production → archived\n"
    old.refresh_from_db(), new.refresh_from_db()
    assert (old.stage, new.stage) == ("archived", "production")

    code, out, _ = run(capsys, "model", "stage", str(new.pk), "production")
    assert code == 0 and out == "pcb:v2 (vision) is already in production; nothing changed.\n"
    code, _, err = run(capsys, "model", "stage", "pcb:v1", "production")  # the API's 400, naming its field
    assert code == 1 and "stage: pcb:v1 is in archived; it can move to staging" in err
    code, _, err = run(capsys, "model", "stage", "pcb:v9", "staging")
    assert code == 1 and "no model pcb:v9 in your teams (yoloq model list --name pcb lists its versions)" in err


def test_model_pull_saves_a_versions_weights_verified_against_their_sha256(web, config, bob, carol, tmp_path, capsys,
                                                                           pcb):  # noqa: F811
    login(web, bob, capsys)
    target = tmp_path / "got.pt"

    code, out, err = run(capsys, "model", "pull", pcb.reference, "-o", str(target))

    assert code == 0, err
    assert target.read_bytes() == b"weights" and pcb.sha256 == hashlib.sha256(b"weights").hexdigest()
    assert out == (f"Saved {target}: pcb:v1 of team vision (in no stage)\n"
                   f"  sha256 {pcb.sha256} (verified)\n")
    code, out, err = run(capsys, "model", "pull", str(pcb.pk), "-o", str(tmp_path))  # a folder: the server's name
    assert code == 0, err
    assert (tmp_path / "pcb-v1.pt").read_bytes() == b"weights" and out.startswith(f"Saved {tmp_path / 'pcb-v1.pt'}")

    # trial26: a folder that does not exist was a Python traceback (FileNotFoundError), after the download.
    missing = tmp_path / "no-such-folder" / "x.pt"
    code, out, err = run(capsys, "model", "pull", pcb.reference, "-o", str(missing))
    assert code == 1 and "Traceback" not in err and not missing.parent.exists()
    assert f"-o: {missing.parent} is no folder; nothing was downloaded" in err, err

    code, out, _ = run(capsys, "model", "show", pcb.reference)
    assert code == 0 and f"model: pcb:v1  (id {pcb.pk}, team vision)" in out
    assert f"from: job {pcb.job_id} (yoloq status {str(pcb.job_id)[:8]})" in out and "dataset: demo:v1" in out
    assert f"sha256 {pcb.sha256} (yoloq model pull {pcb.pk})" in out

    login(web, carol, capsys)
    code, _, err = run(capsys, "model", "pull", str(pcb.pk))
    assert code == 1 and "No model with that id in your teams." in err


def test_a_version_is_named_by_latest_staging_or_production_as_specs_name_it(web, config, bob, teams, capsys):
    """`yoloq model pull pcb:production` was refused ("give a version's id … or name:vN"), though a spec's
    model=pcb:production names that version (new-user trial 27, F4)."""
    for number, stage in ((1, "production"), (2, "staging"), (3, "staging"), (4, "none")):
        ModelVersion.objects.create(team=teams["vision"], name="belt", version=number, stage=stage)
    ModelVersion.objects.create(team=teams["robotics"], name="belt", version=9, stage="production")
    login(web, bob, capsys)
    for ref, shown in (("belt:production", "belt:v1"), ("belt:staging", "belt:v3"), ("belt:latest", "belt:v4")):
        code, out, err = run(capsys, "model", "show", ref)
        assert code == 0 and f"model: {shown}  (id" in out, (ref, out, err)
    ModelVersion.objects.filter(name="belt", stage="staging").update(stage="archived")
    code, _, err = run(capsys, "model", "show", "belt:staging")
    assert code == 1 and "no version of belt is in staging in your teams" in err, err
    code, _, err = run(capsys, "model", "show", "belt")
    assert code == 1 and "name:vN, name:latest, name:staging or name:production" in err, err


def export_job(bob, pcb):  # noqa: F811 - the fixture's value
    """An export job of pcb:v1 to onnx, recorded as the worker records it."""
    job = submit(bob, f"yolo export model={pcb.reference} format=onnx", "pcb-onnx")
    onnx = job.run_dir / "export" / "best.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx bytes")
    return succeed(job, {"mode": "export", "exports": [{"format": "onnx", "path": str(onnx), "options": {},
                                                        "verification": {"passed": True}}]})


def test_export_pull_saves_an_export_jobs_file_and_weights_pull_points_to_it(web, config, bob, tmp_path, capsys,
                                                                            pcb):  # noqa: F811
    job = export_job(bob, pcb)
    export = Export.objects.get(job=job)
    login(web, bob, capsys)

    code, _, err = run(capsys, "weights", "pull", str(job.pk)[:8])  # was: "A export job trains nothing, …"
    assert code == 1
    assert err == (f"yoloq: {job.pk} (pcb-onnx) is an export job: it trains nothing, so it has no weights; "
                   f"its exported files: yoloq export pull {str(job.pk)[:8]}\n")

    target = tmp_path / "model.onnx"
    code, out, err = run(capsys, "export", "pull", str(job.pk)[:8], "-o", str(target))
    assert code == 0, err
    assert target.read_bytes() == b"onnx bytes" and export.sha256 == hashlib.sha256(b"onnx bytes").hexdigest()
    assert out == (f"Saved {target}: the onnx export of pcb-onnx (verified against PyTorch)\n"
                   f"  sha256 {export.sha256} (verified)\n")

    code, _, err = run(capsys, "export", "pull", str(job.pk)[:8], "--format", "torchscript")
    assert code == 1 and f"{job.pk} (pcb-onnx) exported no torchscript file (it exported onnx)" in err
    code, _, err = run(capsys, "export", "pull", str(pcb.job_id)[:8])
    assert code == 1
    assert f"is a train job that exports nothing; its weights: yoloq weights pull {str(pcb.job_id)[:8]}" in err
    code, out, _ = run(capsys, "model", "show", str(pcb.pk))
    assert f"export: onnx, 10 bytes, verified (yoloq export pull {str(job.pk)[:8]})" in out
    code, out, _ = run(capsys, "status", str(job.pk)[:8])  # trial 23: only the download URL, whose id is no job's
    assert f"export: onnx, 10 bytes, verified (yoloq export pull {str(job.pk)[:8]}; download: http" in out


SEGMENT_METRICS = {"metrics/precision(B)": 0.9, "metrics/recall(B)": 0.8, "metrics/mAP50(B)": 0.85,
                   "metrics/mAP50-95(B)": 0.61, "metrics/precision(M)": 0.7, "metrics/recall(M)": 0.6,
                   "metrics/mAP50(M)": 0.55, "metrics/mAP50-95(M)": 0.33, "fitness": 0.94}


def test_a_segment_models_figures_are_its_masks_and_say_so(web, config, bob, teams, capsys):
    """Its box mAP (the first key of Ultralytics' results) was shown as the model's mAP50-95 (trial21)."""
    ModelVersion.objects.create(team=teams["vision"], name="wires", version=1, task="segment", source="upload",
                                metrics=SEGMENT_METRICS)
    login(web, bob, capsys)

    code, out, _ = run(capsys, "model", "list", "--name", "wires")
    assert code == 0 and out.splitlines()[1].split()[1:8] == ["wires:v1", "vision", "none", "segment", "upload",
                                                              "0.33", "(mask)"]
    code, out, _ = run(capsys, "model", "show", "wires:v1")
    assert code == 0 and "metrics: mAP50-95 0.33 (mask), mAP50 0.55 (mask)" in out


CLASSIFY_METRICS = {"metrics/accuracy_top1": 0.75, "metrics/accuracy_top5": 1.0, "fitness": 0.875}


def test_a_classifiers_figures_are_its_accuracy_and_say_so(web, config, bob, teams, capsys):
    """A classify model has no mAP: its list row and page showed "-" for every figure it has."""
    ModelVersion.objects.create(team=teams["vision"], name="pets", version=1, task="classify", source="upload",
                                metrics=CLASSIFY_METRICS)
    login(web, bob, capsys)

    code, out, _ = run(capsys, "model", "list", "--name", "pets")
    assert code == 0 and out.splitlines()[1].split()[1:8] == ["pets:v1", "vision", "none", "classify", "upload",
                                                              "0.75", "(top-1)"]
    code, out, _ = run(capsys, "model", "show", "pets:v1")
    assert code == 0 and "metrics: top-1 accuracy 0.75, top-5 1" in out


def test_a_pull_that_broke_off_resumes_its_part_and_a_part_of_other_bytes_starts_over(web, config, bob, tmp_path,
                                                                                        capsys, pcb):  # noqa: F811
    """page 32: the server answers Range (206); a pull finding ``<target>.part`` asks for the rest
    only, and checks the joined file against the server's sha256 (a 200 MB weights file over a
    flaky link restarted from its first byte before)."""
    login(web, bob, capsys)
    target = tmp_path / "got.pt"
    part = tmp_path / "got.pt.part"
    part.write_bytes(b"wei")  # what an earlier pull kept when the link broke

    code, out, err = run(capsys, "model", "pull", pcb.reference, "-o", str(target))

    assert code == 0, err
    assert target.read_bytes() == b"weights" and not part.exists()
    assert out.endswith(f"  sha256 {pcb.sha256} (verified); resumed after the 3 bytes of got.pt.part\n"), out

    part.write_bytes(b"xyz")  # a part of some other file: the joined bytes are not the server's
    code, _, err = run(capsys, "model", "pull", pcb.reference, "-o", str(target))
    assert code == 1 and "is not the server's" in err and "pull again" in err and not part.exists()
    code, out, err = run(capsys, "model", "pull", pcb.reference, "-o", str(target))
    assert code == 0 and target.read_bytes() == b"weights" and "resumed" not in out

    part.write_bytes(b"weights")  # broke after the last byte: checked, nothing fetched again
    code, out, err = run(capsys, "weights", "pull", str(pcb.job_id)[:8], "-o", str(target))
    assert code == 0 and target.read_bytes() == b"weights" and "resumed after the 7 bytes" in out, (out, err)

"""`manage.py artifacts_push` (docs/deploy.md, "Moving an existing installation into a bucket")."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.jobs.factories import make_job
from tests.s3 import s3_client, s3_storages

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def push(moto) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    with override_settings(STORAGES=s3_storages(moto)):
        call_command("artifacts_push", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_push_while_jobs_run_says_their_later_files_will_not_be_in_the_bucket(alice, teams, moto, clean_storage):
    """Operator trial 29: pushed while a job trained, then restarted on the bucket as the docs
    said, the job resumed from the last checkpoint the push had copied (35 epochs lost); a job
    ending in between would have had its results on the old DATA_DIR only. Nothing said so."""
    running = make_job(team=teams["vision"], user=alice, state="running", task_name="still-training")
    make_job(team=teams["vision"], user=alice, state="succeeded", task_name="done")
    out, err = push(moto)
    assert "pushed" in out
    assert "1 job is starting or running" in err and str(running.pk)[:8] in err
    assert "run artifacts_push again" in err


def test_a_push_with_nothing_running_says_nothing_more(alice, teams, moto, clean_storage):
    make_job(team=teams["vision"], user=alice, state="succeeded", task_name="done")
    out, err = push(moto)
    assert "pushed" in out and err == ""


# --- what a second pass copies (operator trial 29: the size alone decided) -------------------


@pytest.fixture
def roots(tmp_path):
    """This test's own DATA_DIR roots (the push walks all four)."""
    folders = {name: tmp_path / name.lower() for name in ("DATASETS_DIR", "JOBS_DIR", "MODELS_DIR", "WEIGHTS_DIR")}
    for folder in folders.values():
        folder.mkdir()
    with override_settings(**folders):
        yield folders


def stored_object(moto, key: str) -> dict:
    client = s3_client(moto["url"])
    response = client.get_object(Bucket=moto["bucket"], Key=key)
    return {"body": response["Body"].read(), "etag": response["ETag"].strip('"'), "metadata": response["Metadata"]}


def test_a_file_rewritten_at_the_same_size_is_copied_again_and_an_unchanged_one_is_not(moto, roots):
    """A checkpoint of one architecture keeps its size from epoch to epoch: the first pass (run
    live, as docs/deploy.md allows) copied epoch 33's last.pt, the job then wrote epoch 35's over
    it at the same size, and the second pass skipped it "already stored": the bucket kept epoch 33."""
    import hashlib

    # One file over boto3's multipart threshold (8 MiB): its ETag is not the MD5 of its bytes,
    # which is why the comparison reads the sha256 recorded with the object instead.
    last = roots["JOBS_DIR"] / "0123abcd" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"epoch 33" + bytes(9 * 2**20))
    best = roots["JOBS_DIR"] / "0123abcd" / "weights" / "best.pt"
    best.write_bytes(b"epoch 30" + bytes(1000))
    out, err = push(moto)
    assert out.startswith("pushed 2 files, 0 already stored"), out
    first = stored_object(moto, "jobs/0123abcd/weights/last.pt")
    assert first["metadata"] == {"sha256": hashlib.sha256(last.read_bytes()).hexdigest()}
    assert first["etag"].endswith("-2") and first["etag"] != hashlib.md5(last.read_bytes()).hexdigest()

    last.write_bytes(b"epoch 35" + bytes(9 * 2**20))  # same size, other bytes
    out, err = push(moto)
    assert out.startswith("pushed 1 files, 1 already stored"), out
    assert stored_object(moto, "jobs/0123abcd/weights/last.pt")["body"][:8] == b"epoch 35"

    out, err = push(moto)  # nothing changed: nothing copied
    assert out.startswith("pushed 0 files, 2 already stored"), out


def test_an_object_stored_without_its_hash_is_copied_once_then_skipped(moto, roots):
    """An object an older push stored (no sha256 beside it) cannot be compared without a download:
    it is copied again once, and carries its hash from then on."""
    dataset = roots["DATASETS_DIR"] / "demo" / "data.yaml"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"names: [a]\n")
    s3_client(moto["url"]).put_object(Bucket=moto["bucket"], Key="datasets/demo/data.yaml", Body=b"names: [b]\n")
    out, err = push(moto)
    assert out.startswith("pushed 1 files, 0 already stored"), out
    assert stored_object(moto, "datasets/demo/data.yaml")["body"] == b"names: [a]\n"
    out, err = push(moto)
    assert out.startswith("pushed 0 files, 1 already stored"), out


def put_in_one_part(moto, key: str, body: bytes) -> None:
    s3_client(moto["url"]).put_object(Bucket=moto["bucket"], Key=key, Body=body)


def put_in_parts(moto, key: str, body: bytes) -> None:
    """A multipart upload (as boto3 makes above 8 MiB), here of one part: its ETag is
    ``md5(part md5s)-1``, not the MD5 of the bytes."""
    client, bucket = s3_client(moto["url"]), moto["bucket"]
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
    )


@pytest.mark.parametrize(("put", "copied"), [(put_in_one_part, 0), (put_in_parts, 1)], ids=["one-part", "multipart"])
def test_an_object_stored_without_its_hash_with_the_same_bytes_is_skipped_where_its_etag_is_their_md5(
    moto, roots, put, copied
):
    """left30: the first push after the upgrade copied again every object an older push stored (no
    sha256 beside it). A single-part upload's ETag is the MD5 of its bytes: the same MD5 is the same
    bytes, and that object is skipped. A multipart one's is not an MD5 of the bytes: copied once."""
    dataset = roots["DATASETS_DIR"] / "demo" / "data.yaml"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"names: [a]\n")
    put(moto, "datasets/demo/data.yaml", b"names: [a]\n")
    out, err = push(moto)
    assert out.startswith(f"pushed {copied} files, {1 - copied} already stored"), out
    out, err = push(moto)
    assert out.startswith("pushed 0 files, 1 already stored"), out


def test_an_object_stored_without_its_hash_with_other_bytes_of_the_same_size_is_copied(moto, roots):
    """review30: the ETag shortcut must never call other bytes equal. A single-part object without
    a sha256, of the file's size but not its bytes (a weights file rewritten between epochs), has
    an ETag that is not the file's MD5: copied, and the bucket then holds the file's bytes."""
    weights = roots["DATASETS_DIR"] / "demo" / "data.yaml"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"names: [b]\n")
    put_in_one_part(moto, "datasets/demo/data.yaml", b"names: [a]\n")
    out, err = push(moto)
    assert out.startswith("pushed 1 files, 0 already stored"), out
    assert stored_object(moto, "datasets/demo/data.yaml")["body"] == b"names: [b]\n"


def test_an_object_skipped_by_its_etag_gets_its_sha256_recorded_its_bytes_and_other_metadata_kept(moto, roots):
    """review30/left31: an object the ETag rule skipped never got the sha256 metadata, so every later
    push read the local file again for its MD5. It is copied onto itself (server side, only while
    its ETag is still the one compared) with the sha256 added: the bytes, their ETag, its content
    type and its other metadata stay; the next push compares the sha256."""
    import hashlib

    dataset = roots["DATASETS_DIR"] / "demo" / "data.yaml"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"names: [a]\n")
    s3_client(moto["url"]).put_object(
        Bucket=moto["bucket"],
        Key="datasets/demo/data.yaml",
        Body=b"names: [a]\n",
        ContentType="application/yaml",
        Metadata={"owner": "ops"},
    )
    before = stored_object(moto, "datasets/demo/data.yaml")

    out, err = push(moto)

    assert out.startswith("pushed 0 files, 1 already stored"), out
    after = stored_object(moto, "datasets/demo/data.yaml")
    assert after["metadata"] == {"owner": "ops", "sha256": hashlib.sha256(b"names: [a]\n").hexdigest()}
    assert (after["body"], after["etag"]) == (before["body"], before["etag"])
    head = s3_client(moto["url"]).head_object(Bucket=moto["bucket"], Key="datasets/demo/data.yaml")
    assert head["ContentType"] == "application/yaml"


def test_the_sha256_is_not_recorded_with_an_object_whose_etag_changed_since_it_was_compared(moto, roots):
    """The copy onto itself is conditional on the ETag compared: an object rewritten in between
    (another writer) is not said recorded, and the push copies the file over it as any other."""
    import hashlib

    from apps.core.storage import artifact_record_sha256

    put_in_one_part(moto, "datasets/demo/data.yaml", b"names: [b]\n")
    compared = hashlib.md5(b"names: [a]\n").hexdigest()
    with override_settings(STORAGES=s3_storages(moto)):
        recorded = artifact_record_sha256("datasets/demo/data.yaml", sha256="0" * 64, md5=compared)
        gone = artifact_record_sha256("datasets/demo/none.yaml", sha256="0" * 64, md5=compared)
    assert (recorded, gone) == (False, False)
    # (moto ignores the copy's condition: the object's ETag after the copy says False here.)
    assert stored_object(moto, "datasets/demo/data.yaml")["body"] == b"names: [b]\n"

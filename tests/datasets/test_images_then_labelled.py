"""A name's versions keep one kind, except that an images upload's name may take its labelled
dataset: the step `yoloq dataset push` itself advises after an images push (review28)."""

from __future__ import annotations

import pytest

from .archives import PNG, make_zip, valid_files
from .test_versions import post, storage, submit  # noqa: F401  (storage: the autouse fixture)

pytestmark = pytest.mark.django_db


def test_images_labelled_later_become_a_yolo_version_of_the_same_name(bob):
    """yoloq's answer to an images push says "to train on these images, label them first and push a
    YOLO dataset"; pushing it under the same name is refused, though nothing that named the images
    upload breaks (a predict source takes a YOLO dataset too: apps/jobs/inputs.py)."""
    assert post(bob, make_zip({"a.png": PNG, "b.png": PNG}), name="parts", kind="images").status_code == 201
    response = post(bob, make_zip(valid_files()), name="parts")
    assert response.status_code == 201, response.content

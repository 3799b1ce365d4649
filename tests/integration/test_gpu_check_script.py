"""scripts/gpu_check.sh runs where no GPU is, in its simulated mode, so the script itself cannot rot
between the sessions that have a GPU to run it on (it once imported a function that had moved)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.portal.liveweb import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_script_passes_on_one_simulated_gpu(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "REDIS_URL", "TEST_DATABASE_PATH") and not name.startswith("PYTEST")}
    env.update({"PY": sys.executable, "GPU_CHECK_SIMULATED": "1", "DATA_DIR": str(tmp_path / "data"),
                "EMBEDDED_REDIS_PORT": str(free_port())})
    result = subprocess.run(["scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "node: gpucheck simulated" in out
    assert "onnx export verified" in out and "state: succeeded" in out
    assert "GPU check passed in" in out

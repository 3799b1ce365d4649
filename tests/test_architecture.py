"""Rooms and their doors: what may import what (docs/architecture.md, scripts/import_graph.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

FRAMEWORKS = {"django", "rest_framework", "drf_spectacular", "channels", "channels_redis", "redis", "rq",
              "django_rq"}


def test_apps_core_imports_no_other_app():
    edges, _ = import_graph.collect(ROOT)
    assert {target for source, target in edges if source == "apps.core"} == set()


def test_the_scheduling_policy_imports_no_django_redis_or_app():
    edges, external = import_graph.collect(ROOT)
    assert {target for source, target in edges if source == "apps.scheduling.policy"} == set()
    assert external["apps.scheduling.policy"] & FRAMEWORKS == set()


def test_the_training_child_starts_without_django():
    """It runs in a bare interpreter (or a zygote fork); Django must not be pulled in by its imports."""
    probe = "import sys, worker.train_child; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))"
    out = subprocess.run([sys.executable, "-c", probe % (FRAMEWORKS,)], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


def test_the_graph_tool_finds_a_cycle(tmp_path):
    """The checker itself: two apps importing each other are reported."""
    for name, other in (("a", "b"), ("b", "a")):
        package = tmp_path / "apps" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "services.py").write_text(f"from apps.{other}.services import x\n")
    for top in ("worker", "yoloportal", "cli", "bench", "scripts"):
        (tmp_path / top).mkdir()
    edges, _ = import_graph.collect(tmp_path)
    assert import_graph.cycles(edges) == [["apps.a", "apps.b"]]
    assert import_graph.module_cycles(tmp_path) == [["apps.a.services", "apps.b.services"]]


def test_no_module_import_cycle_crosses_rooms():
    """E.g. jobs.services ↔ scheduling.inputs: imports inside functions count too."""
    assert import_graph.module_cycles(ROOT) == []


# The apps around a job's life depend on each other at app level by design: a submit asks
# scheduling's admission and wakes the scheduler; the scheduler reads jobs and writes them
# through jobs.services; usage is charged as an attempt ends; the cluster overview shows the
# jobs on each GPU; monitoring and notifications read jobs and are told about them. No
# *module* cycle joins them (test above). The layers below and above them must stay out of
# any cycle. See docs/architecture.md.
LAYERED = {"apps.core", "apps.accounts", "apps.datasets", "apps.registry", "apps.scheduling.policy",
           "apps.portal", "worker", "cli", "yoloportal", "yoloportal.entry"}


def test_the_layered_rooms_are_in_no_import_cycle():
    edges, _ = import_graph.collect(ROOT)
    assert [c for c in import_graph.cycles(edges) if set(c) & LAYERED] == []

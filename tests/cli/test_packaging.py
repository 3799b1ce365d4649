"""yoloq installed as a user installs it (`pip install .` or `pip install -e .` into a venv of its own,
on a laptop): what it imports must come with it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in ("cli", "__future__")}


def test_every_package_the_cli_imports_is_a_dependency_of_the_project():
    """`pip install .` into a fresh venv gave a yoloq that died on its first line with
    "ModuleNotFoundError: No module named 'requests'": pyproject.toml declared no dependency (and
    requirements.txt had requests only through Ultralytics) (team adoption trial 30)."""
    imports = _third_party_imports()
    assert "requests" in imports, "the check reads the CLI's imports"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project.get("dependencies", [])}
    assert imports <= declared, f"pyproject.toml [project] dependencies lack {sorted(imports - declared)}"
    required = {
        _name(line.split("#")[0])
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    }
    assert imports <= required, f"requirements.txt lacks {sorted(imports - required)}"

#!/usr/bin/env python3
"""Write apps/registry/checkpoint_layers.py: every layer class a YOLO checkpoint may reference.

    .venv/bin/python scripts/checkpoint_allowlist.py          # rewrite the file
    .venv/bin/python scripts/checkpoint_allowlist.py --check  # exit 1 if it is out of date

The classes are read from the installed torch and Ultralytics (never from a checkpoint):
every ``nn.Module`` subclass defined in ``torch.nn.modules.*``, ``ultralytics.nn.modules.*``
and ``ultralytics.nn.tasks``, and the plain classes of ``ultralytics.utils.loss`` / ``.tal``
(distillation checkpoints), by the name pickle records (``__module__.__qualname__``), plus
the package-level names old checkpoints use (``ultralytics.nn.modules.Conv``). Run it after
upgrading either library; tests/registry/test_checkpoint_scan.py fails until you do.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "apps" / "registry" / "checkpoint_layers.py"


def layer_names() -> list[str]:
    os.environ.setdefault("YOLO_OFFLINE", "1")
    import torch.nn
    import ultralytics.nn.modules

    names: set[str] = set()

    def collect(module, *, modules_only: bool, owner_prefix: str) -> None:
        for attr, obj in vars(module).items():
            if not inspect.isclass(obj) or not obj.__module__.startswith(owner_prefix):
                continue
            if modules_only and not issubclass(obj, torch.nn.Module):
                continue
            names.add(f"{obj.__module__}.{obj.__qualname__}")
            if module.__name__ in ("ultralytics.nn.modules",):
                names.add(f"{module.__name__}.{attr}")  # the package-level path of pre-8.0.100 checkpoints

    for package, prefix in ((torch.nn.modules, "torch.nn.modules"), (ultralytics.nn.modules, "ultralytics.nn.modules")):
        collect(package, modules_only=True, owner_prefix=prefix)
        for info in pkgutil.iter_modules(package.__path__):
            collect(importlib.import_module(f"{package.__name__}.{info.name}"), modules_only=True, owner_prefix=prefix)
    collect(importlib.import_module("ultralytics.nn.tasks"), modules_only=True, owner_prefix="ultralytics.nn.tasks")
    for name in ("ultralytics.utils.loss", "ultralytics.utils.tal"):
        collect(importlib.import_module(name), modules_only=False, owner_prefix=name)
    return sorted(n for n in names if "<locals>" not in n)


def render(names: list[str]) -> str:
    import torch
    import ultralytics

    lines = [
        '"""Layer classes a YOLO checkpoint may reference (generated: scripts/checkpoint_allowlist.py).',
        "",
        f"From torch {torch.__version__} and ultralytics {ultralytics.__version__}; do not edit by hand.",
        '"""',
        "",
        "LAYER_CLASSES = frozenset({",
        *(f'    "{name}",' for name in names),
        "})",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    text = render(layer_names())
    if "--check" in sys.argv:
        current = TARGET.read_text() if TARGET.exists() else ""
        body = lambda t: t.split('"""', 2)[-1]  # noqa: E731 - the versions line may differ
        if body(current) != body(text):
            print(f"{TARGET} is out of date: run scripts/checkpoint_allowlist.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

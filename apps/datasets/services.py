from __future__ import annotations

from pathlib import Path

import yaml

from .models import Dataset


def dataset_register(*, team, name: str, yaml_path: Path, description: str = "") -> Dataset:
    document = yaml.safe_load(Path(yaml_path).read_text()) or {}
    names = document.get("names") or {}
    base = Path(document.get("path") or Path(yaml_path).parent)
    images = sum(1 for p in base.rglob("*") if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp"})
    dataset, _ = Dataset.objects.update_or_create(
        team=team, name=name,
        defaults={"yaml_path": str(yaml_path), "num_classes": len(names), "num_images": images,
                  "description": description},
    )
    return dataset

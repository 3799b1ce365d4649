"""The docs against the code, mechanically: configuration, the CLIs, the API paths.

- Every environment variable the code reads is documented, with its real default where a
  configuration table gives one; every variable a configuration table names is read.
- Every ``yoloq`` command, verb and option the docs show exists with that spelling, and every
  ``manage.py`` command and option.
- Every API path the docs name is routed.

Configuration tables are the Markdown tables of README.md and docs/*.md whose header has a
``variable`` or ``env`` column. A row whose default is "see `docs/…`" (or "as in the README")
points elsewhere: the variable must then have a row there that gives the default.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
import uuid
from functools import cache
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import Resolver404, resolve

ROOT = Path(settings.BASE_DIR)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENV_READERS = {"env_str", "env_bool", "env_int", "env_float", "env_rate", "env_list", "env_path"}
NAME = re.compile(r"[A-Z][A-Z0-9_]*")

# Read by the code but not operators' settings: said here why, so the list stays short.
INTERNAL = {
    "PYTEST_VERSION": "set by pytest: the test data folder (settings.py)",
    "PYTEST_XDIST_WORKER": "set by pytest-xdist: one data folder per worker",
    "YP_HOST": "the Makefile passes HOST to the Procfile under this name",
    "YP_PORT": "the Makefile passes PORT to the Procfile under this name",
    "YOLOPORTAL_NODE": "gpu_worker tells its work-horses their node",
    "YOLOPORTAL_ZYGOTE": "gpu_worker tells its work-horses the preloaded interpreter's socket",
    "YOLOPORTAL_FAST_TRAINER": "tests: a stand-in trainer child (worker/fast_child.py)",
    "FAST_TRAINER_EPOCH_S": "tests: the stand-in trainer's epoch length",
    "YOLOPORTAL_FAULT_CUDA_OOM_ABOVE_BATCH": "tests: a CUDA out-of-memory fault above a batch size",
    "RANK": "set by torch's DDP launcher in a multi-GPU job's processes",
    "XDG_CONFIG_HOME": "the XDG base directory standard (yoloq's config file lives under it)",
    "PWD": "the shell's",
    "PY": "scripts/gpu_check.sh's interpreter, in its usage header and docs/gpu-check.md",
    "VENV": "the Makefile's virtualenv folder (.venv), a make variable",
}
# Settings that configure a test run, not an installation: the README's Development section names them.
TEST_RUN = {"TEST_DATABASE_PATH", "TEST_DATABASE_NAME"}


# --- what the code reads ----------------------------------------------------------------------


def _literal(node: ast.AST):
    """A default written as a literal (or arithmetic on literals); ``...`` when it is computed."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Pow)):
        left, right = _literal(node.left), _literal(node.right)
        if left is ... or right is ...:
            return ...
        return {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.Pow: lambda a, b: a**b,
        }[type(node.op)](left, right)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def _settings_names(node: ast.AST) -> set[str]:
    """The settings a computed default follows (``SECURE``, ``HEARTBEAT_S``): the docs must name them."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and NAME.fullmatch(n.id) and n.id != "BASE_DIR"}


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", "") == "os"


def python_reads(path: Path, *, os_environ_defaults: bool = True) -> dict[str, list]:
    """NAME -> defaults: a value, or the ast node of one computed from other settings. The default of
    ``env_str("X") or f"…{DATA_DIR}…"`` is the expression after ``or``. ``os_environ_defaults=False``
    (settings.py, whose settings are the env_* reads) takes no default from os.environ reads."""
    tree = ast.parse(path.read_text())
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    reads: dict[str, list] = {}

    def first_name(args) -> str | None:
        if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
            return args[0].value if NAME.fullmatch(args[0].value) else None
        return None

    for node in ast.walk(tree):
        name, default = None, None
        if isinstance(node, ast.Call):
            func = node.func
            reader = func.id if isinstance(func, ast.Name) else None
            parent = parents.get(node)
            or_default = parent.values[-1] if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or) else None
            if reader in ENV_READERS and (name := first_name(node.args)):
                default = node.args[1] if len(node.args) > 1 else (ast.Constant("") if reader == "env_str" else None)
                if or_default is not None and _literal(default) in ("", None):
                    default = or_default
            elif (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and _is_os_environ(func.value)
                or isinstance(func, ast.Attribute)
                and func.attr == "getenv"
            ) and (name := first_name(node.args)):
                default = (node.args[1] if len(node.args) > 1 else or_default) if os_environ_defaults else None
        elif isinstance(node, ast.Subscript) and _is_os_environ(node.value) and isinstance(node.ctx, ast.Load):
            name = first_name([node.slice])
        elif isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators):
            name = first_name([node.left])
        if name:
            reads.setdefault(name, [])
            if default is not None:
                value = _literal(default)
                reads[name].append(value if value is not ... else default)
    return reads


def shell_reads(text: str) -> dict[str, list]:
    """``${NAME:-default}`` / ``$NAME`` in the Procfile and scripts; ``NAME ?= default`` in the Makefile."""
    reads: dict[str, list] = {}
    for match in re.finditer(r"\$\{([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}|\$([A-Z][A-Z0-9_]*)", text):
        name = match.group(1) or match.group(3)
        reads.setdefault(name, [])
        if match.group(2) is not None and "$" not in match.group(2):
            reads[name].append(match.group(2))
    return reads


@cache
def code_reads() -> tuple[dict[str, list], set[str]]:
    """Every variable read (NAME -> its literal defaults) and which of them settings.py reads."""
    reads: dict[str, list] = {}

    def merge(found: dict[str, list]) -> None:
        for name, defaults in found.items():
            reads.setdefault(name, []).extend(defaults)

    settings_path = ROOT / "yoloportal" / "settings.py"
    settings_reads = python_reads(settings_path, os_environ_defaults=False)
    merge(settings_reads)
    for folder in ("yoloportal", "apps", "worker", "cli", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != settings_path:
                merge(python_reads(path))
    for path in [ROOT / "Procfile", *sorted((ROOT / "scripts").glob("*.sh"))]:
        # A script's own assignments (PGPORT=${PGPORT:-5433}) give defaults; `export X=${X:-…}` sets its
        # own value for the processes it starts (gpu_check.sh: its own Redis port), a read without one.
        for line in path.read_text().splitlines():
            found = shell_reads(line)
            merge({name: [] for name in found} if line.lstrip().startswith("export ") else found)
    for match in re.finditer(r"^([A-Z][A-Z0-9_]*)\s*\?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M):
        merge({match.group(1): [match.group(2).strip()]})
    return reads, set(settings_reads)


# --- what the docs say ---------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    """A table row's cells (a `|` inside backticks is text)."""
    cells, depth, cell = [], False, ""
    for char in line.strip().strip("|"):
        if char == "`":
            depth = not depth
        if char == "|" and not depth:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*cells, cell.strip()]


def config_rows() -> list[tuple[str, list[str], str]]:
    """(where, names, default cell) of every configuration table row."""
    rows = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if not (line.startswith("|") and n + 1 < len(lines) and lines[n + 1].startswith("|---")):
                continue
            header = [c.lower() for c in _cells(line)]
            column = next((i for i, c in enumerate(header) if c in ("variable", "env")), None)
            if column is None or "default" not in header:
                continue
            for m, row in enumerate(lines[n + 2 :], n + 3):
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                if re.sub(r"`[^`]*`|[,/ ]", "", cells[column]):  # "follows `THROTTLE_UPLOAD`": not its row
                    continue
                names = re.findall(r"`([A-Z][A-Z0-9_]*\*?)`", cells[column])
                rows.append((f"{path.relative_to(ROOT)}:{m}", names, cells[header.index("default")]))
    return rows


def _split_top(text: str, seps: tuple[str, ...]) -> list[str]:
    """``text`` split on ``seps`` outside parentheses and backticks."""
    parts, depth, tick, i, start = [], 0, False, 0, 0
    while i < len(text):
        char = text[i]
        tick = not tick if char == "`" else tick
        depth += (char == "(") - (char == ")") if not tick else 0
        sep = next((s for s in seps if text.startswith(s, i)), None) if depth == 0 and not tick else None
        if sep:
            parts.append(text[start:i])
            i = start = i + len(sep)
            continue
        i += 1
    return [p.strip() for p in [*parts, text[start:]]]


UNITS = {"gib": 1024**3, "mib": 1024**2, "kib": 1024, "h": 3600, "day": 86400, "days": 86400, "s": 1, "min": 60}


def _doc_values(part: str) -> list:
    """What a default cell's part may mean: the text itself, its first word, a number with its unit."""
    lead = _split_top(part, (" (", "; "))[0].replace("`", "").strip()
    values: list = [lead, lead.split(" ")[0] if lead else ""]
    if lead.lower() in ("empty", ""):
        values += ["", [], None]
    if lead.lower() in ("true", "false"):
        values.append(lead.lower() == "true")
    number = re.fullmatch(r"([0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-z]+)?(?:\s.*)?", lead, re.I)
    if number and (number.group(2) is None or number.group(2).lower() in UNITS):
        values.append(float(number.group(1).replace("_", "")) * UNITS.get((number.group(2) or "s").lower(), 1))
    if "," in lead and " " not in lead:
        values.append(lead.split(","))
    return values


def _matches(code_default, part: str) -> bool:
    if isinstance(code_default, ast.AST):  # computed from other settings: the docs name them
        return all(name in part for name in _settings_names(code_default))
    if code_default in ("", [], None):  # unset: computed where it is used (SECRET_KEY), nothing to compare
        return True
    values = _doc_values(part)
    if isinstance(code_default, bool):
        return code_default in [v for v in values if isinstance(v, bool)]
    if isinstance(code_default, (int, float)):
        return any(isinstance(v, float) and v == code_default for v in values) or str(code_default) in values
    if isinstance(code_default, list):
        return code_default in values or (code_default == [] and "" in values)
    return code_default in values


POINTER = re.compile(r"see `docs/|as in the README|^$")


def test_every_variable_the_code_reads_is_documented_and_every_documented_one_is_read():
    reads, settings_reads = code_reads()
    rows = config_rows()
    in_tables = {name for _, names, _ in rows for name in names}
    prose = "\n".join(path.read_text() for path in DOCS)
    # A setting needs a configuration table's row; any other variable (a script's, the CLI's) a mention.
    missing = sorted(
        name
        for name in reads
        if name not in INTERNAL
        and name not in in_tables
        and (name in settings_reads - TEST_RUN or not re.search(rf"\b{name}\b", prose))
    )
    assert not missing, (
        f"read by the code; a setting in no configuration table, or named nowhere in the docs: {missing}"
    )
    prefixes = {name[:-1] for name in in_tables if name.endswith("*")}
    for prefix in prefixes:
        assert any(name.startswith(prefix) for name in reads), f"`{prefix}*` in the docs: the code reads none"
    stale = sorted(name for name in in_tables if not name.endswith("*") and name not in reads)
    assert not stale, f"in a configuration table, read nowhere: {stale}"
    assert not set(INTERNAL) - set(reads), f"INTERNAL names variables nothing reads: {set(INTERNAL) - set(reads)}"


def test_every_settings_variable_has_a_row_that_gives_its_default():
    _, settings_reads = code_reads()
    with_default = {name for _, names, default in config_rows() if not POINTER.search(default) for name in names}
    assert not sorted(settings_reads - TEST_RUN - set(INTERNAL) - with_default), (
        f"only pointers, no default, for: {sorted(settings_reads - TEST_RUN - set(INTERNAL) - with_default)}"
    )


def test_every_default_a_configuration_table_gives_is_the_codes():
    reads, _ = code_reads()
    wrong = []
    for where, names, cell in config_rows():
        names = [name for name in names if not name.endswith("*")]
        if not names or POINTER.search(cell):
            continue
        parts = _split_top(cell, (", ", " / "))
        if len(parts) != len(names):
            parts = [cell] * len(names)
        for name, part in zip(names, parts, strict=True):
            for code_default in reads.get(name, []):
                if not _matches(code_default, part):
                    shown = ast.unparse(code_default) if isinstance(code_default, ast.AST) else repr(code_default)
                    wrong.append(f"{where}: {name}: the docs say {part!r}, the code {shown}")
    assert not wrong, "\n".join(wrong)


def test_the_default_check_can_fail():
    """The checks above, on a wrong default and a missing name (so they are not vacuous)."""
    assert not _matches(3.0, "`5`") and _matches(3.0, "`3`") and _matches(20 * 1024**2, "`20971520`")
    assert _matches(24 * 3600, "1 day") and not _matches(24 * 3600, "7 days") and _matches(1024**3, "1 GiB")
    assert _matches(["127.0.0.1", "localhost"], "`127.0.0.1,localhost`") and not _matches(["a"], "`b`")
    assert not _matches(True, "`false`") and _matches("", "empty") and _matches("120/min", "120/min per user")
    assert not _matches(ast.parse("3 * HEARTBEAT_S", mode="eval").body, "`15`")


# --- yoloq ---------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def doc_code(text: str) -> list[str]:
    """The lines of fenced code blocks and the inline code spans of a Markdown text."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    return [line for block in blocks for line in block.splitlines()] + re.findall(r"`([^`\n]+)`", text)


# Options in a comment beside a yoloq command that belong to the tool it is compared with.
OTHER_TOOLS = re.compile(r"(?:sbatch|squeue|scancel|sacct|scontrol|srun|pip|curl)( +--?[a-z][a-z-]*)+")


def test_every_yoloq_command_and_option_in_the_docs_exists():
    from cli.yoloq import parser

    commands = _subcommands(parser())
    wrong = []
    for path in DOCS:
        for line in doc_code(path.read_text()):
            for match in re.finditer(r"yoloq ([a-z]+)(?: ([a-z]+(?:[/|][a-z]+)*)\b)?", line):
                command, verbs = match.group(1), re.split(r"[/|]", match.group(2) or "")
                if command not in commands:
                    wrong.append(f"{path.name}: no command {command!r}: {line.strip()}")
                    continue
                found = [commands[command]]
                if not _subcommands(found[0]) and match.group(2):  # `yoloq status abc`: an argument
                    verbs = []
                    match_end = match.end(1)
                else:
                    match_end = match.end()
                if _subcommands(found[0]):
                    if not all(v in _subcommands(found[0]) for v in verbs):
                        wrong.append(f"{path.name}: {command} has no verb {verbs}: {line.strip()}")
                        continue
                    found = [_subcommands(found[0])[v] for v in verbs]
                rest = line[match_end:]
                rest = rest[: m.start()] if (m := re.search(r"yoloq [a-z]", rest)) else rest
                for option in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", OTHER_TOOLS.sub("", rest)):
                    if not any(option in a.option_strings for p in found for a in p._actions):
                        wrong.append(f"{path.name}: yoloq {command} {' '.join(verbs)} has no {option}: {line.strip()}")
    assert not wrong, "\n".join(wrong)


def _management_options(name: str) -> set[str]:
    """A management command's options, its subcommands' (``team create``) and their names."""
    from django.core.management import get_commands, load_command_class

    parser = load_command_class(get_commands()[name], name).create_parser("manage.py", name)
    found = {o for a in parser._actions for o in a.option_strings}
    for sub in _subcommands(parser).values():
        found |= {o for a in sub._actions for o in a.option_strings}
    return found


def test_every_management_command_and_option_in_the_docs_exists():
    from django.core.management import get_commands

    commands = get_commands()
    wrong = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for match in re.finditer(r"manage\.py ([a-z_]+)", line):
                if match.group(1) not in commands:
                    wrong.append(f"{path.name}:{n}: no command {match.group(1)!r}")
                    continue
                rest = line[match.end() :]
                rest = rest[: m.start()] if (m := re.search(r"manage\.py |yoloq |\. [A-Z]", rest)) else rest
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                    if option not in _management_options(match.group(1)):
                        wrong.append(f"{path.name}:{n}: manage.py {match.group(1)} has no {option}: {line.strip()}")
    assert not wrong, "\n".join(wrong)


# --- API paths -----------------------------------------------------------------------------------

API_ROOTS = (
    "jobs",
    "queue",
    "cluster",
    "usage",
    "teams",
    "models",
    "exports",
    "weights",
    "datasets",
    "tokens",
    "audit",
    "notifications",
    "attempts",
    "schema",
)
METHOD = r"(?:GET|POST|PATCH|PUT|DELETE)"


def doc_api_paths(text: str) -> set[str]:
    """API paths a text names: any ``/api/v1/…``; a relative ``jobs/{id}/…`` after an HTTP method, or in
    a paragraph that starts "API (`/api/v1/`" or "REST (`/api/v1/`" (README, DESIGN.md)."""
    part = r"(?:[^\s`'\"),;<{]|<[^>\n]*>|\{[^}\n]*\})"
    found = set(re.findall(rf"/api/v1/{part}+", text))
    relative = rf"((?:{'|'.join(API_ROOTS)})/{part}*)"
    found |= {f"/api/v1/{p}" for p in re.findall(rf"{METHOD} +`?{relative}", text)}
    for paragraph in re.split(r"\n\s*\n", text):
        if re.match(r"(API|REST) \(`/api/v1/`", paragraph.strip()):
            found |= {f"/api/v1/{p}" for p in re.findall(rf"`{relative}`", paragraph)}
    return found


def unrouted(doc_path: str) -> list[str]:
    """The concrete paths a documented one stands for that resolve to no API view (empty: all do)."""
    path = doc_path.split("?")[0].rstrip(".")
    alternatives = [path]
    while any("|" in p for p in alternatives):  # jobs/{id}/metrics|logs|events/
        p = next(p for p in alternatives if "|" in p)
        segments = p.split("/")
        i = next(i for i, s in enumerate(segments) if "|" in s)
        alternatives.remove(p)
        alternatives += ["/".join([*segments[:i], s, *segments[i + 1 :]]) for s in segments[i].split("|")]
    bad = []
    for alternative in alternatives:
        ok = False
        holes = len(re.findall(r"\{[^}]*\}|<[^>]*>", alternative))
        for values in itertools.product((str(uuid.uuid4()), "1"), repeat=holes):  # a job's id, an index
            fill = iter(values)
            concrete = re.sub(r"\{[^}]*\}|<[^>]*>", lambda _, fill=fill: next(fill), alternative)
            try:
                ok = ok or resolve(concrete).url_name.startswith("api-")
            except Resolver404:
                pass
        if not ok:
            bad.append(alternative)
    return bad


def test_every_api_path_in_the_docs_is_routed():
    bad = {f"{path.name}: {p}": unrouted(p) for path in DOCS for p in doc_api_paths(path.read_text())}
    assert not {k: v for k, v in bad.items() if v}, "\n".join(f"{k}: {v}" for k, v in bad.items() if v)


def test_the_api_path_check_can_fail():
    assert unrouted("/api/v1/jobs/{id}/metrics|logs|events/?after=<seq>") == []
    assert unrouted("/api/v1/jobs/{id}/metrics|bogus/") == ["/api/v1/jobs/{id}/bogus/"]
    assert doc_api_paths("API (`/api/v1/`): `jobs/` and `models/{id}/stage/` (POST)") == {
        "/api/v1/jobs/",
        "/api/v1/models/{id}/stage/",
    }


DESIGN = ROOT.parent / "shared" / "DESIGN.md"


@pytest.mark.skipif(not DESIGN.is_file(), reason="../shared/DESIGN.md is beside the main checkout only")
def test_every_api_path_in_the_design_is_routed():
    bad = {p: unrouted(p) for p in doc_api_paths(DESIGN.read_text())}
    assert not {k: v for k, v in bad.items() if v}

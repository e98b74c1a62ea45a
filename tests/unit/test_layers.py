"""The package's layers, read from its imports: a lower layer never imports a higher one.

core (exceptions, states, conf, text) ← sql ← public models and handler ← runtime ←
maintenance ← admin, checks, commands, the app config. Imports under
``if TYPE_CHECKING:`` are for annotations only and do not count.
"""

import ast
from pathlib import Path

import django_dbworker

PACKAGE = Path(django_dbworker.__file__).parent

LAYERS = [
    ("core", ["exceptions", "states", "conf", "text", "instances", "bulk"]),
    ("sql", ["sql"]),
    (
        "public",
        [
            "__init__",
            "models",
            "job_meta",
            "querysets",
            "indexes",
            "handler",
            "operations",
            "control",
            "middleware",
            "schema",
            "figures",
            "stats",
            "signals",
            "support",
            "databases",
            "waiting",
            "partitions",
            "consumers.consumer",
            "consumers.models",
            "consumers.frontier",
            "consumers.checks",
            "consumers.notify",
        ],
    ),
    ("runtime", ["runtime"]),
    # The consumers' runtime (batch, assignment, runner) uses the runtime's listener.
    ("maintenance", ["maintenance", "consumers"]),
    (
        "top",
        ["admin", "checks", "apps", "management", "migrations", "tasks", "contrib", "known"],
    ),
    ("testing", ["testing", "pytest_plugin"]),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}
LAYER_NAMES = [name for name, _ in LAYERS]


def layer_of(module: str) -> int:
    """The rank of ``django_dbworker.<module>`` (dotted, below the package)."""
    parts = module.split(".") if module else ["__init__"]
    # The longest listed prefix: consumers.models is public, consumers the rest.
    head = next(
        (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in RANK),
        parts[0],
    )
    assert head in RANK, f"django_dbworker.{module} belongs to no layer: add it to LAYERS"
    return RANK[head]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def submodule_or_package(package: str, name: str) -> str:
    """``package.name`` if that is a module of ours, else ``package`` (a name in it)."""
    where = PACKAGE.joinpath(*package.split(".")) if package else PACKAGE
    if (where / f"{name}.py").exists() or (where / name / "__init__.py").exists():
        return f"{package}.{name}".strip(".")
    return package


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module below the package) of every runtime import of ``path``, the source
    of ``django_dbworker.<module>``."""
    tree = ast.parse(path.read_text())
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    package = module.split(".") if module else []
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("django_dbworker"):
                target = node.module.removeprefix("django_dbworker").lstrip(".")
            else:
                continue
            # from <target> import x, y: each a module of ours, or a name in <target>.
            found += [(node.lineno, submodule_or_package(target, a.name)) for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("django_dbworker."):
                    found.append((node.lineno, alias.name.removeprefix("django_dbworker.")))
    return found


def test_no_layer_imports_a_higher_one():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        rank = layer_of(source)
        for line, target in imports(path, source):
            if layer_of(target) > rank:
                problems.append(
                    f"{path.relative_to(PACKAGE)}:{line}: {LAYER_NAMES[rank]} module "
                    f"{source or '__init__'} imports {target} ({LAYER_NAMES[layer_of(target)]})"
                )
    assert problems == []


def test_the_check_sees_a_violation(tmp_path):
    """The check itself works: an import of the runtime from the SQL layer is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..runtime import worker\nfrom django_dbworker.admin import jobs\n")
    found = [target for _, target in imports(probe, "sql.probe")]
    assert found == ["runtime.worker", "admin.jobs"]
    assert all(layer_of(target) > layer_of("sql.probe") for target in found)

"""The shape of the code: short functions and classes, and imports that flow one way between the wings
of ``tasks`` (core <- ml <- stages <- orchestration, core <- ml <- serve; the CLI and the demo on top), each
one a statement a reader sees (none built from a string at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

# The longest function and class each tree may hold: the pipeline's own code is held to the stricter limit,
# DAG files and benchmarks (a DAG's task wiring, a benchmark's report) to the looser one.
MAX_LINES = {"tasks": (50, 120), "dags": (60, 150), "bench": (60, 150)}
# String-key subscripts (``record["key"]``) ``tasks`` may hold: none more than the 81 left once the day's plan, the
# retrain decision's facts and what a model has learned were typed (386 when stats, reports and verdicts were
# string-keyed dicts); records are typed, read at the boundary where JSON comes in.
MAX_STRING_KEY_SUBSCRIPTS = 81
# What each wing may import from ``tasks`` (at module level or inside functions).
ALLOWED = {
    "tasks.core": ("tasks.core",),
    "tasks.ml": ("tasks.core", "tasks.ml"),
    "tasks.stages": ("tasks.core", "tasks.ml", "tasks.stages"),
    "tasks.orchestration": ("tasks.core", "tasks.stages.params", "tasks.stages.registry", "tasks.orchestration"),
    "tasks.serve": ("tasks.core", "tasks.ml", "tasks.serve"),
}


def _sources(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("root", sorted(MAX_LINES))
def test_no_long_functions_or_classes(root):
    max_function_lines, max_class_lines = MAX_LINES[root]
    too_long = []
    for path in _sources(root):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = max_class_lines if isinstance(node, ast.ClassDef) else max_function_lines
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} > {limit} lines)")
    assert too_long == []


def _imported(path: Path) -> set[str]:
    """Every ``tasks`` module ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("tasks.")}


@pytest.mark.parametrize("wing", sorted(ALLOWED))
def test_imports_flow_one_way(wing):
    allowed = ALLOWED[wing]
    wrong = [
        f"{_module(path)} imports {name}"
        for path in _sources(wing.replace(".", "/"))
        for name in sorted(_imported(path))
        if not name.startswith(allowed)
    ]
    assert wrong == []


def test_the_architecture_test_sees_a_wrong_import(tmp_path):
    """The import scan finds imports inside functions too (the kind that would sneak a stage into the core)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from tasks.stages import distill\n    import tasks.ml.encoder\n")
    assert _imported(sample) == {"tasks.stages.distill", "tasks.ml.encoder"}


def _module_of(name: str, modules: set[str]) -> str | None:
    """The module of ``tasks`` an imported ``name`` (a module, or a name imported from one) belongs to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(paths: list[Path], module_of_path=_module) -> dict[str, set[str]]:
    """Every module of ``paths`` and the modules of theirs it imports (anywhere in it, type-only imports too)."""
    modules = {module_of_path(path): path for path in paths}
    return {
        name: {
            found for imported in _imported(path) if (found := _module_of(imported, set(modules))) not in (None, name)
        }
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_tasks():
    assert _cycles(_import_graph(_sources("tasks"))) == []


def test_the_cycle_scan_sees_a_type_only_cycle(tmp_path):
    (tmp_path / "a.py").write_text("from tasks.b import run\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tasks.a import X\n")
    (tmp_path / "c.py").write_text("import tasks.a\n")
    graph = _import_graph(sorted(tmp_path.glob("*.py")), lambda path: f"tasks.{path.stem}")
    assert _cycles(graph) == [["tasks.a", "tasks.b"]]


def _first_parameter_of_its_own_class(path: Path) -> list[str]:
    """Module-level functions whose first parameter is annotated with a class of their own module: a method in
    disguise. A function of two peers of that class (``compare(a: Run, b: Run)``) is not one."""
    tree = ast.parse(path.read_text())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.args.args:
            continue
        named = [_annotation_name(arg.annotation) for arg in node.args.args[:2]]
        if named[0] in classes and named[1:] != named[:1]:
            found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.name}")
    return found


def _annotation_name(annotation: ast.expr | None) -> str | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value
    return annotation.id if isinstance(annotation, ast.Name) else None


def test_no_function_is_a_method_in_disguise():
    assert [where for path in _sources("tasks") for where in _first_parameter_of_its_own_class(path)] == []


def test_the_disguised_method_scan_tells_methods_from_peers(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "class Run: ...\n"
        "def render(run: Run) -> str: ...\n"
        "def compare(a: Run, b: 'Run') -> None: ...\n"
        "def load(name: str, run: Run) -> None: ...\n"
        "def quoted(run: 'Run', n: int) -> None: ...\n"
    )
    assert _first_parameter_of_its_own_class(sample) == ["sample.py:render", "sample.py:quoted"]


def _string_key_subscripts(path: Path) -> int:
    """``value["key"]``: a subscript by a string constant."""
    return sum(
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_records_are_typed_not_string_keyed():
    counts = {str(path.relative_to(REPO)): _string_key_subscripts(path) for path in _sources("tasks")}
    heaviest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert sum(counts.values()) <= MAX_STRING_KEY_SUBSCRIPTS, f"heaviest: {heaviest}"


def test_the_subscript_count_sees_string_keys_only(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("a['k']\nb[\"k\"][0]\nc[0]\nd[name]\ne[f'{x}']\nf['a':'b']\n")
    assert _string_key_subscripts(sample) == 2


# The one module that reads the pointers (models/current.json, indexes/current.json): everything else asks it.
POINTER_READERS = ("tasks/core/catalog.py", "tasks/core/promoted.py")


def _pointer_reads(path: Path) -> list[int]:
    """Lines that call ``read_pointer`` (``catalog.read_pointer(...)`` or a bare ``read_pointer(...)``)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "read_pointer"
    ]


def test_the_promoted_model_and_index_are_read_through_one_accessor():
    """Only :mod:`tasks.core.promoted` reads a pointer (with :mod:`tasks.core.catalog`, which defines the read):
    one place follows ``models/current.json``, checks it stays in the store and types what it names."""
    readers = {str(p.relative_to(REPO)): _pointer_reads(p) for p in _sources("tasks", "dags")}
    assert {path: lines for path, lines in readers.items() if lines and path not in POINTER_READERS} == {}


def test_the_pointer_read_scan_sees_each_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("catalog.read_pointer(s, Pointer.MODEL)\nread_pointer(s, p)\nx.read_pointers(s)\nread(s)\n")
    assert _pointer_reads(sample) == [1, 2]


def _imports_built_at_run_time(path: Path) -> list[str]:
    """Calls that import a module named by a value (``importlib.import_module``, ``__import__``): an edge that
    no reader or tool sees."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in ("import_module", "__import__"):
            found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno}")
    return found


def test_no_import_is_built_from_a_string():
    assert [where for path in _sources("tasks", "dags") for where in _imports_built_at_run_time(path)] == []


def test_the_string_import_scan_sees_each_way(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "importlib.import_module(f'tasks.stages.{s}')\nimport_module(name)\n__import__(name)\n"
        "from importlib import resources\nresources.files('tasks')\n"
    )
    assert [where.rsplit(":", 1)[1] for where in _imports_built_at_run_time(sample)] == ["1", "2", "3"]


def test_every_stage_runs_through_the_registry():
    """Each stage the CLI offers is in the registry, whose module for it has ``run``; the profile (made by drift,
    never run on its own) is the only stage without one."""
    from tasks import cli
    from tasks.core.catalog import Stage
    from tasks.stages import registry

    assert set(Stage) - set(registry.STAGES) == {Stage.PROFILE}
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse's
    assert {cli.command_name(stage) for stage in registry.STAGES} <= commands
    assert all(callable(registry.module(stage).run) for stage in registry.STAGES)
    with pytest.raises(ValueError, match="profile: not a stage that runs on its own"):
        registry.module(Stage.PROFILE)


# Nothing in ``tasks`` unpickles: bytes from the store (checkpoints, models, archives) are data, never code.
UNPICKLING_CHECKED = ("tasks",)
PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "shelve"}  # importing one is refused
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
UNPICKLING_NAMES = {"load", "loads", "Unpickler", "read_pickle"}


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a chain of names and attributes, else ``''``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _constant(call: ast.Call, keyword: str) -> object:
    """The constant given to ``keyword`` in ``call``: ``None`` when absent, ``...`` when not a constant."""
    for item in call.keywords:
        if item.arg == keyword:  # ``torch.load(f, **options)`` has none, so it is flagged all the same
            return item.value.value if isinstance(item.value, ast.Constant) else ...
    return None


def _unpickling_call(call: ast.Call) -> list[str]:
    name = _dotted(call.func)
    weights_only, allow_pickle = _constant(call, "weights_only"), _constant(call, "allow_pickle")
    problems = []
    if (name in TORCH_LOADS or weights_only is not None) and weights_only is not True:
        problems.append(f"{name or 'a call'} without weights_only=True")
    if allow_pickle not in (None, False):
        problems.append(f"{name or 'a call'} with allow_pickle")
    root, _, leaf = name.partition(".")
    if leaf.rsplit(".", 1)[-1] in UNPICKLING_NAMES and root in PICKLE_MODULES | {"joblib", "pd", "pandas"}:
        problems.append(f"calls {name}")
    return problems


def _unpickling_import(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [f"imports {a.name}" for a in node.names if a.name.split(".")[0] in PICKLE_MODULES]
    module = node.module or ""
    loads = [a.name for a in node.names if a.name in UNPICKLING_NAMES]
    if module.split(".")[0] in PICKLE_MODULES or (module.split(".")[0] in ("torch", "joblib", "pandas") and loads):
        return [f"imports {', '.join(a.name for a in node.names)} from {module}"]
    return []


def _unpickling(path: Path) -> list[str]:
    """Where ``path`` unpickles or could: pickle-like modules, ``torch.load`` without ``weights_only=True``,
    ``weights_only`` other than True, ``allow_pickle`` other than False, ``joblib.load``, ``read_pickle``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            problems = _unpickling_import(node)
        elif isinstance(node, ast.Call):
            problems = _unpickling_call(node)
        else:
            continue
        found += [
            f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno} {p}" for p in problems
        ]
    return found


def test_nothing_unpickles():
    """A checkpoint or model read from the store is data: loading it must never run code (``torch.load``
    with ``weights_only=True``, safetensors, Parquet, JSON; no pickle, dill, cloudpickle or joblib)."""
    assert [problem for path in _sources(*UNPICKLING_CHECKED) for problem in _unpickling(path)] == []


def test_the_unpickling_scan_sees_each_way_in(tmp_path):
    sample = tmp_path / "sample.py"
    lines = [
        "import pickle",
        "import dill as d",
        "from cloudpickle import loads",
        "import shelve",
        "torch.load(f, map_location='cpu', weights_only=False)",
        "torch.load(f)",
        "torch.load(f, **options)",
        "torch.serialization.load(f, weights_only=flag)",
        "from torch import load",
        "pickle.loads(body)",
        "joblib.load(path)",
        "np.load(path, allow_pickle=True)",
        "pd.read_pickle(path)",
        "safe.get(weights_only=False)",
    ]
    sample.write_text("\n".join(lines) + "\ntorch.load(f, weights_only=True)\nnp.load(path)\nimport json\n")
    flagged = {int(problem.split(":")[1].split()[0]) for problem in _unpickling(sample)}
    assert flagged == set(range(1, len(lines) + 1))

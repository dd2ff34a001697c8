"""The layers of docs/architecture.md: mpipe_core stays pure, imports only point
down (between the packages, and between the rooms inside mpipe_core), no module
takes part in an import cycle, and the app never imports torch."""
import ast
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mpipe_core", "storage", "executor", "app", "mpipe_cli", "benchmarks")
# Module prefix -> the prefixes of this project's modules it may import (the
# longest matching prefix is the module's layer).  mpipe_cli and benchmarks sit
# on top and may import anything.
ALLOWED = {
    "mpipe_core": {"mpipe_core"},
    "storage": {"storage", "mpipe_core"},
    "executor": {"executor", "mpipe_core"},  # the package's own docstring
    "executor.errors": {"executor.errors", "mpipe_core"},
    # The file format ranks write and the service reads: shared by both, so it sits beside them.
    "executor.timing_stream": {"executor.timing_stream", "mpipe_core"},
    "executor.analysis": {"executor.analysis", "executor.errors", "storage", "mpipe_core"},
    # The process grid and the kinds of parallelism: rooms below the runtime, which calls them.
    "executor.parallel": {"executor.parallel", "executor.errors", "mpipe_core"},
    "executor.runtime": {"executor.runtime", "executor.parallel", "executor.errors", "executor.timing_stream",
                         "mpipe_core"},
    "executor.service": {"executor.service", "executor.runtime", "executor.parallel", "executor.errors",
                         "executor.timing_stream", "storage", "mpipe_core"},
    "app": {"app", "executor.analysis", "executor.errors", "storage", "mpipe_core"},
}


# The rooms inside mpipe_core, from the ground up: a module may import from its own
# room and the rooms below it, never above (docs/architecture.md's map).
CORE_ROOMS = (
    "mpipe_core.errors",
    "mpipe_core.ir",
    "mpipe_core.data",
    "mpipe_core.workloads",
    "mpipe_core.simulation",
    "mpipe_core.algebra",
    "mpipe_core.api",
    "mpipe_core.search",
    "mpipe_core.formats",
    "mpipe_core.runs",
    "mpipe_core.compare",
)
MAX_TOP_LEVEL_CORE_MODULES = 8


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports (top level or inside a function), as a dotted
    name: this project's modules resolved to the module itself, others as written."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            found.add(_project_module(target) or target)
    found.discard(name)
    return found


def _project_module(dotted: str) -> str | None:
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module's imports; parsed on first use, not while every test process collects."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str | None:
    matches = [prefix for prefix in ALLOWED if name == prefix or name.startswith(prefix + ".")]
    return max(matches, key=len) if matches else None


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_core_imports_without_torch_streamlit_or_a_database():
    # numpy is allowed (the simulator's fast path); OR-Tools only once --exact asks for it.
    code = ("import sys, mpipe_core.api, mpipe_core.compare, mpipe_core.formats.torch_csv, mpipe_core.formats.chrome_trace;"
            "import mpipe_core.search, mpipe_core.search.exact;"
            "mpipe_core.api.evaluate('transpose(1f1b(p=4, m=4), mode=dynamic)', 'vit-heavy-small');"
            "bad = [m for m in ('torch', 'streamlit', 'sqlalchemy', 'plotly', 'ortools') if m in sys.modules];"
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_imports_point_down_the_layers():
    wrong = []
    for name, targets in graph().items():
        layer = _layer(name)
        if layer is None:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES and not _within(target, ALLOWED[layer]):
                wrong.append(f"{MODULES[name].relative_to(ROOT)} imports {target}")
    assert wrong == []


def test_the_layer_rules_catch_an_upward_import():
    # The check above is only worth something if it can fail: the rules say no to these.
    assert not _within("executor.runtime.model", ALLOWED[_layer("app.bars")])
    assert not _within("executor.service.launch", ALLOWED[_layer("app.bars")])
    assert _within("executor.analysis.compare_run", ALLOWED[_layer("app.bars")])
    assert not _within("storage.runs", ALLOWED[_layer("mpipe_core.algebra.terms.ast")])
    assert not _within("executor.service.queue_worker", ALLOWED[_layer("executor.runtime.rank")])


def _room(name: str) -> int | None:
    for floor, room in enumerate(CORE_ROOMS):
        if name == room or name.startswith(room + "."):
            return floor
    return None


def core_room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside mpipe_core that points up the rooms, and every core
    module that stands in no room (a new one must be given a place)."""
    wrong = []
    for name, targets in sorted(graph.items()):
        if not name.startswith("mpipe_core.") or name == "mpipe_core":
            continue
        floor = _room(name)
        if floor is None:
            wrong.append(f"{name} is in no room of CORE_ROOMS")
            continue
        for target in sorted(targets):
            if target.startswith("mpipe_core.") and (_room(target) or 0) > floor:
                wrong.append(f"{name} imports {target}, a room above it")
    return wrong


def test_imports_point_down_the_rooms_inside_the_core():
    assert core_room_violations(graph()) == []


def test_the_room_rules_catch_an_upward_import_and_a_module_with_no_room():
    graph = {
        "mpipe_core.ir.ops": {"mpipe_core.simulation.simulator"},  # up: refused
        "mpipe_core.simulation.simulator": {"mpipe_core.ir.ops", "mpipe_core.errors"},  # down: fine
        "mpipe_core.algebra.evaluate": {"mpipe_core.algebra.terms.ast"},  # its own room: fine
        "mpipe_core.workloads.units": {"mpipe_core.api"},  # up: refused
        "mpipe_core.stray": set(),
    }
    assert core_room_violations(graph) == [
        "mpipe_core.ir.ops imports mpipe_core.simulation.simulator, a room above it",
        "mpipe_core.stray is in no room of CORE_ROOMS",
        "mpipe_core.workloads.units imports mpipe_core.api, a room above it",
    ]


def test_few_modules_stand_at_the_top_of_the_core():
    top = sorted(p.name for p in (ROOT / "mpipe_core").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_CORE_MODULES, top
    rooms = sorted(p.name for p in (ROOT / "mpipe_core").iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(r.split(".")[1] for r in CORE_ROOMS if (ROOT / r.replace(".", "/")).is_dir())


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root] & graph.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles_anywhere():
    assert _cycles(graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_app_imports_no_torch():
    # Statically: nothing the app imports, however indirectly or lazily, imports torch.
    seen, todo = set(), [m for m in MODULES if m == "app" or m.startswith("app.")]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [t for t in graph()[name] if t in MODULES]
    torch_users = sorted(m for m in seen if any(t.split(".")[0] == "torch" for t in graph()[m]))
    assert torch_users == []
    # And at run time, importing the app's modules and what its pages call.
    # Every app module the pages use (the pages themselves are Streamlit scripts).
    modules = sorted(m for m in MODULES if m.startswith("app.") and m != "app.main"
                     and not m.startswith("app.app_pages"))
    assert "app.bars" in modules and "app.evaluation" in modules
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}];"
            " import executor.analysis.compare_run, executor.analysis.calibrate, storage;"
            " assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr

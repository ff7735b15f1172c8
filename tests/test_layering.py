import ast
from pathlib import Path

import distrl

PACKAGE = Path(distrl.__file__).parent
FORBIDDEN = ("torch.distributed", "ray")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_algorithm_modules_never_import_distributed_engines():
    files = sorted((PACKAGE / "algos").glob("*.py"))
    assert len(files) >= 3
    for path in files:
        for name in imported_modules(path):
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), f"{path.name} imports {name}"


def test_the_check_detects_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch.distributed as dist\nfrom ray import remote\n")
    assert {"torch.distributed", "ray", "ray.remote"} <= imported_modules(bad)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports, anywhere in its body (inside functions too). Importing
    ``a.b.c`` also runs the packages ``a`` and ``a.b``, so they count."""

    def name_of(path: Path) -> str:
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for target in imported_modules(path):
            while target and target not in modules:  # `from a.b import name`: the module a.b
                target = target.rpartition(".")[0]
            while target:
                deps.add(target)
                target = target.rpartition(".")[0]
        deps -= {name, package.name}
        deps -= {n for n in deps if name.startswith(n + ".")}  # a module's own packages are running it
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_two_modules_import_each_other_even_through_function_level_imports():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50
    assert cycles(graph) == []


# Each part of the package and its layer: a module may import its own layer and the ones below, never one above
# (cli -> api, tune -> strategies -> training -> algos, export -> data -> nets -> envs, tasks, run -> config).
LAYERS = {
    "distrl": 9,
    "distrl.__main__": 9,
    "distrl.cli": 8,
    "distrl.api": 7,
    "distrl.tune": 7,
    "distrl.strategies": 6,
    "distrl.training": 5,
    "distrl.algos": 4,
    "distrl.export": 4,
    "distrl.data": 3,
    "distrl.nets": 2,
    "distrl.tasks": 1,
    "distrl.envs": 1,
    "distrl.run": 1,
    "distrl.config": 0,
    "distrl._version": 0,
}
ROOT_MODULES = {"__init__.py", "__main__.py", "_version.py"}


def part_of(module: str) -> str:
    """The entry of LAYERS a module belongs to: its subpackage, or itself at the package root."""
    return ".".join(module.split(".")[:2])


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, dep)
        for module, deps in graph.items()
        for dep in deps
        if LAYERS[part_of(dep)] > LAYERS[part_of(module)]
    }


def test_only_the_api_stands_at_the_package_root_and_every_part_has_a_layer():
    assert {p.name for p in PACKAGE.glob("*.py")} == ROOT_MODULES
    parts = {f"distrl.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    parts |= {f"distrl.{name.removesuffix('.py')}" for name in ROOT_MODULES - {"__init__.py"}} | {"distrl"}
    assert parts == set(LAYERS)


def test_every_subpackage_says_what_it_holds_and_what_it_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Imports:" in doc and len(doc.split()) >= 25, f"{init.parent.name}/__init__.py"


def test_no_import_runs_back_up_the_layers():
    graph = import_graph(PACKAGE)
    assert upward_imports(graph) == set()
    # nor between two parts of one layer both ways (a cycle of packages, even without a cycle of modules)
    parts = {(part_of(m), part_of(d)) for m, deps in graph.items() for d in deps if part_of(m) != part_of(d)}
    assert {(a, b) for a, b in parts if (b, a) in parts} == set()


def test_nothing_inside_the_package_imports_the_package_root():
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert all(alias.name != "distrl" for alias in node.names), path
            elif isinstance(node, ast.ImportFrom) and node.module == "distrl":
                # `from distrl import export` names a subpackage; a name of the root's own (a class, __version__) is not
                for alias in node.names:
                    assert (PACKAGE / alias.name / "__init__.py").exists(), f"{path}: from distrl import {alias.name}"


def test_the_layer_check_finds_an_import_that_runs_back_up(tmp_path):
    graph = {"distrl.envs.vector": {"distrl.config", "distrl.nets.core"}, "distrl.nets.core": {"distrl.envs.spaces"}}
    assert upward_imports(graph) == {("distrl.envs.vector", "distrl.nets.core")}


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for path in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        path.write_text("")
    (pkg / "a.py").write_text("from pkg.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.sub.b"]]

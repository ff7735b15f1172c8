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

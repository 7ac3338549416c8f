"""Type stubs and docstrings ship for every public name."""

from __future__ import annotations

import inspect
from pathlib import Path

import resident

STUBS = Path(resident.__file__).parent


def _public_methods(cls) -> list[str]:
    return [name for name, _ in inspect.getmembers(cls) if not name.startswith("_")]


def test_every_public_name_has_a_stub_and_a_docstring():
    stub = (STUBS / "__init__.pyi").read_text() + (STUBS / "output.pyi").read_text()
    errors_stub = (STUBS / "errors.pyi").read_text()
    assert (STUBS / "py.typed").exists() and (STUBS / "_resident.pyi").exists()
    for name in resident.__all__:
        obj = getattr(resident, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"
        declared = f"def {name}(" in stub or f"class {name}" in stub or f"class {name}" in errors_stub
        assert declared, f"{name} is not in the stubs"
    for cls in (resident.Cluster, resident.Pool, resident.Embeddings):
        for method in _public_methods(cls):
            assert f"def {method}(" in stub, f"{cls.__name__}.{method} is not in the stubs"
            assert inspect.getdoc(getattr(cls, method)), f"{cls.__name__}.{method} has no docstring"


def test_every_stub_lists_the_parameters_its_function_takes():
    import ast

    def signatures(tree: ast.Module) -> dict[str, list[str]]:
        found = {}
        for node in tree.body:
            members = node.body if isinstance(node, ast.ClassDef) else [node]
            prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
            for member in members:
                if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                    args = member.args.posonlyargs + member.args.args + member.args.kwonlyargs
                    found[prefix + member.name] = [a.arg for a in args]
        return found

    stub = signatures(ast.parse((STUBS / "__init__.pyi").read_text()))
    source = signatures(ast.parse(Path(resident.__file__).read_text()))
    drifted = {
        name: (params, stub[name])
        for name, params in source.items()
        if name in stub and params != stub[name]
    }
    assert not drifted, f"stubs that differ from their functions (source, stub): {drifted}"

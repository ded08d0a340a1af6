"""No import circles: no module of deepnmt_plugin imports (at its top or inside a function) a module that imports it
back, directly or through others."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "deepnmt_plugin"


def module_names():
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph():
    """module -> the deepnmt_plugin modules it imports. ``from deepnmt_plugin import compat`` imports the module
    compat; the package's __init__ (which every submodule's import runs) is an edge only where a name of it is used."""
    names = module_names()
    graph = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                submodules = [f"{node.module}.{alias.name}" for alias in node.names
                              if f"{node.module}.{alias.name}" in names]
                imported = submodules if len(submodules) == len(node.names) else [node.module, *submodules]
            else:
                continue
            graph[name].update(module for module in imported if module in names and module != name)
    return graph


def circles(graph):
    """Pairs (a, b): a imports b and b reaches a again."""
    def reaches(start, goal):
        seen, stack = set(), [start]
        while stack:
            for following in graph[stack.pop()] - seen:
                if following == goal:
                    return True
                seen.add(following)
                stack.append(following)
        return False

    return sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))


def test_the_detector_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b"), ("b", "c"), ("c", "a")]


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    assert "deepnmt_plugin.bench.study" in graph["deepnmt_plugin.bench.depth"]  # the scan sees imports
    assert "deepnmt_plugin.serving" in graph["deepnmt_plugin.export"]  # ... function-level ones too
    assert circles(graph) == []

"""Which pytest-xdist worker runs which test, and in what order; conftest.py imports the hook."""

import ast
import re
from collections import OrderedDict


def pytest_xdist_make_scheduler(config, log):
    """The tests of a module with module- or class-scoped fixtures go to one worker, so those are built once; every
    other test goes to whichever worker is free. The slow tests (marked ``slow`` in their module's source) are handed
    out first, the quick ones last, so that no worker is left with a long test while the other idles at the end.
    (pytest-xdist's ``--dist loadgroup`` cannot say this under pytest 9: it renames node ids through an attribute
    pytest 9 no longer reads, and every group is silently split.)"""
    from xdist.scheduler import LoadScopeScheduling

    modules = {}

    def module_of(nodeid: str) -> dict:
        """What the scheduler reads of a test module's source: whether it shares fixtures, which tests are slow."""
        path = nodeid.split("::", 1)[0]
        if path not in modules:
            source = (config.rootpath / path).read_text()
            slow = set()
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and "pytestmark" in map(ast.unparse, node.targets) and (
                        "mark.slow" in ast.unparse(node.value)):
                    slow.add("*")  # the whole module
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    if any(ast.unparse(decorator).endswith("mark.slow") for decorator in node.decorator_list):
                        slow.add(node.name)
            shares_fixtures = re.search(r'@pytest\.fixture\(scope="(module|class)"', source) is not None
            modules[path] = {"path": path, "slow": slow, "shares_fixtures": shares_fixtures}
        return modules[path]

    def is_slow(nodeid: str) -> bool:
        module = module_of(nodeid)
        names = nodeid.split("[", 1)[0].split("::")[1:]
        return "*" in module["slow"] or any(name in module["slow"] for name in names)

    class SlowFirstModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = module_of(nodeid)
            return module["path"] if module["shares_fixtures"] else nodeid

        def _assign_work_unit(self, node):
            if not getattr(self, "ordered", False):  # the first hand-out: slow scopes first, larger ones first
                self.workqueue = OrderedDict(sorted(
                    self.workqueue.items(), key=lambda scope: (not any(map(is_slow, scope[1])), -len(scope[1]))))
                self.ordered = True
            super()._assign_work_unit(node)

    return SlowFirstModuleScheduling(config, log)

"""Which pytest-xdist worker runs which test; conftest.py imports the hook."""

import re


def pytest_xdist_make_scheduler(config, log):
    """The tests of a module with module- or class-scoped fixtures go to one worker, so those are built once; every
    other test goes to whichever worker is free. (pytest-xdist's ``--dist loadgroup`` cannot say this under pytest 9:
    it renames node ids through an attribute pytest 9 no longer reads, and every group is silently split.)"""
    from xdist.scheduler import LoadScopeScheduling

    shares_fixtures = {}

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            if module not in shares_fixtures:
                source = (config.rootpath / module).read_text()
                shares_fixtures[module] = re.search(r'@pytest\.fixture\(scope="(module|class)"', source) is not None
            return module if shares_fixtures[module] else nodeid

    return ModuleFixtureScheduling(config, log)

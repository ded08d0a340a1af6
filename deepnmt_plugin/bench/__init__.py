"""Benchmarks (run, not imported by the plugin): ``python -m deepnmt_plugin.bench.depth`` and ``.throughput``."""

"""Benchmarks (run, not imported by the plugin): ``python -m deepnmt_plugin.bench.depth`` and ``.throughput``."""
import logging


def pyplot():
    """matplotlib.pyplot, drawing to files only (no display), imported when a benchmark draws its first figure."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # importing fairseq set the root logger to DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot

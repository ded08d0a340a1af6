"""Optimisation extras the recipes train with, registered with fairseq."""

from deepnmt_plugin.optim import inverse_sqrt_nowarmup, radam  # noqa: F401

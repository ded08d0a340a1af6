"""Registers the ``deep_transformer`` model, its recipes and architectures."""

from deepnmt_plugin.models import (admin, b2t, deepnorm, denseformer, dlcl, dsinit, dyt, hybridnorm, hyper,  # noqa: F401
                                   lns, method, mixln, periln, preln, resi_dual, rezero, sigma, subln, tfixup)
from deepnmt_plugin.models import deep_transformer  # noqa: F401  (registers model and archs)

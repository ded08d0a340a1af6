"""Registers the ``deep_transformer`` model, its recipes and architectures."""

from deepnmt_plugin.models import (admin, b2t, deepnorm, dlcl, dsinit, dyt, lns, method, mixln, periln,  # noqa: F401
                                   preln, resi_dual, rezero, subln, tfixup)
from deepnmt_plugin.models import deep_transformer  # noqa: F401  (registers model and archs)

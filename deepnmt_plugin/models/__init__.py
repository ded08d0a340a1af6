"""Registers the ``deep_transformer`` model, its recipes and architectures."""

from deepnmt_plugin.models import admin, deepnorm, method, preln, tfixup  # noqa: F401  (register recipes)
from deepnmt_plugin.models import deep_transformer  # noqa: F401  (registers model and archs)

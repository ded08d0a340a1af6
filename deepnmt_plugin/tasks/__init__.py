"""Registers the deepnmt tasks."""

from deepnmt_plugin.tasks import translation_deep  # noqa: F401

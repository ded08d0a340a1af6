"""Registers the deepnmt tasks."""

from deepnmt_plugin.tasks import translation_admin  # noqa: F401

"""Runner entry file of the multi-process adapter tests: ``agentkernel runner <this file>``."""

from tests.adapters.apps import register

register()

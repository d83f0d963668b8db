"""Upstream agentkernel's ``agentkernel.deployment`` import paths, kept for code written for it."""

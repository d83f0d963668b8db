"""Upstream agentkernel's ``agentkernel.core.util`` import paths, kept for code written for it."""

"""Logging, metrics and request context."""

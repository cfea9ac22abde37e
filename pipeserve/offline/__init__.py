"""Offline batch scoring: a file, a folder or a dataset through the same pipeline, resumable."""

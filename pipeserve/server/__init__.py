"""Transports: they translate requests to InferenceService calls and results back, nothing more."""

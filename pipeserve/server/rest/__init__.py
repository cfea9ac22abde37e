"""The REST transport (FastAPI for the documented surface, a lean ASGI path for predictions)."""

from pipeserve.server.rest.app import RestApp, create_app

__all__ = ["RestApp", "create_app"]

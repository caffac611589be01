"""The web console: ``raydelay console`` serves :func:`create_app` with uvicorn."""

from raydelay.web.app import create_app

__all__ = ["create_app"]

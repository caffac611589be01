"""The web console: ``raydelay console`` serves :func:`create_app` with uvicorn."""

from raydelay._extras import require

require("console")

from raydelay.web.app import create_app  # noqa: E402

__all__ = ["create_app"]

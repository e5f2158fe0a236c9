"""The web UI: an ASGI app (Starlette) of server-rendered pages over a JSON API under ``/api/``.

``create_app(settings, config)`` returns the app to serve (``skiplock ui``) or to mount in a Starlette or FastAPI
service. It needs the ``ui`` extra (``pip install 'skiplock[ui]'``); the worker and the producer never import it.
"""

from skiplock.ui.app import create_app
from skiplock.ui.config import UiConfig

__all__ = ["UiConfig", "create_app"]

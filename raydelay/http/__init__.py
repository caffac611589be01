"""The HTTP API: produce, cancel, read and manage schedules from any language, with bearer
tokens that are not the Ray token (docs/http.md).

- :mod:`raydelay.http.tokens`: the tokens, stored hashed in the cluster's store;
- :mod:`raydelay.http.ratelimit`: a rate per token;
- :mod:`raydelay.http.bodies`: what a request carries, checked;
- :mod:`raydelay.http.api`: the FastAPI app and its routes;
- :mod:`raydelay.http.serve`: the app on Ray Serve (``raydelay serve``).

Only ``serve`` imports Ray; ``api`` needs the ``[http]`` extra's web stack.
"""

"""Ray actor shells over the pure parts: the coordinator, partition logs, subscriptions.

These are plain classes; :mod:`raydelay.cluster.placement` applies ``ray.remote``.
"""

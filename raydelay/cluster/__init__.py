"""The cluster layer: the coordinator's metadata, actor placement, and every Ray call.

Only :mod:`raydelay.cluster.metadata` is importable without Ray.
"""

"""The multi-node tier runs in ``make chaos`` (``RAYDELAY_CLUSTER_TIER=1``): each test is a
4-node ``ray.cluster_utils`` cluster over SeaweedFS for a minute or two, more than
``make test``'s time budget holds."""

from __future__ import annotations

import os

if os.environ.get("RAYDELAY_CLUSTER_TIER", "") not in ("1", "true", "yes"):
    collect_ignore_glob = ["test_*.py"]

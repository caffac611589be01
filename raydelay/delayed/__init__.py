"""The delayed-delivery index (docs/delayed-index.md). Pure: no ray, no boto3.

- :class:`InMemoryDelayedDeliveryTracker`: everything in memory.
- :class:`BucketDelayedDeliveryTracker`: bounded memory, immutable buckets in an ObjectStore:
  a single-process use of the engine every partition runs (``sealed``, ``store``,
  ``reader``: the same seal, segment format, merge and recovery).
- :class:`BucketRegistry` / :class:`InMemoryBucketRegistry`: where buckets are listed.
"""

from raydelay.delayed.base import DelayedDeliveryTracker
from raydelay.delayed.memory import InMemoryDelayedDeliveryTracker
from raydelay.delayed.registry import BucketRegistry, InMemoryBucketRegistry
from raydelay.delayed.tracker import BucketDelayedDeliveryTracker

__all__ = [
    "DelayedDeliveryTracker",
    "InMemoryDelayedDeliveryTracker",
    "BucketDelayedDeliveryTracker",
    "BucketRegistry",
    "InMemoryBucketRegistry",
]

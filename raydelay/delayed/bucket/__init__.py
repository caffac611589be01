"""The bucket tracker: a delayed index whose memory does not grow with the backlog,
spilled to an ObjectStore as immutable buckets.

- tracker.py: :class:`BucketDelayedDeliveryTracker`, its public API, membership, run queue
  and mutable bucket.
- immutable.py: :class:`ImmutableBuckets`, the sealed buckets and the store I/O that seals,
  loads, merges, deletes and recovers them.
- state.py: the in-memory shapes (a bucket and its :class:`BucketState`, the mutable bucket).
- writer.py: how a bucket is cut into segments and written, and the store-write retries.
- merge.py: which buckets merge and how (a k-way merge of sorted segments).
- tombstones.py: cancels that must outlive a restart.
- recovery.py: what a restarted tracker takes up from the registry and the store.
"""

from raydelay.delayed.bucket.state import BucketState
from raydelay.delayed.bucket.tracker import IO_MODES, BucketDelayedDeliveryTracker, IoMode
from raydelay.delayed.bucket.writer import cut_segments

__all__ = ["BucketDelayedDeliveryTracker", "BucketState", "IO_MODES", "IoMode", "cut_segments"]

"""What every part of a :class:`SubscriptionShell` shares: which partition of which
subscription it serves (:class:`PartitionRef`), and the pause after a failed call."""

from __future__ import annotations

from dataclasses import dataclass

# The pause after a failed background call (a step, a load, a query, a log read) before it
# is tried again.
RETRY_S = 0.5


@dataclass(frozen=True)
class PartitionRef:
    """One partition of one subscription: what each part's calls and store keys name."""

    topic: str
    partition: int
    subscription: str

    @property
    def name(self) -> str:
        """``topic/partition/subscription``, the name its logs go by."""
        return f"{self.topic}/{self.partition}/{self.subscription}"

"""One partition of a topic on the host that serves it: the owner,
:class:`~raydelay.actors.partition.hosted.HostedPartition`, and the parts it composes,
each in its own module (see :mod:`raydelay.actors.partition.hosted`)."""

"""The open-files limit a broker runs with.

Python's ``mmap`` keeps a duplicate of the descriptor of every file it maps, for as long as the
mapping lives: each ConsumeQueue file and IndexFile of the store holds one (10,000 queues,
10,000 descriptors), besides the CommitLog files and the client connections. With a common
soft limit of 1,024 a broker with a thousand queues would fail its appends with EMFILE ("too
many open files"). So the broker raises its soft limit to the hard one at start, as the JVM
does for RocketMQ's broker; the hard limit is the operator's to set (``ulimit -Hn``,
``LimitNOFILE=`` in a systemd unit).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

UNLIMITED_TARGET = 1 << 20  # what to ask for when the hard limit says unlimited


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, e)
    log.info("open-files limit %s (hard %s)", soft, hard)
    return soft

"""Master/slave replication of the CommitLog (RocketMQ 4.x's HAService / HAConnection / HAClient).

See docs/ha.md. ``HAService`` runs on the master, ``HAClient`` on each slave; ``protocol`` holds
the frame layouts.
"""

from data_plane.store.ha.master import HAService, SlaveLag
from data_plane.store.ha.slave import HAClient

__all__ = ["HAClient", "HAService", "SlaveLag"]

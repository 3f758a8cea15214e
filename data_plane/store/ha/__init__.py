"""Master/slave replication of the CommitLog (RocketMQ 4.x's HAService / HAConnection / HAClient).

See docs/ha.md. ``HAService`` runs on the master, ``HAClient`` on each slave; ``protocol`` holds
the frame layouts and the link's mutual authentication (``LinkAuth``: the group and its secret).
"""

from data_plane.store.ha.master import HAService, SlaveLag
from data_plane.store.ha.protocol import LinkAuth
from data_plane.store.ha.slave import HAClient

__all__ = ["HAClient", "HAService", "LinkAuth", "SlaveLag"]

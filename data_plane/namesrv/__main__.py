"""``python -m data_plane.namesrv``: the name server process (as ``orbit namesrv``)."""

import sys

from data_plane.namesrv.server import main

sys.exit(main())

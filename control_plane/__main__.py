"""``python -m control_plane``: see ``control_plane.server``."""

from __future__ import annotations

import sys

from control_plane.server import main

sys.exit(main())

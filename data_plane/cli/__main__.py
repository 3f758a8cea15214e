"""``python -m data_plane.cli``: the ``orbit`` command."""

import sys

from data_plane.cli import main

sys.exit(main())

"""Numbered SQL migrations, ``NNNN_name.sql``, applied in order by ``control_plane.migrate``."""

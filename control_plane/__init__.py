"""control_plane."""

"""HTTP handlers, one module per resource. Each exports ``ROUTES`` (``control_plane.routes.Route``);
``control_plane.app.ALL_ROUTES`` holds them all."""

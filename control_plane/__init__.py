"""Orbit's control plane: tenants, plans, the broker fleet, topics, consumer groups, credentials,
tokens and usage, kept in PostgreSQL and served as a JSON HTTP API (aiohttp).

Layers, top down: ``handlers`` (HTTP, one module per resource) → ``services`` (rules,
transactions) → ``repositories`` (asyncpg, plain SQL) → ``migrations`` (numbered SQL files
applied at start). ``server.main`` runs it; ``services.Services`` is what the reconciler uses
(``desired_state``, ``mark_topic_active``, ``mint_operator_token``). See docs/control_plane.md.
"""

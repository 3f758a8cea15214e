"""The fault tier starts real processes too: the integration tier's name server and broker
fixtures, and the real PostgreSQL and control plane, are available here."""

from tests.integration.conftest import namesrv, processes, start_broker, start_namesrv  # noqa: F401
from tests.postgres_fixture import control_plane_fixture, postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

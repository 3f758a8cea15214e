"""Identity and authorization for Orbit's brokers (and name servers).

| module | holds |
|---|---|
| ``principal.py`` | ``Principal``, ``Grant`` (name rules, ``parse_wire_name``: ``data_plane/tenancy/namespace.py``) |
| ``signature.py`` | RocketMQ ACL request signatures: ``sign`` / ``verify`` (HMAC-SHA1, stock-client compatible) |
| ``jwks.py`` | ``JwksCache``: the control plane's public keys by kid, refreshed, persisted |
| ``jwt_verifier.py`` | ``TokenVerifier``: synchronous JWT checks with a cache of verified tokens |
| ``credential_store.py`` | ``CredentialStore``: access keys from the control plane, encrypted at rest |
| ``request_access.py`` | ``ACCESS``: request code → what a tenant needs (the one table) |
| ``authorizer.py`` | ``Authorizer``: ``authenticate`` / ``authorize`` / ``check``, ``Denial`` |
| ``config.py`` | ``AuthConfig``: the options, frozen |
| ``files.py`` | atomic writes and the 0600 key file |

See docs/auth.md for the model, the wire fields and the code → permission table.
"""

from data_plane.auth.authorizer import UNCHECKED, Authorizer, Denial
from data_plane.auth.config import AuthConfig
from data_plane.auth.credential_store import Credential, CredentialEntry, CredentialSnapshot, CredentialStore
from data_plane.auth.errors import AuthError, UnknownKeyIdError
from data_plane.auth.jwks import JwksCache, JwksError
from data_plane.auth.jwt_verifier import TokenVerifier
from data_plane.auth.principal import AuthConfigError, Grant, GrantDict, Principal
from data_plane.auth.signature import sign, verify
from data_plane.tenancy.namespace import parse_wire_name

__all__ = [
    "UNCHECKED",
    "AuthConfig",
    "AuthConfigError",
    "AuthError",
    "Authorizer",
    "Credential",
    "CredentialEntry",
    "CredentialSnapshot",
    "CredentialStore",
    "Denial",
    "Grant",
    "GrantDict",
    "JwksCache",
    "JwksError",
    "Principal",
    "TokenVerifier",
    "UnknownKeyIdError",
    "parse_wire_name",
    "sign",
    "verify",
]

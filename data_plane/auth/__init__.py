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

from __future__ import annotations

from typing import TYPE_CHECKING

from data_plane.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from data_plane.auth.authorizer import UNCHECKED, Authorizer, Denial
    from data_plane.auth.config import AuthConfig
    from data_plane.auth.credential_store import Credential, CredentialEntry, CredentialSnapshot, CredentialStore
    from data_plane.auth.errors import AuthError, UnknownKeyIdError
    from data_plane.auth.jwks import JwksCache, JwksError
    from data_plane.auth.jwt_verifier import TokenVerifier
    from data_plane.auth.principal import AuthConfigError, Grant, GrantDict, Principal
    from data_plane.auth.signature import sign, verify
    from data_plane.tenancy.namespace import parse_wire_name

# Each name's module, loaded when the name is first used: a client that only signs requests
# (``data_plane.auth.signature``, the SDK) does not load the broker's authorizer with it.
_EXPORTS = {
    "UNCHECKED": "authorizer",
    "Authorizer": "authorizer",
    "Denial": "authorizer",
    "AuthConfig": "config",
    "Credential": "credential_store",
    "CredentialEntry": "credential_store",
    "CredentialSnapshot": "credential_store",
    "CredentialStore": "credential_store",
    "AuthError": "errors",
    "UnknownKeyIdError": "errors",
    "JwksCache": "jwks",
    "JwksError": "jwks",
    "TokenVerifier": "jwt_verifier",
    "AuthConfigError": "principal",
    "Grant": "principal",
    "GrantDict": "principal",
    "Principal": "principal",
    "sign": "signature",
    "verify": "signature",
    "parse_wire_name": "authorizer",
}


if not TYPE_CHECKING:  # (the checker sees the imports above, and flags a name that is not there)
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())


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

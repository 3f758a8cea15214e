"""Who is calling: the principal a verified token names, and the token's claims."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

from control_plane.grants import Grant, GrantDict

Role = Literal["tenant", "operator", "broker"]
ROLES: tuple[Role, ...] = ("tenant", "operator", "broker")


class Claims(TypedDict):
    """The claims of an Orbit JWT (header: ``alg`` EdDSA or RS256, ``kid``)."""

    iss: str
    aud: str
    sub: str  # the access key
    tenant: str  # the tenant id, "*" for operator and broker tokens
    role: Role
    grants: list[GrantDict]
    iat: int
    exp: int
    jti: str


@dataclass(frozen=True, slots=True)
class Principal:
    access_key: str
    tenant: str
    role: Role
    grants: tuple[Grant, ...]

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


# The subject of tokens the control plane mints for itself (``Services.mint_operator_token``).
# Access keys start with "AK", so no credential can carry this name.
SYSTEM_SUBJECT = "orbit-control-plane"

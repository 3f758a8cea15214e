"""Why a request's credentials were refused. ``remark`` is what the client reads in the
NO_PERMISSION answer: it says what is wrong ("token expired", "signature does not match",
"unknown access key") and never echoes a secret or a token."""

from __future__ import annotations


class AuthError(Exception):
    """Credentials missing, malformed or refused."""

    def __init__(self, remark: str) -> None:
        super().__init__(remark)
        self.remark = remark


class UnknownKeyIdError(AuthError):
    """The token names a kid the JWKS cache does not hold (a refresh may bring it)."""

    def __init__(self, kid: str) -> None:
        super().__init__(f"token signed with unknown key id {kid[:64]!r}")
        self.kid = kid

"""Reading a request's ``extFields``: typed, validated, with a clear remark when wrong.

RocketMQ's custom headers are flat string maps; real clients put numbers and booleans in them
too (decoding already turned those into strings). A missing or malformed field raises
``HeaderError``, which the connection turns into an error response naming the field."""

from __future__ import annotations

from data_plane.remoting.errors import HeaderError

_MISSING: object = object()
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def field_str(ext: dict[str, str] | None, name: str, default: str | None = None, *, max_length: int = 65535) -> str:
    v = ext.get(name) if ext else None
    if v is None or v == "":
        if default is None:
            raise HeaderError(f"missing header field '{name}'")
        return default
    if len(v) > max_length:
        raise HeaderError(f"header field '{name}' is longer than {max_length} characters")
    return v


def field_opt_str(ext: dict[str, str] | None, name: str) -> str | None:
    v = ext.get(name) if ext else None
    return v if v else None


def field_int(
    ext: dict[str, str] | None,
    name: str,
    default: int | None = None,
    *,
    lo: int = INT64_MIN,
    hi: int = INT64_MAX,
) -> int:
    v = ext.get(name) if ext else None
    if v is None or v == "":
        if default is None:
            raise HeaderError(f"missing header field '{name}'")
        return default
    try:
        n = int(v)
    except ValueError:
        try:
            f = float(v)
        except ValueError:
            raise HeaderError(f"header field '{name}' is not a number: {v[:40]!r}") from None
        if not f.is_integer():
            raise HeaderError(f"header field '{name}' is not a whole number: {v[:40]!r}") from None
        n = int(f)
    if not lo <= n <= hi:
        raise HeaderError(f"header field '{name}' = {n} is outside [{lo}, {hi}]")
    return n


def field_bool(ext: dict[str, str] | None, name: str, default: bool = False) -> bool:
    v = ext.get(name) if ext else None
    if v is None or v == "":
        return default
    low = v.lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise HeaderError(f"header field '{name}' is not a boolean: {v[:40]!r}")

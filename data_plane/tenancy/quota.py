"""Per-tenant quotas: token buckets the broker checks on its send and pull paths.

A tenant's limits on *this* broker (its share of the tenant's quota, pushed by the control plane)
are four rates: publish msgs/s and bytes/s, consume msgs/s and bytes/s. Each rate is a bucket
holding at most ``rate * burst_s`` tokens (one second's worth by default); tokens come back
lazily, computed from an injected monotonic clock whenever the bucket is touched — no timers.

    acquire_publish(tenant, msgs, nbytes) ─▶ 0                 granted, tokens taken from both buckets
                                          └▶ retry-after ms   refused, nothing taken
    acquire_consume(tenant, msgs, nbytes)    the same for pulls
    charge_consume(tenant, msgs, nbytes)     taken unconditionally: the buckets may go negative

Rules, in the order a request meets them:

- A tenant without limits of its own gets ``default_limits`` (None: no limit at all, and no
  state is kept for it). A rate of None is unlimited; a rate of 0 refuses everything
  (retry-after ``BLOCKED_RETRY_AFTER_MS``).
- A request is granted when every bucket holds ``min(cost, capacity)`` tokens, then the full cost
  is taken. A request larger than a whole burst (a 4 MiB batch against 1 MiB/s) therefore passes
  when the bucket is full and leaves it in debt; the long-run rate still holds.
- The retry-after is the time until every bucket will hold what the request needs, rounded up
  (``floor(ms) + 1``): a client that waits exactly that long is granted, if nothing else drew
  from the bucket meanwhile.
- With ``stagger_refusals`` (what brokers use), requests refused while others are already waiting
  are told to come back one after another rather than all at once: each refusal is promised the
  next free slot after the slots promised before it (``horizon``), and moves that horizon on by
  the time its own cost takes to refill. Without it, N clients refused together are all told the
  same wait, all come back together, one is granted and N-1 are refused again — a flooding tenant
  with many concurrent senders then costs the broker ~N/wait refused requests a second, which
  slows every other tenant down. Staggered, the refusals come at about the quota's own rate.
  The grant decision itself never looks at the horizon (only at the tokens).
- Pulls do not know their size beforehand: the broker asks ``acquire_consume(tenant, 0, 0)``
  ("is the tenant in debt?"), serves the pull, then ``charge_consume`` the messages and bytes it
  returned, so a pull that returned more than the tokens makes the next pulls wait.

Memory is bounded: a tenant's buckets are dropped once the tenant has not been seen for
``idle_evict_s`` *and* its buckets have refilled completely — a full bucket is exactly what would
be created again, so eviction never changes a decision. Past ``max_tenants`` live states a sweep
drops every full bucket at once (at most once a second); only tenants still refilling or in debt
can hold the count above it.

Not thread-safe: the broker calls it from its event loop only.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from data_plane.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

# The response code of a refused request, and the remark's prefix (what managed RocketMQ
# services answer): "[TOO_MANY_REQUESTS] ... retry-after-ms=<n>".
FLOW_CONTROL = ResponseCode.FLOW_CONTROL
REMARK_PREFIX = "[TOO_MANY_REQUESTS]"
BLOCKED_RETRY_AFTER_MS = 1000
_BLOCKED_WAIT_S = (BLOCKED_RETRY_AFTER_MS - 0.5) / 1000.0  # rounds up (floor + 1) to the constant
_RETRY_AFTER = re.compile(r"retry-after-ms=(\d{1,9})")
_INF = math.inf

QuotaKind = Literal["publish", "consume"]


def flow_control_remark(tenant: str, kind: QuotaKind, retry_after_ms: int, msgs_per_s: float | None = None) -> str:
    """The remark of a FLOW_CONTROL (215) answer; ``parse_retry_after_ms`` reads it back. With
    ``msgs_per_s`` it names the tenant's rate on this broker, which clients pace themselves to
    (sdk/pacer.py; ``sdk.errors.FlowControlError.quota_msgs_per_s`` reads it)."""
    rate = f", quota-msgs-per-s={f'{msgs_per_s:.3f}'.rstrip('0').rstrip('.')}" if msgs_per_s else ""
    return (
        f"{REMARK_PREFIX} tenant {tenant!r} is over its {kind} quota on this broker, "
        f"retry-after-ms={retry_after_ms}{rate}"
    )


def parse_retry_after_ms(remark: str | None) -> int | None:
    """The ``retry-after-ms=<n>`` hint of a remark, or None when it carries none."""
    if not remark:
        return None
    m = _RETRY_AFTER.search(remark)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's rates on this broker. None: unlimited; 0: nothing allowed.

    ``burst_s`` overrides the QuotaManager's burst (how many seconds' worth a bucket holds)."""

    publish_msgs_per_s: float | None = None
    publish_bytes_per_s: float | None = None
    consume_msgs_per_s: float | None = None
    consume_bytes_per_s: float | None = None
    burst_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("publish_msgs_per_s", "publish_bytes_per_s", "consume_msgs_per_s", "consume_bytes_per_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 or None, not {v!r}")
        if self.burst_s is not None and not (math.isfinite(self.burst_s) and self.burst_s > 0):
            raise ValueError(f"burst_s must be a finite number > 0, not {self.burst_s!r}")

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> Limits:
        """From the control plane's JSON (the field names above; missing fields are unlimited)."""
        unknown = set(doc) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown limit fields: {sorted(unknown)}")
        values: dict[str, float | None] = {}
        for name, v in doc.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{name} must be a number or null, not {v!r}")
            values[name] = v
        return cls(**values)

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def _shape(rate: float | None, burst_s: float) -> tuple[float, float]:
    """(rate, capacity) of one bucket: unlimited is (0, inf), blocked (0, 0)."""
    if rate is None:
        return 0.0, _INF
    return float(rate), float(rate) * burst_s


def _wait_s(tokens: float, need: float, rate: float) -> float:
    if tokens >= need:
        return 0.0
    if rate <= 0.0:
        return _BLOCKED_WAIT_S
    return (need - tokens) / rate


class _Pair:
    """The msgs bucket and the bytes bucket of one direction (publish or consume) of one tenant.

    A blocked bucket (rate 0) holds -1 token with capacity 0, so ``min(cost, 0) = 0`` is never
    there; an unlimited one holds +inf with capacity +inf and refills at rate 0 (never inf * 0)."""

    __slots__ = ("b_cap", "b_rate", "b_tokens", "horizon", "m_cap", "m_rate", "m_tokens", "stamp")

    def __init__(self, m_rate: float | None, b_rate: float | None, burst_s: float, now: float) -> None:
        self.stamp = now
        self.horizon = now  # staggered refusals: the end of the slots promised so far
        self.m_rate, self.m_cap = _shape(m_rate, burst_s)
        self.b_rate, self.b_cap = _shape(b_rate, burst_s)
        self.m_tokens = self.m_cap if self.m_cap > 0.0 else -1.0
        self.b_tokens = self.b_cap if self.b_cap > 0.0 else -1.0

    def refill(self, now: float) -> None:
        dt = now - self.stamp
        if dt > 0.0:
            self.stamp = now
            t = self.m_tokens + dt * self.m_rate
            self.m_tokens = t if t < self.m_cap else self.m_cap
            t = self.b_tokens + dt * self.b_rate
            self.b_tokens = t if t < self.b_cap else self.b_cap

    def acquire(self, now: float, msgs: int, nbytes: int, stagger: bool = False, take: bool = True) -> float:
        """0.0 when granted (the tokens are taken), else the seconds until it would be (with
        ``stagger``: until the next slot not promised to an earlier refused request).
        ``take=False``: a grant takes nothing (the caller only learns that it would be granted)."""
        dt = now - self.stamp
        if dt > 0.0:
            self.stamp = now
            t = self.m_tokens + dt * self.m_rate
            self.m_tokens = t if t < self.m_cap else self.m_cap
            t = self.b_tokens + dt * self.b_rate
            self.b_tokens = t if t < self.b_cap else self.b_cap
        mt = self.m_tokens
        bt = self.b_tokens
        m_need = msgs if msgs < self.m_cap else self.m_cap
        b_need = nbytes if nbytes < self.b_cap else self.b_cap
        if mt >= m_need and bt >= b_need:
            if take:
                self.m_tokens = mt - msgs
                self.b_tokens = bt - nbytes
            return 0.0
        wait = max(_wait_s(mt, m_need, self.m_rate), _wait_s(bt, b_need, self.b_rate))
        if not stagger:
            return wait
        at = max(now + wait, self.horizon)
        # This request's own cost, in refill time, is what the next refused one waits behind.
        cost = msgs / self.m_rate if self.m_rate > 0.0 else 0.0
        if self.b_rate > 0.0 and nbytes / self.b_rate > cost:
            cost = nbytes / self.b_rate
        self.horizon = at + cost
        return at - now

    def charge(self, now: float, msgs: int, nbytes: int) -> None:
        self.refill(now)
        self.m_tokens -= msgs
        self.b_tokens -= nbytes

    def full(self, now: float) -> bool:
        return self.m_tokens >= self.m_cap and self.b_tokens >= self.b_cap and self.horizon <= now

    def reshape(self, m_rate: float | None, b_rate: float | None, burst_s: float, now: float) -> None:
        """New rates, keeping what the buckets hold (clamped to the new capacity, debts kept).
        A bucket that was unlimited or blocked starts full."""
        self.refill(now)
        self.m_rate, self.m_tokens, self.m_cap = _reshape_one(self.m_rate, self.m_tokens, self.m_cap, m_rate, burst_s)
        self.b_rate, self.b_tokens, self.b_cap = _reshape_one(self.b_rate, self.b_tokens, self.b_cap, b_rate, burst_s)


def _reshape_one(
    old_rate: float, tokens: float, old_cap: float, rate: float | None, burst_s: float
) -> tuple[float, float, float]:
    new_rate, cap = _shape(rate, burst_s)
    if cap <= 0.0:
        return new_rate, -1.0, cap
    if old_rate <= 0.0:  # was unlimited or blocked
        return new_rate, cap, cap
    return new_rate, (tokens if tokens < cap else cap), cap


class _TenantState:
    __slots__ = ("consume", "publish", "seen")

    def __init__(self, limits: Limits, burst_s: float, now: float) -> None:
        b = limits.burst_s or burst_s
        self.publish = _Pair(limits.publish_msgs_per_s, limits.publish_bytes_per_s, b, now)
        self.consume = _Pair(limits.consume_msgs_per_s, limits.consume_bytes_per_s, b, now)
        self.seen = now

    def reshape(self, limits: Limits, burst_s: float, now: float) -> None:
        b = limits.burst_s or burst_s
        self.publish.reshape(limits.publish_msgs_per_s, limits.publish_bytes_per_s, b, now)
        self.consume.reshape(limits.consume_msgs_per_s, limits.consume_bytes_per_s, b, now)

    def full(self, now: float) -> bool:
        self.publish.refill(now)
        self.consume.refill(now)
        return self.publish.full(now) and self.consume.full(now)


def _to_ms(wait_s: float) -> int:
    return int(wait_s * 1000.0) + 1


class QuotaManager:
    """Every tenant's buckets on this broker. ``clock_s`` is monotonic seconds."""

    __slots__ = (
        "_burst_s",
        "_clock",
        "_default",
        "_idle_s",
        "_limits",
        "_max_tenants",
        "_next_forced_sweep",
        "_next_sweep",
        "_next_warning",
        "_stagger",
        "_states",
        "_sweep_interval_s",
    )

    def __init__(
        self,
        *,
        default_limits: Limits | None = None,
        burst_s: float = 1.0,
        idle_evict_s: float = 300.0,
        max_tenants: int = 100_000,
        stagger_refusals: bool = False,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(burst_s) and burst_s > 0):
            raise ValueError("burst_s must be > 0")
        if max_tenants < 1:
            raise ValueError("max_tenants must be >= 1")
        self._default = default_limits
        self._burst_s = burst_s
        self._idle_s = idle_evict_s
        self._max_tenants = max_tenants
        self._clock = clock_s
        self._stagger = stagger_refusals
        self._limits: dict[str, Limits] = {}
        self._states: dict[str, _TenantState] = {}
        self._sweep_interval_s = min(idle_evict_s, 60.0)
        self._next_sweep = clock_s() + self._sweep_interval_s
        self._next_forced_sweep = 0.0
        self._next_warning = 0.0

    # --- limits, pushed by the control plane ------------------------------------------------
    def set_limits(self, tenant: str, limits: Limits | None) -> None:
        """One tenant's limits (None: back to the default). Tokens held are kept, clamped."""
        if limits is None:
            self._limits.pop(tenant, None)
        else:
            self._limits[tenant] = limits
        self._apply(tenant, self._clock())

    def replace_limits(self, snapshot: Mapping[str, Limits]) -> None:
        """The whole table at once: tenants missing from it fall back to the default."""
        self._limits = dict(snapshot)
        now = self._clock()
        for tenant in list(self._states):
            self._apply(tenant, now)

    def set_default_limits(self, limits: Limits | None) -> None:
        self._default = limits
        now = self._clock()
        for tenant in list(self._states):
            self._apply(tenant, now)

    def limits_of(self, tenant: str) -> Limits | None:
        """The limits in force for a tenant (its own, else the default; None: unlimited)."""
        return self._limits.get(tenant, self._default)

    def _apply(self, tenant: str, now: float) -> None:
        st = self._states.get(tenant)
        if st is None:
            return
        limits = self._limits.get(tenant, self._default)
        if limits is None:
            del self._states[tenant]
        else:
            st.reshape(limits, self._burst_s, now)

    # --- the hot path -------------------------------------------------------------------------
    def acquire_publish(self, tenant: str, msgs: int, nbytes: int) -> int:
        """0 when the send may go ahead (tokens taken), else the retry-after in ms (nothing taken)."""
        return self._acquire(tenant, msgs, nbytes, True)

    def refuse_publish(self, tenant: str, msgs: int, nbytes: int) -> int:
        """The frame path's early look (``BrokerTenancy.refuse_send_early``): the retry-after in
        ms when ``acquire_publish`` would refuse this send now — the refusal is made, its slot
        promised, exactly as ``acquire_publish`` makes it — else 0 with nothing taken (the send
        then meets ``acquire_publish`` on its way). A tenant with no state yet is 0: it has not
        sent here lately, so it is not over its quota."""
        st = self._states.get(tenant)
        if st is None:
            return 0
        now = self._clock()
        st.seen = now
        w = st.publish.acquire(now, msgs, nbytes, self._stagger, take=False)
        return 0 if w == 0.0 else _to_ms(w)

    def acquire_consume(self, tenant: str, msgs: int, nbytes: int) -> int:
        """As ``acquire_publish`` for pulls; ``acquire_consume(tenant, 0, 0)`` asks only whether
        the tenant is in debt from earlier ``charge_consume`` calls."""
        return self._acquire(tenant, msgs, nbytes, False)

    def charge_consume(self, tenant: str, msgs: int, nbytes: int) -> None:
        """Take what a served pull returned, even below zero: the next pulls wait for the debt."""
        now = self._clock()
        st = self._seen(tenant, now)
        if st is not None:
            st.consume.charge(now, msgs, nbytes)

    def _acquire(self, tenant: str, msgs: int, nbytes: int, publish: bool) -> int:
        now = self._clock()
        st = self._seen(tenant, now)
        if st is None:
            return 0
        if now >= self._next_sweep:
            self._sweep(now, force=False)
        w = (st.publish if publish else st.consume).acquire(now, msgs, nbytes, self._stagger)
        return 0 if w == 0.0 else _to_ms(w)

    def _seen(self, tenant: str, now: float) -> _TenantState | None:
        """The tenant's state (admitted when new), marked seen now; None: it has no limits."""
        st = self._states.get(tenant)
        if st is None:
            st = self._admit(tenant, now)
            if st is None:
                return None
        st.seen = now
        return st

    def _admit(self, tenant: str, now: float) -> _TenantState | None:
        limits = self._limits.get(tenant, self._default)
        if limits is None:
            return None
        if len(self._states) >= self._max_tenants and now >= self._next_forced_sweep:
            # Before adding (the new state is full: it would go too); at most once a second, so
            # a broker over max_tenants does not scan them all on every new tenant's request.
            self._next_forced_sweep = now + 1.0
            self._sweep(now, force=True)
        st = _TenantState(limits, self._burst_s, now)
        self._states[tenant] = st
        return st

    # --- bounded memory -----------------------------------------------------------------------
    def sweep(self) -> int:
        """Drop the buckets of idle tenants whose buckets are full; the number dropped."""
        return self._sweep(self._clock(), force=False)

    def _sweep(self, now: float, *, force: bool) -> int:
        self._next_sweep = now + self._sweep_interval_s
        idle_before = now - self._idle_s
        drop = [t for t, st in self._states.items() if (force or st.seen <= idle_before) and st.full(now)]
        for t in drop:
            del self._states[t]
        if force and len(self._states) >= self._max_tenants and now >= self._next_warning:
            self._next_warning = now + 60.0
            log.warning(
                "quota state for %d tenants (max_tenants %d): that many are in debt or draining",
                len(self._states),
                self._max_tenants,
            )
        return len(drop)

    def __len__(self) -> int:
        """How many tenants have live buckets."""
        return len(self._states)

    def tokens(self, tenant: str) -> dict[str, float] | None:
        """What a tenant's buckets hold now (introspection and tests); None: no state kept."""
        st = self._states.get(tenant)
        if st is None:
            return None
        now = self._clock()
        st.publish.refill(now)
        st.consume.refill(now)
        return {
            "publish_msgs": st.publish.m_tokens,
            "publish_bytes": st.publish.b_tokens,
            "consume_msgs": st.consume.m_tokens,
            "consume_bytes": st.consume.b_tokens,
        }

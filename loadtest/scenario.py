"""Scenarios: what a load test does, read from a small TOML file (or built from command-line
flags, which go through the same checks).

A scenario is a base of settings plus optional ``[[variants]]``, each overriding some of them;
every variant is one *case*, run on a fresh cluster (``many-queues`` has a 16-queue and a
10,000-queue case, ``flush`` a SYNC and an ASYNC one). ``peers = ["nats", "redis"]`` runs each
case against those brokers too, side by side. Every error names the file and the field::

    name = "steady"
    duration_s = 20            # measured part, after warmup_s
    producers = 2              # generator processes (they use both cores; never threads)
    consumers = 2              # consumer processes; 0 = publish only
    rate_msgs_per_s = 4000     # total target rate, open loop; 0 = as fast as it goes (closed loop)
    message_bytes = 1024       # or [min, max]: uniform sizes
    [burst]                    # optional: factor x the rate for duration_s, from at_s
    at_s = 5
    duration_s = 10
    factor = 10

The full field list is in ``FIELDS`` below and in docs/loadtest.md.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).with_name("scenarios")
PEERS = ("nats", "redis")
FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MIN_MESSAGE_BYTES = 32  # room for the header every generated body starts with (workers.HEADER)
MAX_FILE_BYTES = 1 << 20


class ScenarioError(ValueError):
    """A scenario file or flag is wrong; the message names the source and the field."""


@dataclass(frozen=True, slots=True)
class Burst:
    at_s: float
    duration_s: float
    factor: float


@dataclass(frozen=True, slots=True)
class Tenants:
    count: int
    publish_quota_msgs_per_s: int
    noisy_rate_msgs_per_s: float  # tenant 0's total rate; the others share rate_msgs_per_s
    # The niceness of tenant 0's producer processes: its clients stand in for hosts of their own,
    # so on a shared machine their own CPU does not slow the broker and the quiet tenants' clients.
    noisy_nice: int = 0
    noisy_connections: int = 0  # connections (client instances) of each of tenant 0's producers; 0: ``connections``
    # A backlog case: this many messages stored on tenant 0's topics before the run (its publish
    # quota lifted for that), which its consumers drain from the first offset during the run at
    # most at its consume quota (0: none) while the other tenants publish and consume as always.
    noisy_backlog_msgs: int = 0
    noisy_consume_quota_msgs_per_s: int = 0
    # Tenant 0's own publish quota (0: ``publish_quota_msgs_per_s``, as the others'): a burst case
    # gives it one far above what the broker can do, so its burst is within its quota.
    noisy_publish_quota_msgs_per_s: int = 0
    # A control case: a process at ``noisy_nice`` spins through the run beside tenant 0's producers
    # (loadtest.workers.burner_main) — what a busy co-located client costs the others by its CPU alone.
    noisy_cpu_burn: bool = False
    # Tenant 0's clients (producers, consumers, the control's spinner) on a CPU of their own, every
    # other process of the run (servers, the other tenants' clients) on the rest: a closer stand-in
    # for hosts of their own than a niceness on a machine of few cores (``loadtest.cpu_split``).
    noisy_own_cpu: bool = False


@dataclass(frozen=True, slots=True)
class Ramp:
    """The open-loop rate as a profile: ``rate_msgs_per_s`` through the warm-up, then a linear ramp
    to ``to`` over ``over_s``, ``to`` for ``hold_s``, then ``fall_to`` for ``fall_s`` (the measured
    part: ``duration_s`` = over_s + hold_s + fall_s)."""

    to: float
    over_s: float
    hold_s: float
    fall_to: float
    fall_s: float

    @property
    def length_s(self) -> float:
        return self.over_s + self.hold_s + self.fall_s


@dataclass(frozen=True, slots=True)
class Autoscale:
    """A case on an elastic cluster (docs/elasticity.md): ``broker_groups`` groups with the control
    plane's autoscaler on at these settings, one tenant whose topic is created through the API
    with ``throughput_hint_msgs_per_s``, clients refreshing routes every ``route_refresh_ms``, and
    the topic's queues read from the API every ``sample_s``."""

    broker_groups: int = 2
    interval_s: float = 2.0
    queue_capacity_msgs_per_s: float = 1000.0
    window_s: float = 10.0
    down_after_s: float = 30.0
    load_report_interval_s: float = 1.0
    route_refresh_ms: int = 1000
    sample_s: float = 2.0
    throughput_hint_msgs_per_s: int = 1000
    publish_quota_msgs_per_s: int = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One run's settings (a scenario's base with one variant applied)."""

    name: str
    duration_s: float = 10.0
    warmup_s: float = 1.0
    producers: int = 1
    consumers: int = 1
    connections: int = 1
    in_flight: int = 16
    message_bytes: tuple[int, int] = (1024, 1024)
    batch: int = 1
    topics: int = 1
    queues: int = 8
    rate_msgs_per_s: float = 0.0
    burst: Burst | None = None
    consumer_groups: int = 1
    ordered: bool = False
    keys: int = 16
    consumers_start_after_msgs: int = 0
    drain_timeout_s: float = 60.0
    flush: str = "ASYNC_FLUSH"
    broker_role: str = "ASYNC_MASTER"
    slaves: int = 0
    tenants: Tenants | None = None
    ramp: Ramp | None = None
    autoscale: Autoscale | None = None
    store_set: tuple[tuple[str, str], ...] = ()
    broker_set: tuple[tuple[str, str], ...] = ()  # broker settings (``--set``), as store_set is the store's

    @property
    def open_loop(self) -> bool:
        return self.rate_msgs_per_s > 0

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    cases: tuple[Case, ...]
    peers: tuple[str, ...] = ()
    source: str = "<flags>"
    settings: dict[str, Any] = field(default_factory=dict)  # the base table, as read


# name -> (kind, minimum, maximum). Kinds: int, float, bool, str, choice:<a|b>, size, table.
FIELDS: dict[str, tuple[str, float, float]] = {
    "duration_s": ("float", 0.1, 86_400),
    "warmup_s": ("float", 0, 3_600),
    "producers": ("int", 0, 64),
    "consumers": ("int", 0, 64),
    "connections": ("int", 1, 64),
    "in_flight": ("int", 1, 10_000),
    "message_bytes": ("size", MIN_MESSAGE_BYTES, MAX_MESSAGE_BYTES),
    "batch": ("int", 1, 1024),
    "topics": ("int", 1, 1_000),
    "queues": ("int", 1, 65_536),
    "rate_msgs_per_s": ("float", 0, 10_000_000),
    "consumer_groups": ("int", 1, 64),
    "ordered": ("bool", 0, 0),
    "keys": ("int", 1, 100_000),
    "consumers_start_after_msgs": ("int", 0, 1_000_000_000),
    "drain_timeout_s": ("float", 1, 86_400),
    "flush": ("choice:" + "|".join(FLUSH_TYPES), 0, 0),
    "broker_role": ("choice:" + "|".join(BROKER_ROLES), 0, 0),
    "slaves": ("int", 0, 1),
    "burst": ("table", 0, 0),
    "tenants": ("table", 0, 0),
    "ramp": ("table", 0, 0),
    "autoscale": ("table", 0, 0),
    "store_set": ("table", 0, 0),
    "broker_set": ("table", 0, 0),
}
BURST_FIELDS = {"at_s": ("float", 0, 86_400), "duration_s": ("float", 0.1, 86_400), "factor": ("float", 0.01, 1_000)}
TENANT_FIELDS = {
    "count": ("int", 1, 100),
    "publish_quota_msgs_per_s": ("int", 1, 10_000_000),
    "noisy_rate_msgs_per_s": ("float", 1, 10_000_000),
    "noisy_nice": ("int", 0, 19),
    "noisy_connections": ("int", 0, 10_000),
    "noisy_backlog_msgs": ("int", 0, 100_000_000),
    "noisy_consume_quota_msgs_per_s": ("int", 0, 10_000_000),
    "noisy_publish_quota_msgs_per_s": ("int", 0, 10_000_000),
    "noisy_cpu_burn": ("bool", 0, 0),
    "noisy_own_cpu": ("bool", 0, 0),
}
TENANT_OPTIONAL = {
    "noisy_nice",
    "noisy_connections",
    "noisy_backlog_msgs",
    "noisy_consume_quota_msgs_per_s",
    "noisy_publish_quota_msgs_per_s",
    "noisy_cpu_burn",
    "noisy_own_cpu",
}
RAMP_FIELDS = {
    "to": ("float", 1, 10_000_000),
    "over_s": ("float", 0, 86_400),
    "hold_s": ("float", 0, 86_400),
    "fall_to": ("float", 1, 10_000_000),
    "fall_s": ("float", 0, 86_400),
}
AUTOSCALE_FIELDS = {
    "broker_groups": ("int", 1, 8),
    "interval_s": ("float", 0.1, 3_600),
    "queue_capacity_msgs_per_s": ("float", 1, 10_000_000),
    "window_s": ("float", 1, 3_600),
    "down_after_s": ("float", 0, 86_400),
    "load_report_interval_s": ("float", 0.05, 3_600),
    "route_refresh_ms": ("int", 100, 600_000),
    "sample_s": ("float", 0.2, 60),
    "throughput_hint_msgs_per_s": ("int", 1, 10_000_000),
    "publish_quota_msgs_per_s": ("int", 1, 10_000_000),
}
TOP_ONLY = {"name", "description", "peers", "variants"}


def _check(src: str, path: str, kind: str, lo: float, hi: float, value: Any) -> Any:
    where = f"{src}: {path}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split("|")
        if value not in choices:
            raise ScenarioError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
        return value
    if kind == "size":
        pair = value if isinstance(value, list) else [value, value]
        if len(pair) != 2:
            raise ScenarioError(f"{where}: expected a size in bytes or [min, max], got {value!r}")
        lo_b, hi_b = (_check(src, path, "int", lo, hi, v) for v in pair)
        if lo_b > hi_b:
            raise ScenarioError(f"{where}: min {lo_b} is larger than max {hi_b}")
        return (lo_b, hi_b)
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ScenarioError(f"{where}: expected a whole number, got {value!r}")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ScenarioError(f"{where}: expected a number, got {value!r}")
    if not lo <= value <= hi:
        raise ScenarioError(f"{where}: {value!r} is outside {lo:g} .. {hi:g}")
    return float(value) if kind == "float" else value


def _table(
    src: str, path: str, value: Any, fields: Mapping[str, tuple[str, float, float]], optional: Iterable[str] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{src}: {path}: expected a table, got {value!r}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ScenarioError(f"{src}: {path}.{unknown[0]}: unknown field (known: {', '.join(sorted(fields))})")
    missing = sorted(set(fields) - set(value) - set(optional))
    if missing:
        raise ScenarioError(f"{src}: {path}.{missing[0]}: missing")
    return {k: _check(src, f"{path}.{k}", *fields[k], v) for k, v in value.items()}


def _settings(src: str, path: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The case fields of one table (the base or a variant), checked."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in TOP_ONLY:
            continue
        where = f"{path}{key}"
        if key not in FIELDS:
            raise ScenarioError(f"{src}: {where}: unknown field (known: {', '.join(sorted(FIELDS))})")
        kind, lo, hi = FIELDS[key]
        if key == "burst":
            out[key] = Burst(**_table(src, where, value, BURST_FIELDS))
        elif key == "tenants":
            out[key] = Tenants(**_table(src, where, value, TENANT_FIELDS, TENANT_OPTIONAL))
        elif key == "ramp":
            out[key] = Ramp(**_table(src, where, value, RAMP_FIELDS))
        elif key == "autoscale":
            out[key] = Autoscale(**_table(src, where, value, AUTOSCALE_FIELDS, AUTOSCALE_FIELDS))
        elif key in ("store_set", "broker_set"):
            if not isinstance(value, dict) or not all(isinstance(v, str | int | float | bool) for v in value.values()):
                what = "broker store settings" if key == "store_set" else "broker settings"
                raise ScenarioError(f"{src}: {where}: expected a table of {what}, got {value!r}")
            pairs = ((str(k), str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items())
            out[key] = tuple(sorted(pairs))
        else:
            out[key] = _check(src, where, kind, lo, hi, value)
    return out


def _case(src: str, name: str, settings: Mapping[str, Any], peers: tuple[str, ...]) -> Case:
    case = Case(name=name, **settings)
    where = f"{src}: case {name!r}"
    if case.producers == 0 and case.consumers == 0:
        raise ScenarioError(f"{where}: producers: a case needs producers or consumers")
    if case.message_bytes[1] * case.batch > MAX_MESSAGE_BYTES:
        raise ScenarioError(f"{where}: batch: {case.batch} x {case.message_bytes[1]} bytes exceeds 4 MiB per send")
    if case.ordered and case.batch != 1:
        raise ScenarioError(f"{where}: ordered: ordered messages are sent one at a time (batch = 1)")
    if case.burst is not None and not case.open_loop:
        raise ScenarioError(f"{where}: burst: a burst needs a target rate (rate_msgs_per_s > 0)")
    if case.topics * case.queues > 100_000:
        raise ScenarioError(f"{where}: queues: topics x queues is limited to 100,000")
    if case.consumers_start_after_msgs and case.consumers == 0:
        raise ScenarioError(f"{where}: consumers_start_after_msgs: needs consumers")
    if case.broker_role == "SYNC_MASTER" and not case.slaves:
        raise ScenarioError(f"{where}: slaves: SYNC_MASTER answers only once a slave holds the bytes; set slaves = 1")
    if (case.slaves or case.broker_role != "ASYNC_MASTER" or case.flush != "ASYNC_FLUSH") and peers:
        raise ScenarioError(f"{where}: peers: flush and replication settings are Orbit's; run peers in another case")
    _check_elastic(case, where, peers)
    if case.tenants is not None:
        if peers:
            raise ScenarioError(f"{where}: tenants: peers have no tenants; drop peers or tenants")
        if case.producers < case.tenants.count:
            raise ScenarioError(f"{where}: producers: at least one producer process per tenant ({case.tenants.count})")
        if not case.open_loop:
            raise ScenarioError(f"{where}: rate_msgs_per_s: the tenant scenario needs a target rate")
    return case


def _check_elastic(case: Case, where: str, peers: tuple[str, ...]) -> None:
    """The ramp and autoscale fields' checks against the rest of the case."""
    ramp = case.ramp
    if ramp is not None:
        if not case.open_loop:
            raise ScenarioError(f"{where}: ramp: a ramp starts from a target rate (rate_msgs_per_s > 0)")
        if case.burst is not None:
            raise ScenarioError(f"{where}: ramp: a ramp and a burst are two profiles; use one")
        if abs(ramp.length_s - case.duration_s) > 1e-6:
            raise ScenarioError(
                f"{where}: ramp: over_s + hold_s + fall_s is {ramp.length_s:g} s but duration_s is "
                f"{case.duration_s:g} s; the ramp is the measured part"
            )
    if case.autoscale is not None:
        if case.tenants is not None:
            raise ScenarioError(f"{where}: autoscale: the elastic case makes its own tenant; drop tenants")
        if peers:
            raise ScenarioError(f"{where}: autoscale: peers have no autoscaler; drop peers or autoscale")
        if case.topics != 1 or case.consumer_groups != 1:
            raise ScenarioError(
                f"{where}: autoscale: one topic and one consumer group (topics = 1, consumer_groups = 1)"
            )
        if not case.open_loop:
            raise ScenarioError(f"{where}: rate_msgs_per_s: the elastic case needs a target rate")


def parse(doc: Mapping[str, Any], *, source: str = "<flags>", overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A scenario from a TOML document (``overrides``, e.g. from flags, replace base fields and
    apply to every case)."""
    src = source
    name = doc.get("name", Path(source).stem if source != "<flags>" else "flags")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ScenarioError(f"{src}: name: expected a name of 1-64 characters, got {name!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"{src}: description: expected text, got {description!r}")
    peers_raw = doc.get("peers", [])
    if not isinstance(peers_raw, list) or any(p not in PEERS for p in peers_raw):
        raise ScenarioError(f"{src}: peers: expected a list of {', '.join(PEERS)}, got {peers_raw!r}")
    peers = tuple(dict.fromkeys(peers_raw))
    base = _settings(src, "", doc)
    if overrides:
        base.update(_settings("flags", "--", overrides))
    variants = doc.get("variants", [])
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants) or len(variants) > 32:
        raise ScenarioError(f"{src}: variants: expected up to 32 [[variants]] tables")
    cases: list[Case] = []
    seen: set[str] = set()
    for i, v in enumerate(variants):
        vname = v.get("name")
        if not isinstance(vname, str) or not vname or len(vname) > 64:
            raise ScenarioError(f"{src}: variants[{i}].name: expected a name of 1-64 characters, got {vname!r}")
        if vname in seen:
            raise ScenarioError(f"{src}: variants[{i}].name: {vname!r} appears twice")
        seen.add(vname)
        extra = sorted(set(v) & (TOP_ONLY - {"name"}))
        if extra:
            raise ScenarioError(f"{src}: variants[{i}].{extra[0]}: only allowed at the top of the file")
        settings = {**base, **_settings(src, f"variants[{i}].", v)}
        if overrides:
            settings.update(_settings("flags", "--", overrides))
        cases.append(_case(src, vname, settings, peers))
    if not cases:
        cases.append(_case(src, name, base, peers))
    return Scenario(name, description, tuple(cases), peers, src, {k: v for k, v in doc.items() if k != "variants"})


def load(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read a scenario file, or a shipped scenario by name (``steady``, ``burst``, ...)."""
    p = Path(path)
    if not p.exists() and (SHIPPED_DIR / f"{path}.toml").exists():
        p = SHIPPED_DIR / f"{path}.toml"
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ScenarioError(f"{p}: larger than {MAX_FILE_BYTES} bytes; a scenario is a small file")
        doc = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file, and not a shipped scenario (orbit loadtest --list)") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{p}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{p}: cannot read: {e}") from None
    return parse(doc, source=str(p), overrides=overrides)


def shipped() -> list[tuple[str, str]]:
    """(name, description) of each scenario shipped in loadtest/scenarios."""
    out = []
    for p in sorted(SHIPPED_DIR.glob("*.toml")):
        doc = tomllib.loads(p.read_text())
        out.append((p.stem, str(doc.get("description", ""))))
    return out

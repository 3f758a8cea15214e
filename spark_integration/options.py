"""Validated options of ``format("orbit")``, with errors that say which option and why.

Spark hands options over case-insensitively (keys arrive in lower case); names are documented
in camelCase (docs/spark.md). Every parsed object is picklable and free of secrets in ``repr``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from spark_integration.credentials import CredentialSpec, credentials_from
from spark_integration.errors import OrbitSparkError

EARLIEST = -2
LATEST = -1

READ_OPTIONS = frozenset(
    {
        "namesrv", "topic", "topics", "topicpattern", "startingoffsets", "endingoffsets",
        "startingtimestamp", "endingtimestamp", "maxrecordsperpartition", "consumergroup",
        "pullbatchsize", "requesttimeoutms", "failondataloss", "maxmessagespertrigger", "committogroup",
    }
)  # fmt: skip
WRITE_OPTIONS = frozenset(
    {
        "namesrv", "topic", "producergroup", "batchsize", "sendtimeoutms", "throttletimeoutms",
        "requesttimeoutms",
    }
)  # fmt: skip
CREDENTIAL_OPTIONS = frozenset(
    {"clientid", "clientsecret", "tokenurl", "accesskey", "secretkey", "token", "tokenprovider", "tls", "tlscafile"}
)
# RocketMQ's group name rule (plus the ``tenant%`` namespace separator).
_GROUP_NAME = re.compile(r"[%|a-zA-Z0-9_-]{1,255}")
# Options Spark itself adds (``path`` from ``load(path)`` / ``save(path)``; a streaming write's
# ``checkpointLocation``).
SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(opts) - known - CREDENTIAL_OPTIONS - SPARK_OPTIONS)
    if unknown:
        raise OrbitSparkError(f"unknown {what} option(s) for format('orbit'): {', '.join(unknown)}")


def _int(opts: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OrbitSparkError(f"option {name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise OrbitSparkError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise OrbitSparkError(f"option {name} must be true or false, got {raw!r}")


def _namesrv(opts: Mapping[str, str]) -> tuple[str, ...]:
    raw = opts.get("namesrv") or opts.get("path")
    if not raw:
        raise OrbitSparkError("option namesrv is required: the name server address(es), 'host:port;host:port'")
    addrs = tuple(a.strip() for a in re.split(r"[;,]", raw) if a.strip())
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise OrbitSparkError(f"option namesrv: {a!r} is not host:port")
    return addrs


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: ``earliest`` / ``latest``, a timestamp (epoch ms), or
    per-queue offsets ``{topic: {"broker:queue": offset}}`` (-2 earliest, -1 latest; queues
    not named take ``default``)."""

    kind: str  # "earliest" | "latest" | "timestamp" | "offsets"
    timestamp_ms: int | None = None
    offsets: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    default: int = EARLIEST

    def for_queue(self, topic: str, broker: str, queue_id: int) -> int | None:
        """The explicit offset (or EARLIEST / LATEST) of a queue; None for a timestamp."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        if self.kind == "timestamp":
            return None
        return self.offsets.get(topic, {}).get((broker, queue_id), self.default)


def parse_offsets(raw: str | None, name: str, default: str) -> OffsetSpec:
    text = (raw or default).strip()
    fallback = EARLIEST if default == "earliest" else LATEST
    if text.lower() == "earliest":
        return OffsetSpec("earliest")
    if text.lower() == "latest":
        return OffsetSpec("latest")
    try:
        doc: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise OrbitSparkError(
            f'option {name} must be "earliest", "latest" or JSON {{"topic": {{"broker:queue": offset}}}}, got {text!r}'
        ) from None
    if not isinstance(doc, dict):
        raise OrbitSparkError(f'option {name}: JSON must be an object {{"topic": {{"broker:queue": offset}}}}')
    out: dict[str, dict[tuple[str, int], int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OrbitSparkError(f'option {name}: topic {topic!r} must map to {{"broker:queue": offset}}')
        per: dict[tuple[str, int], int] = {}
        for key, off in queues.items():
            broker, _, qid = str(key).rpartition(":")
            if not broker or not qid.isdigit():
                raise OrbitSparkError(f"option {name}: {key!r} of topic {topic!r} is not 'broker:queueId'")
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OrbitSparkError(
                    f"option {name}: offset of {topic} {key} must be an offset >= 0, "
                    f"-2 (earliest) or -1 (latest), got {off!r}"
                )
            per[(broker, int(qid))] = off
        out[str(topic)] = per
    return OffsetSpec("offsets", offsets=out, default=fallback)


@dataclass(frozen=True)
class ReadOptions:
    namesrv: tuple[str, ...]
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_records_per_partition: int | None
    consumer_group: str | None
    pull_batch_size: int
    request_timeout_ms: int
    fail_on_data_loss: bool
    credentials: CredentialSpec
    # Streaming only (``readStream``): admission control and the group progress is committed to.
    max_messages_per_trigger: int | None = None
    commit_to_group: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], env: Mapping[str, str] | None = None) -> ReadOptions:
        opts = _lower(options)
        _check_known(opts, READ_OPTIONS, "read")
        namesrv = _namesrv(opts)
        given = [n for n in ("topic", "topics", "topicpattern") if opts.get(n)]
        if len(given) != 1:
            raise OrbitSparkError(
                "give exactly one of the options topic, topics (comma-separated) or topicPattern (a regex)"
                + (f"; got {', '.join(given)}" if given else "")
            )
        topics: tuple[str, ...] = ()
        pattern: str | None = None
        if "topicpattern" in given:
            pattern = opts["topicpattern"]
            try:
                re.compile(pattern)
            except re.error as e:
                raise OrbitSparkError(f"option topicPattern is not a regular expression: {e}") from None
        else:
            topics = tuple(t.strip() for t in opts[given[0]].split(",") if t.strip())
            if not topics:
                raise OrbitSparkError(f"option {given[0]} names no topic")
        if opts.get("startingtimestamp") and opts.get("startingoffsets"):
            raise OrbitSparkError("give startingOffsets or startingTimestamp, not both")
        if opts.get("endingtimestamp") and opts.get("endingoffsets"):
            raise OrbitSparkError("give endingOffsets or endingTimestamp, not both")
        starting = parse_offsets(opts.get("startingoffsets"), "startingOffsets", "earliest")
        ending = parse_offsets(opts.get("endingoffsets"), "endingOffsets", "latest")
        if opts.get("startingtimestamp"):
            starting = OffsetSpec("timestamp", timestamp_ms=_int(opts, "startingTimestamp", 0, minimum=0))
        if opts.get("endingtimestamp"):
            ending = OffsetSpec("timestamp", timestamp_ms=_int(opts, "endingTimestamp", 0, minimum=0))
        max_records = _int(opts, "maxRecordsPerPartition", 0, minimum=1) if opts.get("maxrecordsperpartition") else None
        per_trigger = _int(opts, "maxMessagesPerTrigger", 0, minimum=1) if opts.get("maxmessagespertrigger") else None
        commit_group = opts.get("committogroup") or None
        if commit_group is not None and not _GROUP_NAME.fullmatch(commit_group):
            raise OrbitSparkError(
                "option commitToGroup must be a consumer group name ([%|a-zA-Z0-9_-], at most 255 characters), "
                f"got {commit_group!r}"
            )
        return cls(
            namesrv=namesrv,
            topics=topics,
            topic_pattern=pattern,
            starting=starting,
            ending=ending,
            max_records_per_partition=max_records,
            consumer_group=opts.get("consumergroup") or None,
            pull_batch_size=_int(opts, "pullBatchSize", 32),
            request_timeout_ms=_int(opts, "requestTimeoutMs", 10_000),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            credentials=credentials_from(opts, env),
            max_messages_per_trigger=per_trigger,
            commit_to_group=commit_group,
        )

    def check_batch(self) -> ReadOptions:
        """A batch read (``spark.read``): the streaming-only options are refused, by name."""
        streaming = (("maxMessagesPerTrigger", self.max_messages_per_trigger), ("commitToGroup", self.commit_to_group))
        for name, value in streaming:
            if value is not None:
                raise OrbitSparkError(f"option {name} is for spark.readStream only; a batch read has no triggers")
        return self

    def check_stream(self) -> ReadOptions:
        """A streaming read: it has no end (use ``trigger(availableNow=True)`` to stop at the
        offsets found when the query starts)."""
        if self.ending.kind != "latest":
            raise OrbitSparkError(
                "options endingOffsets / endingTimestamp are for batch reads; a stream has no end "
                "(use trigger(availableNow=True) to stop once what is there now is read)"
            )
        return self


@dataclass(frozen=True)
class WriteOptions:
    namesrv: tuple[str, ...]
    topic: str | None
    producer_group: str
    batch_size: int
    send_timeout_ms: int
    throttle_timeout_ms: int
    request_timeout_ms: int
    credentials: CredentialSpec

    @classmethod
    def parse(cls, options: Mapping[str, str], env: Mapping[str, str] | None = None) -> WriteOptions:
        opts = _lower(options)
        _check_known(opts, WRITE_OPTIONS, "write")
        topic = opts.get("topic") or None
        default_group = (
            f"{topic.partition('%')[0]}%orbit-spark-writer" if topic and "%" in topic else "orbit-spark-writer"
        )
        return cls(
            namesrv=_namesrv(opts),
            topic=topic,
            producer_group=opts.get("producergroup") or default_group,
            batch_size=_int(opts, "batchSize", 64),
            send_timeout_ms=_int(opts, "sendTimeoutMs", 10_000),
            throttle_timeout_ms=_int(opts, "throttleTimeoutMs", 600_000, minimum=0),
            request_timeout_ms=_int(opts, "requestTimeoutMs", 10_000),
            credentials=credentials_from(opts, env),
        )

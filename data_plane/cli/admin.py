"""The operator and tenant commands: ``orbit topic``, ``produce``, ``consume``, ``message`` and
``group``. Each talks to the cluster through its name servers (``--namesrv``, or the
ORBIT_NAMESRV environment variable, default 127.0.0.1:9876), prints results on stdout (JSON
lines with ``--json``), and on failure prints one clear line on stderr and exits non-zero."""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from data_plane.store.message import StoredMessage

if TYPE_CHECKING:
    from sdk.admin import AdminClient

DEFAULT_NAMESRV = "127.0.0.1:9876"


def _credentials_file(args: argparse.Namespace) -> str | None:
    return getattr(args, "credentials", None) or os.environ.get("ORBIT_CREDENTIALS_FILE")


def _key_pair(args: argparse.Namespace) -> tuple[str, str] | None:
    """(access key, secret) from ``--credentials FILE`` (JSON or TOML with access_key and
    secret, as ``orbit dev up`` writes them) or the ORBIT_ACCESS_KEY / ORBIT_SECRET_KEY
    environment variables. Never from flags: a secret on a command line is visible to every
    user of the machine."""
    path = _credentials_file(args)
    if path:
        from data_plane.broker.tenancy import load_broker_credentials

        try:
            return load_broker_credentials(path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"orbit: credentials: {e}") from None
    env_ak, env_secret = os.environ.get("ORBIT_ACCESS_KEY"), os.environ.get("ORBIT_SECRET_KEY")
    if env_ak and env_secret:
        return env_ak, env_secret
    return None


def _credentials(args: argparse.Namespace) -> Any:
    """AccessKey + SecretKey signing when the cluster has auth on (``_key_pair``)."""
    from sdk.credentials import AccessKeyCredentials

    pair = _key_pair(args)
    return None if pair is None else AccessKeyCredentials(*pair)


def _control_plane(args: argparse.Namespace) -> str | None:
    """The control plane's URL: ``--control-plane``, ORBIT_CONTROL_PLANE, or the credentials
    file's ``control_plane`` (``orbit dev up`` writes it there)."""
    url = getattr(args, "control_plane", None) or os.environ.get("ORBIT_CONTROL_PLANE")
    path = _credentials_file(args)
    if not url and path:
        try:
            with open(path, "rb") as f:
                doc = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError):
            doc = None
        url = doc.get("control_plane") if isinstance(doc, dict) else None
    return url.rstrip("/") if isinstance(url, str) and url else None


def _namesrv(args: argparse.Namespace) -> list[str]:
    raw = args.namesrv or os.environ.get("ORBIT_NAMESRV") or DEFAULT_NAMESRV
    return [a.strip() for a in raw.replace(",", ";").split(";") if a.strip()]


def _out(args: argparse.Namespace, obj: Any, text: str) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def message_dict(m: StoredMessage) -> dict[str, Any]:
    try:
        body: str = m.body.decode()
        encoding = "utf-8"
    except UnicodeDecodeError:
        body = base64.b64encode(m.body).decode()
        encoding = "base64"
    return {
        "msg_id": m.msg_id,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "tags": m.tags,
        "keys": m.keys,
        "properties": m.properties,
        "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp,
        "reconsume_times": m.reconsume_times,
        "body": body,
        "body_encoding": encoding,
    }


def _run(coro_fn: Callable[[], Awaitable[int]]) -> int:
    from sdk.errors import OrbitError

    try:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    except OrbitError as e:
        print(f"orbit: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run_admin(args: argparse.Namespace, work: Callable[[AdminClient], Awaitable[int]]) -> int:
    """Run ``work`` with an AdminClient of the cluster's name servers."""
    from sdk.admin import AdminClient

    async def go() -> int:
        async with AdminClient(_namesrv(args), credentials=_credentials(args)) as admin:
            return await work(admin)

    return _run(go)


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from ms digits or an ISO-8601 time (UTC when no zone)."""
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch milliseconds nor an ISO-8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return int(dt.timestamp() * 1000)


# --- topic --------------------------------------------------------------------------------------
def topic_create(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        brokers = await admin.create_topic(args.topic, queue_nums=args.queues, cluster=args.cluster, order=args.order)
        _out(args, {"topic": args.topic, "brokers": brokers}, f"created {args.topic} on {', '.join(brokers)}")
        return 0

    return _run_admin(args, work)


def topic_list(args: argparse.Namespace) -> int:
    """An operator's credential (or none, on an open cluster): every topic the name servers know.
    A tenant's: the name servers list topics to operators only, so the tenant's topics come from
    the control plane (``GET /v1/tenants/{tenant}/topics``), as ``tenant%name``."""
    from sdk.admin import AdminError

    async def work(admin: AdminClient) -> int:
        try:
            topics = await admin.list_topics()
        except AdminError as e:
            if not e.not_permitted:
                raise
            url, pair = _control_plane(args), _key_pair(args)
            if url is None or pair is None:
                print(f"orbit topic list: the name servers list topics to operators only ({_whose(e.remark)}); "
                      "a tenant's topics come from the control plane: give its URL with --control-plane "
                      "or ORBIT_CONTROL_PLANE", file=sys.stderr)  # fmt: skip
                return 2
            topics = await _tenant_topics(url, *pair)
        if args.json:
            _out(args, topics, "")
        else:
            for t in topics:
                print(t)
        return 0

    return _run_admin(args, work)


def topic_describe(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        queues = await admin.describe_topic(args.topic)
        rows = [
            {"broker": q.broker_name, "queue_id": q.queue_id, "min": q.min_offset, "max": q.max_offset} for q in queues
        ]
        if args.json:
            _out(args, {"topic": args.topic, "queues": rows}, "")
        else:
            print(f"{'broker':<16} {'queue':>5} {'min offset':>12} {'max offset':>12}")
            for r in rows:
                print(f"{r['broker']:<16} {r['queue_id']:>5} {r['min']:>12} {r['max']:>12}")
        return 0

    return _run_admin(args, work)


# --- messages -----------------------------------------------------------------------------------
def _trace_line(e: dict[str, Any]) -> str:
    """One event of ``orbit message trace``: time, event, where, who."""
    t = int(e.get("time") or 0)
    when = datetime.datetime.fromtimestamp(t / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    where = f"{e.get('topic', '')} q{e.get('queueId', '?')}@{e.get('queueOffset', '?')}"
    who = " ".join(
        f"{k}={e[k]}"
        for k in ("producerGroup", "bornHost", "group", "clientId", "clientAddr", "retryTopic", "dlqTopic",
                  "reconsumeTimes")
        if e.get(k) not in (None, "")
    )  # fmt: skip
    return f"{when} {e.get('event', '?')!s:<14} {where} {who}".rstrip()


def message_trace(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        events = await admin.message_trace(args.topic, args.msg_id)
        if not events:
            print(f"orbit: no trace of message {args.msg_id} in {args.topic}", file=sys.stderr)
            return 1
        for e in events:
            _out(args, e, _trace_line(e))
        return 0

    return _run_admin(args, work)


def message_get(args: argparse.Namespace) -> int:
    """A message by id (``AdminClient.view_message``): an offset message id is read from its
    store host only when the name servers list that broker; a producer's id (UNIQ_KEY) is looked
    up by ``--topic`` in the brokers' indexes."""

    async def work(admin: AdminClient) -> int:
        m = await admin.view_message(args.msg_id, args.topic)
        sys.stdout.write(orjson.dumps(message_dict(m), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0

    return _run_admin(args, work)


def message_query(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        found = await admin.query_by_key(args.topic, args.key, max_num=args.max)
        for m in found:
            sys.stdout.write(orjson.dumps(message_dict(m)).decode() + "\n")
        if not found:
            print(f"orbit: no message of {args.topic} has key {args.key!r}", file=sys.stderr)
            return 1
        return 0

    return _run_admin(args, work)


async def _tenant_topics(url: str, access_key: str, secret: str) -> list[str]:
    """The topics of the credential's tenant, from the control plane's API."""
    import aiohttp

    from data_plane.tls import http_ssl
    from sdk.credentials import ClientCredentials, jwt_claims
    from sdk.errors import OrbitError

    creds = ClientCredentials(access_key, secret, url + "/oauth/token", max_attempts=2)
    try:
        token = await creds.token()
        tenant = jwt_claims(token).get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise OrbitError("this credential names no tenant (an operator's lists topics on the name servers)")
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=http_ssl()), timeout=timeout) as session,
            session.get(f"{url}/v1/tenants/{tenant}/topics", headers=headers) as resp,
        ):
            body = await resp.read()
            if resp.status != 200:
                raise OrbitError(f"{url}: listing tenant {tenant!r}'s topics answered HTTP {resp.status}")
    except aiohttp.ClientError as e:
        raise OrbitError(f"the control plane at {url} did not answer: {e}") from None
    finally:
        await creds.aclose()
    return sorted(f"{tenant}%{t['name']}" for t in orjson.loads(body)["topics"])


# --- groups -------------------------------------------------------------------------------------
def _whose(remark: str) -> str:
    """The kind of credential a refusal names: a tenant's, or none at all."""
    if "no credentials" in remark:
        return "no credentials"
    return "tenant credential" if "tenant" in remark else "this credential"


def cluster_status(args: argparse.Namespace) -> int:
    """Each broker's role, epoch, CommitLog end and replication lag (docs/ha.md)."""

    from sdk.admin import AdminError

    async def work(admin: AdminClient) -> int:
        try:
            rows = await admin.cluster_status()
        except AdminError as e:
            if not e.not_permitted:
                raise
            print(f"orbit cluster status: not permitted ({_whose(e.remark)}; operators only)", file=sys.stderr)
            return 2
        if args.json:
            _out(args, {"brokers": rows}, "")
            return 0
        print(f"{'broker':<16} {'id':>3} {'address':<22} {'role':<13} {'epoch':>5} {'max offset':>14} "
              f"{'lag bytes':>10} {'lag s':>7}")  # fmt: skip
        for r in rows:
            st = r["status"]
            if st is None:
                why = "(not answering)"
                if r.get("refused") is not None:
                    why = f"not permitted ({_whose(r['refused'])}; operators only)"
                print(f"{r['broker_name']:<16} {r['broker_id']:>3} {r['addr']:<22} {why}")
                continue
            role = st.get("brokerRole", "?")
            if st.get("haFenced") == "True" and role != "SLAVE":  # a slave does not write anyway
                role += " (fenced)"
            print(f"{r['broker_name']:<16} {r['broker_id']:>3} {r['addr']:<22} {role:<13} {st.get('haEpoch', '0'):>5} "
                  f"{st.get('commitLogMaxOffset', '?'):>14} {st.get('haLagBytes', '-'):>10} "
                  f"{st.get('haLagSeconds', '-'):>7}")  # fmt: skip
        return 0

    return _run_admin(args, work)


def group_progress(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        rows = await admin.group_progress(args.group, args.topic)
        total = sum(r.lag for r in rows)
        if args.json:
            _out(
                args,
                {
                    "group": args.group,
                    "topic": args.topic,
                    "lag": total,
                    "queues": [
                        {
                            "broker": r.broker_name,
                            "queue_id": r.queue_id,
                            "broker_offset": r.broker_offset,
                            "consumer_offset": r.consumer_offset,
                            "lag": r.lag,
                        }
                        for r in rows
                    ],
                },
                "",
            )
        else:
            print(f"{'broker':<16} {'queue':>5} {'broker offset':>14} {'consumer offset':>16} {'lag':>10}")
            for r in rows:
                print(f"{r.broker_name:<16} {r.queue_id:>5} {r.broker_offset:>14} {r.consumer_offset:>16} {r.lag:>10}")
            print(f"total lag: {total}")
        return 0

    return _run_admin(args, work)


def group_reset(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        done = await admin.reset_offset_to_time(args.group, args.topic, args.to_time)
        for (broker, q), off in sorted(done.items()):
            _out(args, {"broker": broker, "queue_id": q, "offset": off}, f"{broker}:{q} -> {off}")
        return 0

    return _run_admin(args, work)


# --- produce / consume ------------------------------------------------------------------------------
def produce(args: argparse.Namespace) -> int:
    from sdk import Message, Producer

    async def go() -> int:
        producer = Producer(args.group, namesrv_addrs=_namesrv(args), credentials=_credentials(args))
        await producer.start()
        try:
            bodies: list[bytes]
            if args.body is not None:
                bodies = [args.body.encode()] * args.count
            else:
                bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer if line.strip()]
            for b in bodies:
                keys: list[str] = args.keys.split(",") if args.keys else []
                msg = Message(args.topic, b, tags=args.tags, keys=keys)
                r = await producer.send(msg, sharding_key=args.sharding_key)
                _out(
                    args,
                    {
                        "msg_id": r.msg_id,
                        "offset_msg_id": r.offset_msg_id,
                        "queue": r.message_queue.queue_id,
                        "status": r.status.name,
                    },
                    f"{r.status.name} {r.offset_msg_id} queue={r.message_queue.queue_id} offset={r.queue_offset}",
                )
        finally:
            await producer.shutdown()
        return 0

    return _run(go)


def consume(args: argparse.Namespace) -> int:
    from sdk import PullConsumer
    from sdk.errors import ConnectionFailedError

    async def go() -> int:
        consumer = PullConsumer(
            args.group,
            namesrv_addrs=_namesrv(args),
            consume_from="FIRST_OFFSET" if args.earliest else "LAST_OFFSET",
            credentials=_credentials(args),
        )
        consumer.subscribe(args.topic, args.expression)
        await consumer.start()
        try:
            # No name server, or no route: one line and a non-zero exit, not a quiet timeout.
            await consumer.fetch_queues(args.topic)
        except ConnectionFailedError as e:
            await consumer.shutdown()
            raise ConnectionFailedError(f"no name server answered ({_namesrv(args)}): {e}") from None
        except BaseException:
            await consumer.shutdown()
            raise
        got = 0
        deadline = time.monotonic() + args.timeout_s
        try:
            while got < args.max and time.monotonic() < deadline:
                msgs = await consumer.poll(timeout_ms=int(min(1.0, max(0.0, deadline - time.monotonic())) * 1000))
                for m in msgs:
                    d = {
                        "msg_id": m.msg_id,
                        "topic": m.topic,
                        "queue_id": m.queue_id,
                        "queue_offset": m.queue_offset,
                        "tags": m.tags,
                        "keys": m.keys,
                        "body": m.body.decode(errors="replace"),
                    }
                    _out(args, d, f"{m.queue_id}:{m.queue_offset} {m.tags or ''} {m.body.decode(errors='replace')}")
                    got += 1
                    if got >= args.max:
                        break
                if msgs:
                    await consumer.commit()
        finally:
            await consumer.shutdown()
        return 0

    return _run(go)


def common_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every cluster command takes: where the name servers are, how to sign, JSON."""
    p.add_argument("--namesrv", help=f"name server host:port[;host:port] (env ORBIT_NAMESRV; {DEFAULT_NAMESRV})")
    p.add_argument(
        "--credentials",
        help="file with access_key and secret (env ORBIT_CREDENTIALS_FILE, or ORBIT_ACCESS_KEY/ORBIT_SECRET_KEY)",
    )
    p.add_argument("--json", action="store_true", help="JSON output")
    return p


def add_parsers(sub: Any) -> None:
    common = common_options

    topic = sub.add_parser("topic", help="create, list and describe topics")
    tsub = topic.add_subparsers(dest="what", required=True)
    p = common(tsub.add_parser("create", help="create or update a topic on every master"))
    p.add_argument("topic")
    p.add_argument("--queues", type=int, default=4, help="read and write queues per broker (default 4)")
    p.add_argument("--cluster", help="only this cluster's brokers")
    p.add_argument("--order", action="store_true", help="an ordered topic")
    p.set_defaults(func=topic_create)
    p = common(
        tsub.add_parser(
            "list", help="every topic the name servers know (an operator), or the tenant's own (a tenant credential)"
        )
    )
    p.add_argument(
        "--control-plane",
        help="the control plane's URL, where a tenant credential's topics are listed "
        "(env ORBIT_CONTROL_PLANE, or the credentials file's control_plane)",
    )
    p.set_defaults(func=topic_list)
    p = common(tsub.add_parser("describe", help="queues with their min and max offsets"))
    p.add_argument("topic")
    p.set_defaults(func=topic_describe)

    p = common(sub.add_parser("produce", help="send messages (--body, or one per stdin line)"))
    p.add_argument("--topic", required=True)
    p.add_argument("--body", help="message body (default: read lines from stdin)")
    p.add_argument("--count", type=int, default=1, help="send --body this many times")
    p.add_argument("--tags")
    p.add_argument("--keys", help="comma-separated message keys")
    p.add_argument("--sharding-key", help="messages with one sharding key keep their order")
    p.add_argument("--group", default="orbit-cli-producer")
    p.set_defaults(func=produce)

    p = common(sub.add_parser("consume", help="print messages of a topic"))
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="orbit-cli-consumer")
    p.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    p.add_argument("--earliest", action="store_true", help="a new group starts at the oldest message")
    p.add_argument("--max", type=int, default=2**62, help="stop after this many messages")
    p.add_argument("--timeout-s", type=float, default=10.0, help="stop after this many seconds (default 10)")
    p.set_defaults(func=consume)

    msg = sub.add_parser("message", help="look messages up")
    msub = msg.add_subparsers(dest="what", required=True)
    p = common(msub.add_parser("get", help="a message by its offset message id, or by its id (UNIQ_KEY) and topic"))
    p.add_argument("msg_id", help="the offset message id a send returned, or the producer's message id (UNIQ_KEY)")
    p.add_argument(
        "--topic",
        help="the message's topic: needed for a producer's message id (UNIQ_KEY), which is looked up in "
        "the topic's indexes; an offset message id is read only from a broker of the topic's route",
    )
    p.set_defaults(func=message_get)
    p = common(msub.add_parser("query", help="messages of a topic by key"))
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--max", type=int, default=32)
    p.set_defaults(func=message_query)
    p = common(msub.add_parser("trace", help="a message's life: stored, delivered, consumed, retried"))
    p.add_argument("msg_id", help="the message id (UNIQ_KEY) or its offset message id")
    p.add_argument("--topic", required=True, help="the message's topic")
    p.set_defaults(func=message_trace)

    cl = sub.add_parser("cluster", help="the brokers the name servers know")
    clsub = cl.add_subparsers(dest="what", required=True)
    p = common(clsub.add_parser("status", help="role, epoch, CommitLog end and replication lag of each broker"))
    p.set_defaults(func=cluster_status)

    group = sub.add_parser("group", help="consumer groups")
    gsub = group.add_subparsers(dest="what", required=True)
    p = common(gsub.add_parser("progress", help="committed offsets and lag per queue"))
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    p.set_defaults(func=group_progress)
    p = common(gsub.add_parser("reset-offset", help="move a stopped group's offsets to a point in time"))
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    p.add_argument("--to-time", required=True, type=parse_time, help="epoch ms or ISO-8601 (UTC)")
    p.set_defaults(func=group_reset)

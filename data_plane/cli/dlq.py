"""``orbit dlq``: a consumer group's dead-letter queue ``%DLQ%<group>`` (docs/retries_and_dlq.md).

    orbit dlq list GROUP [--max N]                       parked messages, oldest first
    orbit dlq get GROUP MSG_ID                           one of them, every field (JSON)
    orbit dlq resend GROUP (MSG_ID | --all) [--to-retry] send again, reconsume times back at 0

A MSG_ID is the producer's id (UNIQ_KEY, what consumers see as ``msg_id``), the parked copy's
offset id, or the ORIGIN_MESSAGE_ID. ``resend`` sends to the original topic (every group
subscribed to it gets the message again), or with ``--to-retry`` to the group's retry topic
(only that group gets it). The dead-letter queue keeps its copy: re-sending twice sends twice.
Name servers, credentials and ``--json`` work as for the other commands (``data_plane.cli.admin``).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import orjson

from data_plane.cli.admin import _out, _run_admin, common_options, message_dict
from data_plane.store.message import StoredMessage

if TYPE_CHECKING:
    from sdk.admin import AdminClient

BODY_PREVIEW_CHARS = 60


def dead_letter_dict(m: StoredMessage) -> dict[str, Any]:
    """``message_dict`` plus where the message came from and the id to name it by."""
    from sdk.retry import PROPERTY_ORIGIN_MESSAGE_ID, original_topic

    d = message_dict(m)
    d["dlq_msg_id"] = m.msg_id
    d["msg_id"] = m.properties.get("UNIQ_KEY") or m.msg_id
    d["original_topic"] = original_topic(m.properties, m.topic)
    d["origin_message_id"] = m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID)
    return d


def _line(d: dict[str, Any]) -> str:
    body = str(d["body"]) if d["body_encoding"] == "utf-8" else f"<{d['body_encoding']}>"
    if len(body) > BODY_PREVIEW_CHARS:
        body = body[: BODY_PREVIEW_CHARS - 3] + "..."
    return (
        f"{d['msg_id']} topic={d['original_topic']} reconsumed={d['reconsume_times']} "
        f"stored={d['store_timestamp']} tags={d['tags'] or ''} {body}"
    )


def dlq_list(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        for m in await admin.dlq_messages(args.group, max_num=args.max):
            d = dead_letter_dict(m)
            _out(args, d, _line(d))
        return 0

    return _run_admin(args, work)


def dlq_get(args: argparse.Namespace) -> int:
    async def work(admin: AdminClient) -> int:
        m = await admin.dlq_message(args.group, args.msg_id)
        sys.stdout.write(orjson.dumps(dead_letter_dict(m), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0

    return _run_admin(args, work)


def dlq_resend(args: argparse.Namespace) -> int:
    if bool(args.msg_id) == bool(args.all):
        print("orbit: name one MSG_ID or pass --all", file=sys.stderr)
        return 2

    async def work(admin: AdminClient) -> int:
        if args.all:
            msgs = await admin.dlq_messages(args.group, max_num=args.max)
        else:
            msgs = [await admin.dlq_message(args.group, args.msg_id)]
        for m in msgs:
            d = dead_letter_dict(m)
            new_id = await admin.resend_dead_letter(args.group, m, to_retry_topic=args.to_retry)
            target = f"%RETRY%{args.group}" if args.to_retry else d["original_topic"]
            out = {"msg_id": d["msg_id"], "dlq_msg_id": m.msg_id, "topic": target, "offset_msg_id": new_id}
            _out(args, out, f"resent {d['msg_id']} to {target} as {new_id}")
        return 0

    return _run_admin(args, work)


def add_parser(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        common_options(p).add_argument("group", help="the consumer group")
        return p

    dlq = sub.add_parser("dlq", help="a consumer group's dead-letter queue: list, inspect, re-send")
    dsub = dlq.add_subparsers(dest="what", required=True)
    p = common(dsub.add_parser("list", help="messages parked in the group's dead-letter queue"))
    p.add_argument("--max", type=int, default=100, help="at most this many (default 100)")
    p.set_defaults(func=dlq_list)
    p = common(dsub.add_parser("get", help="one dead-lettered message, every field"))
    p.add_argument("msg_id", help="UNIQ_KEY, the parked copy's offset id, or ORIGIN_MESSAGE_ID")
    p.set_defaults(func=dlq_get)
    p = common(dsub.add_parser("resend", help="send dead-lettered messages again (reconsume times reset)"))
    p.add_argument("msg_id", nargs="?", help="the message to re-send")
    p.add_argument("--all", action="store_true", help="every message in the dead-letter queue (up to --max)")
    p.add_argument("--max", type=int, default=100_000, help="with --all: at most this many")
    p.add_argument("--to-retry", action="store_true", help="to the group's retry topic (only this group gets it)")
    p.set_defaults(func=dlq_resend)

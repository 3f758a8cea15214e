"""What a tenant needs for consumption retries and dead-letter queues (data_plane/auth): sending a
message back (36) is the group's subscribe (and the original topic's), the group's retry and
dead-letter topics are read with the group's subscribe, and only brokers write a DLQ."""

from __future__ import annotations

import pytest

from data_plane.auth.authorizer import Authorizer
from data_plane.auth.principal import Grant, Principal
from data_plane.auth.request_access import SUBSCRIBE, Need, access_of
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand

GROUP_SUB = Grant("group", "g1", ["subscribe"])
TOPIC_SUB = Grant("topic", "orders", ["subscribe"])


def tenant(*grants: Grant, name: str = "acme") -> Principal:
    return Principal.build(subject=f"{name}-ak", tenant=name, role="tenant", grants=list(grants), source="access_key")


def send_back(group: str, origin_topic: str | None = None) -> RemotingCommand:
    ext = {"offset": "4096", "group": group, "delayLevel": "0", "maxReconsumeTimes": "16"}
    if origin_topic is not None:
        ext["originTopic"] = origin_topic
    return RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=ext)


def pull(group: str, topic: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={"consumerGroup": group, "topic": topic})


@pytest.fixture
def auth() -> Authorizer:
    return Authorizer()


def test_send_back_has_an_entry_naming_the_group_and_the_original_topic() -> None:
    assert access_of(send_back("acme%g1", "acme%orders")).needs == (
        Need("group", "acme%g1", SUBSCRIBE),
        Need("topic", "acme%orders", SUBSCRIBE),
    )
    assert access_of(send_back("acme%g1")).needs == (Need("group", "acme%g1", SUBSCRIBE),)


def test_the_groups_subscribe_allows_a_send_back(auth: Authorizer) -> None:
    assert auth.authorize(tenant(GROUP_SUB, TOPIC_SUB), send_back("acme%g1", "acme%orders")) is None
    assert auth.authorize(tenant(GROUP_SUB), send_back("acme%g1")) is None
    refused = auth.authorize(tenant(TOPIC_SUB), send_back("acme%g1", "acme%orders"))
    assert refused is not None
    assert refused.code == ResponseCode.NO_PERMISSION


def test_another_tenants_group_or_topic_is_refused(auth: Authorizer) -> None:
    everything = tenant(Grant("group", "*", ["subscribe"]), Grant("topic", "*", ["subscribe"]))
    for cmd in (send_back("beta%g1", "acme%orders"), send_back("acme%g1", "beta%orders"), send_back("g1")):
        refused = auth.authorize(everything, cmd)
        assert refused is not None, cmd.ext_fields
        assert refused.code == ResponseCode.NO_PERMISSION


def test_the_retry_and_dead_letter_topics_are_read_with_the_groups_subscribe(auth: Authorizer) -> None:
    for topic in ("%RETRY%acme%g1", "%DLQ%acme%g1"):
        assert auth.authorize(tenant(GROUP_SUB), pull("acme%g1", topic)) is None
        assert auth.authorize(tenant(Grant("group", "g2", ["subscribe"])), pull("acme%g1", topic)) is not None
        assert auth.authorize(tenant(GROUP_SUB, name="beta"), pull("beta%g1", topic)) is not None


def test_only_brokers_write_a_dead_letter_queue(auth: Authorizer) -> None:
    send = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={"topic": "%DLQ%acme%g1"}, body=b"x")
    refused = auth.authorize(tenant(GROUP_SUB, Grant("topic", "*", ["publish"])), send)
    assert refused is not None
    assert "dead-letter queue" in refused.remark
    to_retry = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={"topic": "%RETRY%acme%g1"}, body=b"x")
    assert auth.authorize(tenant(GROUP_SUB), to_retry) is None  # a resend to the group's retry topic

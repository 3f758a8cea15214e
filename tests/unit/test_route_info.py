"""RouteInfoManager (route_info.py) with an injected clock, and the name server's wire bodies
(codec.py): no sockets."""

from __future__ import annotations

import struct
import zlib

import orjson
import pytest

from data_plane.namesrv.codec import encode_cluster_info, encode_route, encode_topic_list, parse_register_body
from data_plane.namesrv.route_info import RegisterResult, RouteInfoManager, RouteLimitError
from data_plane.remoting.bodies import TopicConfig, loads, topic_config
from data_plane.remoting.errors import HeaderError

MASTER_A = "10.0.0.1:10911"
SLAVE_A = "10.0.0.2:10911"
MASTER_B = "10.0.0.3:10911"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def routes(clock: Clock) -> RouteInfoManager:
    return RouteInfoManager(clock_s=clock)


def configs(*specs: tuple[str, int]) -> list[TopicConfig]:
    return [topic_config(name, n, n) for name, n in specs]


def register(
    routes: RouteInfoManager,
    addr: str = MASTER_A,
    *,
    name: str = "broker-a",
    broker_id: int = 0,
    cluster: str = "DefaultCluster",
    topics: list[TopicConfig] | None = None,
    version: tuple[int, int] = (1, 1),
    conn_id: int | None = None,
) -> RegisterResult:
    ha = addr.replace(":10911", ":10912")
    return routes.register_broker(cluster, addr, name, broker_id, ha, topics or [], version, conn_id)


def queue_nums(routes: RouteInfoManager, topic: str) -> dict[str, int]:
    route = routes.pick_route(topic)
    assert route is not None
    return {q["brokerName"]: q["writeQueueNums"] for q in route["queueDatas"]}


# --- registration and routes ----------------------------------------------------------------------


def test_a_master_registration_makes_its_topics_routable(routes: RouteInfoManager) -> None:
    result = register(routes, topics=configs(("T", 8)))
    assert result == RegisterResult(None, None)
    assert routes.pick_route("T") == {
        "queueDatas": [
            {"brokerName": "broker-a", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6, "topicSynFlag": 0}
        ],
        "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a", "brokerAddrs": {"0": MASTER_A}}],
        "filterServerTable": {},
    }
    assert routes.pick_route("unknown") is None


def test_a_slave_learns_its_master_and_leaves_the_queue_data_alone(routes: RouteInfoManager) -> None:
    assert register(routes, SLAVE_A, broker_id=1, topics=configs(("T", 8))) == RegisterResult(None, None)
    assert routes.pick_route("T") is None  # a slave never writes queue data
    register(routes, topics=configs(("T", 4)))
    assert register(routes, SLAVE_A, broker_id=1, topics=configs(("T", 99))) == RegisterResult(
        MASTER_A, "10.0.0.1:10912"
    )
    assert queue_nums(routes, "T") == {"broker-a": 4}
    route = routes.pick_route("T")
    assert route is not None
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER_A, "1": SLAVE_A}


def test_a_route_lists_only_the_brokers_serving_the_topic(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8), ("A-only", 2)))
    register(routes, MASTER_B, name="broker-b", topics=configs(("T", 4)))
    assert queue_nums(routes, "T") == {"broker-a": 8, "broker-b": 4}
    route = routes.pick_route("A-only")
    assert route is not None
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["broker-a"]


def test_queue_data_changes_only_with_a_new_data_version(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)), version=(1, 1))
    register(routes, topics=configs(("T", 16), ("U", 1)), version=(1, 1))
    assert queue_nums(routes, "T") == {"broker-a": 8}
    assert routes.pick_route("U") is None
    register(routes, topics=configs(("T", 16), ("U", 1)), version=(1, 2))
    assert queue_nums(routes, "T") == {"broker-a": 16}
    assert queue_nums(routes, "U") == {"broker-a": 1}


def test_a_topic_deleted_in_the_name_server_returns_with_the_next_data_version(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)))
    assert routes.delete_topic("T")
    assert not routes.delete_topic("T")
    register(routes, topics=configs(("T", 8)))
    assert routes.pick_route("T") is None
    register(routes, topics=configs(("T", 8)), version=(1, 2))
    assert routes.pick_route("T") is not None
    assert routes.all_topics() == ["T"]


def test_a_promoted_slave_leaves_its_old_id_and_writes_queue_data(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)))
    register(routes, SLAVE_A, broker_id=1)
    routes.unregister_broker("DefaultCluster", MASTER_A, "broker-a", 0)
    register(routes, SLAVE_A, broker_id=0, topics=configs(("T", 8), ("V", 2)))
    info = routes.cluster_info()
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": SLAVE_A}
    assert queue_nums(routes, "V") == {"broker-a": 2}


def test_an_address_moving_to_another_broker_name_leaves_the_old_one(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)))
    register(routes, name="broker-z", topics=configs(("Z", 1)))
    assert "broker-a" not in routes.cluster_info()["brokerAddrTable"]
    assert routes.pick_route("T") is None
    assert queue_nums(routes, "Z") == {"broker-z": 1}


def test_cluster_info_lists_brokers_and_clusters(routes: RouteInfoManager) -> None:
    register(routes)
    register(routes, SLAVE_A, broker_id=1)
    register(routes, MASTER_B, name="broker-b", cluster="Other")
    assert routes.cluster_info() == {
        "brokerAddrTable": {
            "broker-a": {
                "cluster": "DefaultCluster",
                "brokerName": "broker-a",
                "brokerAddrs": {"0": MASTER_A, "1": SLAVE_A},
            },
            "broker-b": {"cluster": "Other", "brokerName": "broker-b", "brokerAddrs": {"0": MASTER_B}},
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"], "Other": ["broker-b"]},
    }
    register(routes, MASTER_B, name="broker-b", cluster="DefaultCluster")  # moved between clusters
    assert routes.cluster_info()["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}


# --- removal ----------------------------------------------------------------------------------------


def test_unregister_removes_the_broker_and_with_the_last_address_its_name(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)))
    register(routes, SLAVE_A, broker_id=1)
    assert not routes.unregister_broker("DefaultCluster", MASTER_A, "broker-a", 1)  # wrong id
    assert routes.unregister_broker("DefaultCluster", MASTER_A, "broker-a", 0)
    route = routes.pick_route("T")
    assert route is not None  # the slave still serves reads
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": SLAVE_A}
    assert routes.unregister_broker("DefaultCluster", SLAVE_A, "broker-a", 1)
    assert routes.pick_route("T") is None
    assert routes.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}
    assert routes.all_topics() == []
    assert routes.broker_count == 0


def test_a_replaced_master_leaves_and_its_late_unregister_spares_the_successor(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)), conn_id=1)
    register(routes, MASTER_B, topics=configs(("T", 8)), conn_id=2)  # same name and id, new address
    assert routes.live_info(MASTER_A) is None
    assert not routes.unregister_broker("DefaultCluster", MASTER_A, "broker-a", 0)
    assert routes.on_connection_closed(1) == []
    assert queue_nums(routes, "T") == {"broker-a": 8}


def test_eviction_after_120_s_of_silence_and_not_before(routes: RouteInfoManager, clock: Clock) -> None:
    register(routes, topics=configs(("T", 8)), conn_id=7)
    register(routes, MASTER_B, name="broker-b", topics=configs(("T", 4)), conn_id=8)
    clock.now_s += 60
    register(routes, MASTER_B, name="broker-b", topics=configs(("T", 4)), conn_id=8)  # B heartbeats
    clock.now_s += 60
    assert routes.scan_not_active() == []  # exactly 120 s: still in
    assert queue_nums(routes, "T") == {"broker-a": 8, "broker-b": 4}
    clock.now_s += 0.001
    assert routes.scan_not_active() == [(MASTER_A, 7)]
    assert queue_nums(routes, "T") == {"broker-b": 4}
    assert not routes.has_connection(7)
    assert routes.has_connection(8)
    clock.now_s += 60
    assert routes.scan_not_active() == [(MASTER_B, 8)]
    assert routes.pick_route("T") is None
    assert routes.broker_count == 0


def test_eviction_honours_a_custom_expiry(routes: RouteInfoManager, clock: Clock) -> None:
    register(routes, topics=configs(("T", 8)))
    clock.now_s += 1.5
    assert routes.scan_not_active(expiry_s=2.0) == []
    assert routes.scan_not_active(expiry_s=1.0) == [(MASTER_A, None)]


def test_a_closed_connection_removes_its_brokers_at_once(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)), conn_id=1)
    register(routes, SLAVE_A, broker_id=1, conn_id=1)
    register(routes, MASTER_B, name="broker-b", topics=configs(("T", 4)), conn_id=2)
    assert routes.on_connection_closed(1) == sorted([MASTER_A, SLAVE_A])
    assert queue_nums(routes, "T") == {"broker-b": 4}
    assert routes.on_connection_closed(1) == []


def test_a_broker_reregistering_over_a_new_connection_survives_the_old_one_closing(
    routes: RouteInfoManager,
) -> None:
    register(routes, topics=configs(("T", 8)), conn_id=1)
    register(routes, topics=configs(("T", 8)), conn_id=2)
    assert routes.on_connection_closed(1) == []
    assert routes.pick_route("T") is not None
    assert routes.on_connection_closed(2) == [MASTER_A]


# --- limits -------------------------------------------------------------------------------------------


def test_the_broker_limit_refuses_new_addresses_but_not_heartbeats(clock: Clock) -> None:
    routes = RouteInfoManager(clock_s=clock, max_brokers=2)
    register(routes)
    register(routes, SLAVE_A, broker_id=1)
    with pytest.raises(RouteLimitError, match="at most 2 brokers") as e:
        register(routes, MASTER_B, name="broker-b", topics=configs(("B", 1)))
    assert e.value.limit == 2
    assert e.value.what == "brokers"
    register(routes)  # a known broker still registers
    assert "broker-b" not in routes.cluster_info()["brokerAddrTable"]
    assert routes.pick_route("B") is None


def test_the_topic_limit_refuses_a_registration_whole(clock: Clock) -> None:
    routes = RouteInfoManager(clock_s=clock, max_topics=3)
    register(routes, topics=configs(("T1", 1), ("T2", 1)))
    with pytest.raises(RouteLimitError, match="at most 3 topics"):
        register(routes, MASTER_B, name="broker-b", topics=configs(("T1", 1), ("T3", 1), ("T4", 1)))
    assert routes.broker_count == 1  # nothing of the refused registration applied
    assert sorted(routes.all_topics()) == ["T1", "T2"]
    register(routes, MASTER_B, name="broker-b", topics=configs(("T1", 1), ("T3", 1)))
    assert routes.topic_count == 3


# --- wire bodies (codec.py) -------------------------------------------------------------------------


def register_body(table: dict[str, object], version: object = None) -> bytes:
    wrapper = {"topicConfigTable": table, "dataVersion": version or {"timestamp": 5, "counter": 2}}
    return orjson.dumps({"topicConfigSerializeWrapper": wrapper, "filterServerList": []})


def test_a_json_register_body_parses_with_java_defaults_for_absent_fields() -> None:
    body = register_body({"T": topic_config("T", 8, 4, perm=4, order=True, sys_flag=1), "D": {"topicName": "D"}})
    configs_, version = parse_register_body(body)
    assert version == (5, 2)
    assert configs_ == [topic_config("T", 8, 4, perm=4, order=True, sys_flag=1), topic_config("D", 16, 16)]
    assert parse_register_body(b"") == ([], (0, 0))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (register_body({"T": "x"}), "not an object"),
        (register_body({"T": {"readQueueNums": "eight"}}), "readQueueNums"),
        (register_body({"T": {"writeQueueNums": -1}}), "writeQueueNums"),
        (register_body({"T": {"perm": True}}), "perm"),
        (register_body({"T": {"topicFilterType": "SQL"}}), "topicFilterType"),
        (register_body({"T": {"topicName": ""}}), "no topic name"),
        (register_body({"x" * 600: {}}), "longer than"),
        (register_body({}, version=[1]), "dataVersion"),
        (register_body({}, version={"timestamp": 1}), "counter"),
    ],
)
def test_a_malformed_register_body_raises_a_clear_error(body: bytes, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        parse_register_body(body)


def compressed_body(version: bytes, lines: list[bytes], count: int | None = None) -> bytes:
    parts = [struct.pack(">i", len(version)), version, struct.pack(">i", len(lines) if count is None else count)]
    for line in lines:
        parts += [struct.pack(">i", len(line)), line]
    parts += [struct.pack(">i", 2), b"[]"]
    return zlib.compress(b"".join(parts), 9)


def test_a_compressed_register_body_parses() -> None:
    body = compressed_body(b'{"counter":3,"timestamp":9}', [b"T 8 4 6 SINGLE_TAG", b"U 2 2 4 MULTI_TAG {}"])
    configs_, version = parse_register_body(body, compressed=True)
    assert version == (9, 3)
    u = topic_config("U", 2, 2, perm=4)
    u["topicFilterType"] = "MULTI_TAG"
    assert configs_ == [topic_config("T", 8, 4), u]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not zlib", "does not inflate"),
        (zlib.compress(b"\x00\x00"), "truncated"),
        (compressed_body(b'{"counter":3,"timestamp":9}', [], count=1_000_000), "announces"),
        (compressed_body(b'{"counter":3,"timestamp":9}', [b"T 8 4"]), "not 5"),
        (compressed_body(b'{"counter":3,"timestamp":9}', [b"T x 4 6 SINGLE_TAG"]), "readQueueNums"),
    ],
)
def test_a_malformed_compressed_register_body_raises_a_clear_error(body: bytes, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        parse_register_body(body, compressed=True)


def test_answers_are_written_as_fastjson_writes_them(routes: RouteInfoManager) -> None:
    register(routes, topics=configs(("T", 8)))
    register(routes, SLAVE_A, broker_id=1)
    route = routes.pick_route("T")
    assert route is not None
    body = encode_route(route)
    assert body == (
        b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
        b'"readQueueNums":8,"topicSynFlag":0,"writeQueueNums":8}]}'
    )
    assert loads(body) == route
    info = encode_cluster_info(routes.cluster_info())
    assert info.startswith(b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"10.0.0.1:10911",1:')
    assert loads(info) == routes.cluster_info()
    assert encode_topic_list(["T", "U"]) == b'{"topicList":["T","U"]}'

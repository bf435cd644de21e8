"""RouteInfoManager as a pure state machine: registration, expiry, channel loss, queries."""

from __future__ import annotations

import pytest

from pymq.common.topic import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from pymq.namesrv.routes import RouteInfoManager


def wrapper(*topics: TopicConfig, counter: int = 0) -> TopicConfigSerializeWrapper:
    return TopicConfigSerializeWrapper(
        {t.topic_name: t for t in topics}, DataVersion(timestamp=1, counter=counter)
    )


def register(
    routes: RouteInfoManager,
    *,
    name: str = "broker-a",
    addr: str = "127.0.0.1:10911",
    broker_id: int = 0,
    topics: TopicConfigSerializeWrapper | None = None,
    channel: object = None,
    now: float = 0.0,
    cluster: str = "DefaultCluster",
):
    return routes.register_broker(
        cluster_name=cluster,
        broker_addr=addr,
        broker_name=name,
        broker_id=broker_id,
        ha_server_addr=addr.rsplit(":", 1)[0] + ":10912",
        topic_config_wrapper=topics if topics is not None else wrapper(TopicConfig("T", 4, 4)),
        filter_server_list=[],
        channel=channel,
        now=now,
    )


def test_master_and_slave_share_one_broker_data() -> None:
    routes = RouteInfoManager()
    assert register(routes).master_addr is None
    result = register(routes, addr="127.0.0.1:10921", broker_id=1)
    assert result.master_addr == "127.0.0.1:10911"
    assert result.ha_server_addr == "127.0.0.1:10912"
    route = routes.pickup_topic_route_data("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
    assert [q.broker_name for q in route.queue_datas] == ["broker-a"]


def test_only_the_master_publishes_topics() -> None:
    routes = RouteInfoManager()
    register(routes, broker_id=1, topics=wrapper(TopicConfig("OnlySlave")))
    assert routes.pickup_topic_route_data("OnlySlave") is None


def test_topic_changes_apply_only_with_a_new_data_version() -> None:
    routes = RouteInfoManager()
    register(routes, topics=wrapper(TopicConfig("T", 4, 4)))
    register(routes, topics=wrapper(TopicConfig("T", 8, 8)))  # same version: ignored
    assert routes.topic_queue_table["T"]["broker-a"].write_queue_nums == 4
    register(routes, topics=wrapper(TopicConfig("T", 8, 8), counter=1))
    assert routes.topic_queue_table["T"]["broker-a"].write_queue_nums == 8


def test_switching_an_address_from_slave_to_master_keeps_one_record() -> None:
    routes = RouteInfoManager()
    register(routes, broker_id=1)
    register(routes, broker_id=0)
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:10911"}


def test_expiry_removes_silent_brokers_only() -> None:
    routes = RouteInfoManager()
    a, b = object(), object()
    register(routes, name="a", addr="h:1", channel=a, now=0)
    register(routes, name="b", addr="h:2", channel=b, now=100)
    assert routes.scan_not_active_broker(120) == []
    assert routes.scan_not_active_broker(120.5) == [("h:1", a)]
    assert set(routes.broker_addr_table) == {"b"}
    assert routes.cluster_addr_table == {"DefaultCluster": {"b"}}
    assert list(routes.topic_queue_table["T"]) == ["b"]


def test_channel_destroy_removes_the_broker_on_that_channel() -> None:
    routes = RouteInfoManager()
    channel = object()
    register(routes, channel=channel)
    routes.on_channel_destroy("127.0.0.1:55555", channel)  # peer port differs from listen port
    assert routes.broker_addr_table == {}
    assert routes.topic_queue_table == {}
    assert routes.cluster_addr_table == {}
    routes.on_channel_destroy("127.0.0.1:1", object())  # a client's connection: no effect


def test_unregister_and_queries() -> None:
    routes = RouteInfoManager()
    register(routes, topics=wrapper(TopicConfig("T"), TopicConfig("U")))
    register(routes, name="c", addr="h:9", cluster="Other", topics=wrapper(TopicConfig("V")))
    assert routes.get_all_topic_list().topic_list == ["T", "U", "V"]
    assert routes.get_topics_by_cluster("Other").topic_list == ["V"]
    system = routes.get_system_topic_list()
    assert system.topic_list == ["DefaultCluster", "broker-a", "Other", "c"]
    assert routes.wipe_write_perm_of_broker("broker-a") == 2
    assert routes.topic_queue_table["T"]["broker-a"].perm == 4
    assert routes.add_write_perm_of_broker("broker-a") == 2
    assert routes.topic_queue_table["T"]["broker-a"].perm == 6
    routes.unregister_broker("DefaultCluster", "127.0.0.1:10911", "broker-a", 0)
    assert routes.get_all_topic_list().topic_list == ["V"]
    assert "DefaultCluster" not in routes.cluster_addr_table


def test_a_compressed_register_body_that_inflates_too_far_is_refused() -> None:
    import zlib

    import pymq.common.route as route

    bomb = zlib.compress(b"\0" * (route.MAX_REGISTER_BODY_BYTES + 1), 9)
    assert len(bomb) < 200_000  # a small frame
    with pytest.raises(ValueError, match="inflates past"):
        route.RegisterBrokerBody.decode(bomb, compressed=True)


# -- the kept routes (route_body) never differ from a route built afresh ----------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pymq.common.serde import to_json  # noqa: E402
from pymq.namesrv import routes as routes_module  # noqa: E402
from pymq.remoting.protocol import fastjson  # noqa: E402

_TOPICS = ["T1", "T2", "T3"]
_BROKERS = ["broker-a", "broker-b"]
_ADDRS = ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"]
_CHANNELS = [object(), object(), object()]

_configs = st.lists(
    st.builds(
        TopicConfig,
        st.sampled_from(_TOPICS),
        st.integers(1, 3),
        st.integers(1, 3),
        st.sampled_from([2, 4, 6]),
    ),
    max_size=3,
)
_operations = st.one_of(
    st.tuples(
        st.just("register"),
        st.sampled_from(_BROKERS),
        st.integers(0, 2),  # address and channel
        st.integers(0, 1),  # broker id
        _configs,
        st.integers(0, 3),  # data version counter
        st.lists(st.sampled_from(["f1:1", "f2:1"]), max_size=2, unique=True),
    ),
    st.tuples(
        st.just("unregister"), st.sampled_from(_BROKERS), st.integers(0, 2), st.integers(0, 1)
    ),
    st.tuples(st.just("channel_destroyed"), st.integers(0, 2)),
    st.tuples(st.just("expire"), st.floats(0, 300)),
    st.tuples(st.just("delete_topic"), st.sampled_from(_TOPICS)),
    st.tuples(st.just("wipe"), st.sampled_from(_BROKERS)),
    st.tuples(st.just("add"), st.sampled_from(_BROKERS)),
    st.tuples(st.just("lookup"), st.sampled_from(_TOPICS)),
)


def _apply(routes: RouteInfoManager, op: tuple, now: float) -> None:
    kind = op[0]
    if kind == "register":
        _, name, i, broker_id, configs, counter, filters = op
        routes.register_broker(
            cluster_name="C",
            broker_addr=_ADDRS[i],
            broker_name=name,
            broker_id=broker_id,
            ha_server_addr=None,
            topic_config_wrapper=wrapper(*configs, counter=counter),
            filter_server_list=filters,
            channel=_CHANNELS[i],
            now=now,
        )
    elif kind == "unregister":
        routes.unregister_broker("C", _ADDRS[op[2]], op[1], op[3])
    elif kind == "channel_destroyed":
        routes.on_channel_destroy(_ADDRS[op[1]], _CHANNELS[op[1]])
    elif kind == "expire":
        routes.scan_not_active_broker(now + op[1])
    elif kind == "delete_topic":
        routes.delete_topic(op[1])
    elif kind == "wipe":
        routes.wipe_write_perm_of_broker(op[1])
    elif kind == "add":
        routes.add_write_perm_of_broker(op[1])
    else:
        routes.route_body(op[1])


@settings(max_examples=300)
@given(st.lists(_operations, max_size=25))
def test_kept_routes_equal_fresh_ones_after_any_changes(operations: list[tuple]) -> None:
    routes = RouteInfoManager()
    for step, op in enumerate(operations):
        _apply(routes, op, float(step))
        for topic in _TOPICS:
            fresh = routes.pickup_topic_route_data(topic)
            assert routes.route_body(topic) == (None if fresh is None else to_json(fresh)), (
                step,
                op,
            )
            assert routes.route_body(topic, standard=False) == (
                None if fresh is None else fastjson.dumps(fresh)
            ), (step, op)


def test_periodic_reregistration_keeps_the_routes() -> None:
    routes = RouteInfoManager()
    register(routes, topics=wrapper(TopicConfig("T", 4, 4), counter=1))
    body = routes.route_body("T")
    assert body is not None and routes._route_bodies
    for now in (30.0, 60.0, 90.0):  # the broker's register timer, nothing changed
        register(routes, topics=wrapper(TopicConfig("T", 4, 4), counter=1), now=now)
        assert routes._route_bodies.get("T") is body


def test_route_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_module, "ROUTE_CACHE_MAX_ENTRIES", 3)
    routes = RouteInfoManager()
    register(routes, topics=wrapper(*(TopicConfig(f"T{i}", 4, 4) for i in range(10))))
    for i in range(10):
        assert routes.route_body(f"T{i}") is not None
        assert len(routes._route_bodies) <= 3


def test_standard_route_body_is_to_json_of_the_route_data() -> None:
    """The route written straight from the tables is byte for byte the attrs route's JSON:
    broker ids past 9 (numeric order), non-ASCII names (escaped), filter servers."""
    routes = RouteInfoManager()
    for broker_id in (0, 2, 10):
        routes.register_broker(
            cluster_name="Clüster",
            broker_addr=f"10.0.0.{broker_id + 1}:10911",
            broker_name="bröker-a",
            broker_id=broker_id,
            ha_server_addr=None,
            topic_config_wrapper=wrapper(TopicConfig("T", 8, 4, 6), counter=broker_id),
            filter_server_list=["f1:1"] if broker_id == 2 else [],
            channel=object(),
            now=0.0,
        )
    fresh = routes.pickup_topic_route_data("T")
    assert fresh is not None
    assert routes.standard_route_body("T") == to_json(fresh)
    assert routes.standard_route_body("missing") is None


_names = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('"\\\x00\x01\x7f'),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(
    registrations=st.lists(
        st.tuples(
            _names,  # cluster
            st.sampled_from(["b\u00f6ker-a", 'b"x', "broker-c"]),  # broker name
            st.integers(0, 20),  # broker id
            _names,  # address
            st.integers(0, 64),  # read queues
            st.integers(0, 64),  # write queues
            st.integers(0, 7),  # perm
            st.integers(0, 2**31 - 1),  # topic sys flag
            st.lists(_names, max_size=2),  # filter servers
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_route_written_from_the_tables_is_its_json(registrations: list[tuple]) -> None:
    """standard_route_body (the route's JSON written field by field) against to_json of the
    route data, for names that need escaping, ids past 9, several brokers and filters."""
    routes = RouteInfoManager()
    for counter, (cluster, name, broker_id, addr, read, write, perm, flag, filters) in enumerate(
        registrations
    ):
        routes.register_broker(
            cluster_name=cluster,
            broker_addr=addr,
            broker_name=name,
            broker_id=broker_id,
            ha_server_addr=None,
            topic_config_wrapper=wrapper(
                TopicConfig("T", read, write, perm, topic_sys_flag=flag), counter=counter
            ),
            filter_server_list=filters,
            channel=object(),
            now=0.0,
        )
    fresh = routes.pickup_topic_route_data("T")

    def no_fallback(topic: str) -> bytes | None:
        raise AssertionError("registered fields took the json.dumps fallback")

    routes._route_body_by_dumps = no_fallback  # type: ignore[method-assign]
    assert routes.standard_route_body("T") == (None if fresh is None else to_json(fresh))


def test_a_brokers_json_is_kept_across_topics_until_a_change() -> None:
    """A broker's part of a route is written once for all its topics, and written again
    after a registration changes its addresses (every kept route is forgotten then)."""
    routes = RouteInfoManager()
    register(routes, topics=wrapper(*(TopicConfig(f"T{i}", 4, 4) for i in range(3))))
    first = routes.route_body("T0")
    assert first is not None and list(routes._broker_json) == ["broker-a"]
    kept = routes._broker_json["broker-a"]
    assert routes.route_body("T1") is not None and routes._broker_json["broker-a"] is kept
    register(routes, addr="10.0.0.9:10911", broker_id=1)  # a slave joins: a new address
    assert not routes._broker_json
    for topic in ("T0", "T1", "T2"):
        fresh = routes.pickup_topic_route_data(topic)
        assert fresh is not None and routes.route_body(topic) == to_json(fresh)
    assert '"1":"10.0.0.9:10911"' in routes._broker_json["broker-a"]


def test_a_table_field_of_another_type_is_written_by_json() -> None:
    """A queue count that is a bool, or a cluster that is None (no registration makes them),
    still gives the route's JSON: the field-by-field writer hands over to json.dumps."""
    routes = RouteInfoManager()
    register(routes, topics=wrapper(TopicConfig("T", 4, 4)))
    queue = routes.topic_queue_table["T"]["broker-a"]
    queue.perm = True  # type: ignore[assignment]
    fresh = routes.pickup_topic_route_data("T")
    assert fresh is not None and routes.standard_route_body("T") == to_json(fresh)
    queue.perm = 6
    routes.broker_addr_table["broker-a"].cluster = None  # type: ignore[assignment]
    routes._routes_changed()  # as every change of a broker's data does (its JSON is kept)
    fresh = routes.pickup_topic_route_data("T")
    assert fresh is not None and routes.standard_route_body("T") == to_json(fresh)


def test_topics_of_the_same_shape_share_one_route_body() -> None:
    """A route names no topic: the topics of a broker with the same queue counts get one
    encoded body, written once; a topic of other counts, or one changed later, gets its own,
    and every body stays the route's JSON."""
    routes = RouteInfoManager()
    register(
        routes,
        topics=wrapper(*(TopicConfig(f"T{i}", 4, 4) for i in range(3)), TopicConfig("U", 8, 8)),
    )
    bodies = [routes.route_body(f"T{i}") for i in range(3)]
    assert bodies[0] is not None and bodies[1] is bodies[0] and bodies[2] is bodies[0]
    other = routes.route_body("U")
    assert other is not None and other != bodies[0]
    register(
        routes,
        topics=wrapper(
            *(TopicConfig(f"T{i}", 4, 4) for i in range(2)),
            TopicConfig("T2", 8, 8),
            TopicConfig("U", 8, 8),
            counter=1,
        ),
    )
    assert routes.route_body("T2") is other  # now U's shape
    for topic in ("T0", "T1", "T2", "U"):
        fresh = routes.pickup_topic_route_data(topic)
        assert fresh is not None and routes.route_body(topic) == to_json(fresh)


def test_routes_differing_in_any_one_thing_share_nothing() -> None:
    """Topics whose routes differ in one queue field, or in their brokers, get bodies of
    their own whichever of them writes a body first."""
    routes = RouteInfoManager()
    variants = {
        "Same": TopicConfig("Same", 4, 4, 6),
        "Reads": TopicConfig("Reads", 8, 4, 6),
        "Writes": TopicConfig("Writes", 4, 8, 6),
        "Perm": TopicConfig("Perm", 4, 4, 4),
        "Flag": TopicConfig("Flag", 4, 4, 6, topic_sys_flag=1),
        "Both": TopicConfig("Both", 4, 4, 6),
    }
    register(routes, topics=wrapper(*variants.values()))
    register(
        routes,
        name="broker-b",
        addr="127.0.0.1:10921",
        topics=wrapper(TopicConfig("OnB", 4, 4, 6), TopicConfig("Both", 4, 4, 6)),
    )
    topics = [*variants, "OnB"]
    for first in topics:
        routes._routes_changed()
        assert routes.route_body(first) is not None
        for topic in topics:
            fresh = routes.pickup_topic_route_data(topic)
            assert fresh is not None and routes.route_body(topic) == to_json(fresh), (first, topic)


@pytest.mark.parametrize("field", ["perm", "read_queue_nums", "write_queue_nums", "topic_sys_flag"])
@pytest.mark.parametrize("value", [True, 1.0])
def test_a_field_equal_as_a_key_but_not_as_json_is_not_shared(field: str, value: object) -> None:
    """True and 1.0 equal 1 as a key but not as JSON (no registration makes them; the wire
    decoder refuses them): such a route is written for its topic alone."""
    routes = RouteInfoManager()
    same = {"read_queue_nums": 1, "write_queue_nums": 1, "perm": 1, "topic_sys_flag": 1}
    register(routes, topics=wrapper(TopicConfig("T", **same), TopicConfig("U", **same)))
    assert routes.route_body("T") is not None
    setattr(routes.topic_queue_table["U"]["broker-a"], field, value)
    routes._routes_changed("U")
    fresh = routes.pickup_topic_route_data("U")
    assert fresh is not None and routes.route_body("U") == to_json(fresh)
    assert routes.route_body("U") != routes.route_body("T")


def test_shared_route_bodies_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_module, "ROUTE_CACHE_MAX_ENTRIES", 3)
    routes = RouteInfoManager()
    register(routes, topics=wrapper(*(TopicConfig(f"T{i}", i + 1, 4) for i in range(10))))
    for i in range(10):
        assert routes.route_body(f"T{i}") is not None
        assert len(routes._shape_bodies) <= 3

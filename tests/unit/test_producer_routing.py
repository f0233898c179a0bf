"""Which partition and leader an attempt goes to (``smartnsq.producer.routing``)."""

from __future__ import annotations

import pytest

from smartnsq.errors import InvalidArgument
from smartnsq.model.dialect import DEFAULT_POLICY, ClassicPolicy
from smartnsq.model.routes import TopicRoutes
from smartnsq.model.sharding import java_partition, make_router, murmur3_partition
from smartnsq.producer.routing import check_features, choose_side, choose_target

A, B, C = ("127.0.0.1", 4150), ("127.0.0.1", 4250), ("127.0.0.1", 4350)
MURMUR = make_router("murmur3")


def youzan(partitions: int = 4, leaders: dict[int, tuple[str, int]] | None = None, *,
           ordered: bool = False, ext: bool = False) -> TopicRoutes:
    if leaders is None:
        leaders = {p: (A, B, C)[p % 3] for p in range(partitions)}
    return TopicRoutes("orders", partition_num=partitions, ordered=ordered, ext=ext,
                       youzan=True, leaders=leaders)


def target(routes: TopicRoutes, key: object = None, partition: int | None = None,
           rr: dict[str, int] | None = None, router: object = MURMUR,
           ) -> tuple[int | None, tuple[str, int] | None]:
    return choose_target(routes, key, partition, router, DEFAULT_POLICY,  # type: ignore[arg-type]
                         {} if rr is None else rr)


def test_a_key_goes_to_its_hash_partition_and_its_leader() -> None:
    routes = youzan(4)
    for key in ("hello", b"customer-42", 12345):
        p = murmur3_partition(key, 4)  # type: ignore[arg-type]
        assert target(routes, key) == (p, routes.leaders[p])
    java = make_router("java")
    assert target(routes, "hello", router=java) == (java_partition("hello", 4),
                                                    routes.leaders[java_partition("hello", 4)])


def test_a_key_whose_partition_has_no_leader_is_never_moved() -> None:
    p = murmur3_partition("hello", 4)
    leaders = {q: A for q in range(4) if q != p}
    assert target(youzan(4, leaders), "hello") == (p, None)


def test_an_explicit_partition() -> None:
    assert target(youzan(4), partition=2) == (2, C)
    assert target(youzan(4, {0: A}), partition=3) == (3, None)
    with pytest.raises(InvalidArgument, match="partition"):
        target(youzan(4), partition=4)


def test_unpinned_publishes_round_robin_over_partitions_with_a_leader() -> None:
    routes = youzan(4, {0: A, 2: B, 3: C})
    rr: dict[str, int] = {}
    picked = [target(routes, rr=rr)[0] for _ in range(6)]
    assert picked == [0, 2, 3, 0, 2, 3]
    assert rr == {"orders": 6}
    assert target(youzan(4, {})) == (None, None)


def test_ordered_topics_refuse_unpinned_publishes() -> None:
    with pytest.raises(InvalidArgument, match="ordered"):
        target(youzan(2, ordered=True))
    assert target(youzan(2, ordered=True), partition=1)[0] == 1


def test_classic_topics() -> None:
    routes = TopicRoutes("orders", youzan=False, nodes=(A, B))
    rr: dict[str, int] = {}
    assert [target(routes, rr=rr) for _ in range(3)] == [(None, A), (None, B), (None, A)]
    placed = target(routes, "hello")
    assert placed[0] is None and placed[1] in (A, B)
    assert target(routes, "hello") == placed  # the same key, the same node
    with pytest.raises(InvalidArgument, match="sharding_key"):
        choose_target(routes, "hello", None, MURMUR, ClassicPolicy(shard_over_nodes=False), {})
    with pytest.raises(InvalidArgument, match="partition"):
        target(routes, partition=0)


def test_standalone_youzan_nodes_cannot_shard() -> None:
    routes = TopicRoutes("orders", youzan=True, leaders={0: A})
    with pytest.raises(InvalidArgument, match="partition count"):
        target(routes, "hello")


def test_the_migration_chooser_only_sees_topics_on_both_kinds() -> None:
    seen = []

    class Chooser:
        def choose(self, routes: TopicRoutes, key: object) -> TopicRoutes:
            seen.append(key)
            return TopicRoutes(routes.topic, youzan=False, nodes=routes.nodes)

    both = TopicRoutes("orders", partition_num=1, youzan=True, leaders={0: A}, nodes=(B,))
    assert choose_side(both, "k", Chooser()).nodes == (B,)
    assert choose_side(youzan(2), "k", Chooser()).youzan
    assert choose_side(both, "k", None) is both
    assert seen == ["k"]


def test_features_the_routes_refuse() -> None:
    check_features(youzan(2, ext=True), True, None, DEFAULT_POLICY)
    with pytest.raises(InvalidArgument, match="headers"):
        check_features(youzan(2), True, None, DEFAULT_POLICY)
    with pytest.raises(InvalidArgument, match="delay"):
        check_features(youzan(2), False, 1000, DEFAULT_POLICY)
    classic = TopicRoutes("orders", youzan=False, nodes=(A,))
    check_features(classic, False, 1000, DEFAULT_POLICY)
    with pytest.raises(InvalidArgument, match="headers"):
        check_features(classic, True, None, DEFAULT_POLICY)
    check_features(classic, True, None, ClassicPolicy(drop_headers=True))

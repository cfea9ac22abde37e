"""plan_chain: execution order from ``next`` links, and the graph errors that need the whole node list."""

from __future__ import annotations

from typing import Any

import pytest

from pipeserve.errors import SpecError
from pipeserve.pipeline.graph import plan_chain, successor
from pipeserve.pipeline.spec import NodeSpec


def nodes(*specs: tuple[str, str | None]) -> list[NodeSpec]:
    """Step nodes from (name, next) pairs."""
    built = []
    for name, nxt in specs:
        raw: dict[str, Any] = {"name": name, "step": "softmax"}
        if nxt is not None:
            raw["next"] = nxt
        built.append(NodeSpec.model_validate(raw))
    return built


def test_default_order_is_the_listed_order():
    plan = plan_chain(nodes(("a", None), ("b", None), ("c", None)), None)

    assert plan.order == ("a", "b", "c")
    assert plan.unreachable == ()


def test_next_skips_nodes_and_reports_them_unreachable():
    plan = plan_chain(nodes(("m1", "m3"), ("m2", None), ("m3", None)), "m1")

    assert plan.order == ("m1", "m3")
    assert plan.unreachable == ("m2",)


def test_start_node_can_be_any_node():
    plan = plan_chain(nodes(("a", None), ("b", None), ("c", None)), "b")

    assert plan.order == ("b", "c")
    assert plan.unreachable == ("a",)


def test_next_can_jump_backwards_without_a_cycle():
    plan = plan_chain(nodes(("a", "c"), ("b", "d"), ("c", "b"), ("d", None)), None)

    assert plan.order == ("a", "c", "b", "d")


def test_successor_is_next_then_the_following_node_then_none():
    chain = nodes(("a", "c"), ("b", None), ("c", None))

    assert [successor(chain, i) for i in range(3)] == ["c", "c", None]


def test_unknown_next_names_file_node_and_field():
    with pytest.raises(SpecError) as info:
        plan_chain(nodes(("a", None), ("b", "zz")), None, file="p.yaml")

    err = info.value
    assert (err.file, err.node, err.field) == ("p.yaml", "b", "next")
    assert str(err).startswith("p.yaml: node 'b': field 'next': ")
    assert "'zz'" in str(err)


def test_unknown_start_node():
    with pytest.raises(SpecError) as info:
        plan_chain(nodes(("a", None)), "m9", file="p.yaml")

    assert info.value.field == "start_node_name"
    assert "p.yaml" in str(info.value)
    assert "'m9'" in str(info.value)


def test_duplicate_names():
    with pytest.raises(SpecError) as info:
        plan_chain(nodes(("a", None), ("b", None), ("a", None)), None, file="p.yaml")

    assert (info.value.node, info.value.field) == ("a", "name")
    assert "duplicate" in str(info.value)


@pytest.mark.parametrize(
    ("chain", "cycle"),
    [
        ((("a", "a"),), "a -> a"),
        ((("a", "b"), ("b", "a")), "a -> b -> a"),
        ((("x", "a"), ("a", "b"), ("b", "c"), ("c", "a")), "a -> b -> c -> a"),
    ],
    ids=["self", "two", "behind-a-prefix"],
)
def test_cycle_message_contains_the_cycle_path(chain, cycle):
    with pytest.raises(SpecError) as info:
        plan_chain(nodes(*chain), None, file="p.yaml")

    assert info.value.field == "next"
    assert f"cycle: {cycle}" in str(info.value)
    assert "p.yaml" in str(info.value)


def test_cycle_through_the_default_successor():
    # "b" has no next, so it falls through to "c", whose next leads back to "b".
    with pytest.raises(SpecError, match=r"cycle: b -> c -> b"):
        plan_chain(nodes(("a", None), ("b", None), ("c", "b")), None)

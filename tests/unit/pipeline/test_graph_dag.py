"""build_graph: chains, named inputs, endpoints and their plans."""

from __future__ import annotations

from typing import Any

import pytest

from pipeserve.errors import SpecError
from pipeserve.pipeline.graph import INPUT, build_graph
from pipeserve.pipeline.spec import NodeSpec


def node(name: str, **extra: Any) -> NodeSpec:
    return NodeSpec.model_validate({"name": name, "step": "softmax", **extra})


def test_a_chain_has_one_plan_and_each_node_takes_the_previous() -> None:
    graph = build_graph([node("a"), node("b"), node("c")], None)
    assert graph.plans == {"predict": ("a", "b", "c")}
    assert graph.deps == {"a": (INPUT,), "b": ("a",), "c": ("b",)}
    assert graph.unreachable == ()


def test_the_seed_chain_skips_m2() -> None:
    graph = build_graph([node("m1", next="m3"), node("m2"), node("m3")], "m1")
    assert graph.plans["predict"] == ("m1", "m3")
    assert graph.unreachable == ("m2",)


def test_a_branch_with_inputs_starts_its_own_chain_and_endpoint() -> None:
    nodes = [
        node("decode"),
        node("prep"),
        node("model"),
        node("soft"),
        node("embed", inputs=["prep"]),
        node("head"),
        node("top"),
    ]
    graph = build_graph(nodes, None, endpoints={"embedding": "embed", "tag": "top"})
    assert graph.plans["predict"] == ("decode", "prep", "model", "soft"), "the main chain stops before `embed`"
    assert graph.plans["embedding"] == ("decode", "prep", "embed")
    assert graph.plans["tag"] == ("decode", "prep", "embed", "head", "top")
    assert graph.deps["embed"] == ("prep",)
    assert graph.deps["head"] == ("embed",)


def test_fan_in_takes_a_dict() -> None:
    nodes = [node("a"), node("b", inputs=["a"]), node("c", inputs=["a"]), node("join", inputs={"x": "b", "y": "c"})]
    graph = build_graph(nodes, None, output="join")
    assert graph.plans["predict"] == ("a", "b", "c", "join")
    assert graph.keys["join"] == ("x", "y")
    assert graph.deps["join"] == ("b", "c")
    several = build_graph([node("a"), node("b", inputs=["a", INPUT])], None, output="b")
    assert several.keys["b"] == ("a", INPUT)
    assert graph.consumers(graph.plans["predict"]) == {"a": 2, "b": 1, "c": 1, "join": 1}


@pytest.mark.parametrize(
    ("nodes", "kwargs", "match"),
    [
        ([node("a"), node("b", inputs=["zz"])], {}, "node 'b': field 'inputs': unknown node 'zz'"),
        ([node("a"), node("b", inputs=["b"])], {}, "cannot take its own output"),
        ([node("a"), node("b")], {"endpoints": {"x": "nope"}}, "endpoint 'x' names unknown node 'nope'"),
        ([node("a"), node("b")], {"output": "nope"}, "field 'output'"),
        ([node("a", next="c"), node("b", inputs=["a"], next="c"), node("c")], {"output": "c"}, "reached both"),
        ([node("a", next="b"), node("b", inputs=["a"])], {}, "declares inputs, so it cannot also be a `next`"),
        ([node("a"), node("b", inputs=["c"]), node("c", inputs=["b"])], {"output": "c"}, "cycle through inputs"),
        ([node("a", next="c"), node("b"), node("c")], {"endpoints": {"x": "b"}}, "receives no input"),
    ],
)
def test_graph_errors_name_the_node_and_field(nodes: list[NodeSpec], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        build_graph(nodes, None, file="p.yaml", **kwargs)


def test_nodes_no_endpoint_needs_are_unreachable() -> None:
    graph = build_graph([node("a"), node("b"), node("side", inputs=["a"])], None)
    assert graph.plans == {"predict": ("a", "b")}
    assert graph.unreachable == ("side",)

"""Execution order of a pipeline's nodes, with the checks that need the whole graph. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeserve.errors import SpecError
from pipeserve.pipeline.spec import NodeSpec


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The nodes a request visits, in order, and those it never reaches."""

    order: tuple[str, ...]
    unreachable: tuple[str, ...]


def successor(nodes: Sequence[NodeSpec], index: int) -> str | None:
    """The node after ``nodes[index]``: its ``next``, else the next node listed, else none (the end)."""
    node = nodes[index]
    if node.next is not None:
        return node.next
    return nodes[index + 1].name if index + 1 < len(nodes) else None


def plan_chain(nodes: Sequence[NodeSpec], start: str | None, *, file: str | None = None) -> ExecutionPlan:
    """Follow ``next`` links from ``start`` (default: the first node) and return the order.

    Raises:
        SpecError: duplicate names, an unknown ``start_node_name`` or ``next``, or a cycle.

    Example:
        >>> from pipeserve.pipeline.spec import NodeSpec
        >>> n = [NodeSpec.model_validate({"name": x, "step": "softmax"}) for x in ("a", "b", "c")]
        >>> plan_chain(n, "a").order
        ('a', 'b', 'c')
    """
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.name in index:
            raise SpecError(
                f"duplicate node name (also node #{index[node.name] + 1})", file=file, node=node.name, field="name"
            )
        index[node.name] = i
    known = ", ".join(index)
    for node in nodes:
        if node.next is not None and node.next not in index:
            raise SpecError(f"unknown node {node.next!r} (known: {known})", file=file, node=node.name, field="next")
    first = start if start is not None else nodes[0].name
    if first not in index:
        raise SpecError(f"start_node_name {first!r} is not a node (known: {known})", file=file, field="start_node_name")
    order: list[str] = []
    current: str | None = first
    while current is not None:
        if current in order:
            cycle = " -> ".join([*order[order.index(current) :], current])
            raise SpecError(f"cycle: {cycle}", file=file, node=order[-1], field="next")
        order.append(current)
        current = successor(nodes, index[current])
    seen = set(order)
    return ExecutionPlan(order=tuple(order), unreachable=tuple(n.name for n in nodes if n.name not in seen))

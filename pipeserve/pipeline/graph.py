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


#: The name under which a request's decoded input is available to nodes (``inputs: [$input]``).
INPUT = "$input"
#: The endpoint every pipeline has: ``POST /predict`` answers its output.
DEFAULT_ENDPOINT = "predict"


@dataclass(frozen=True, slots=True)
class Graph:
    """A pipeline's nodes as a graph: what each node takes, and which nodes each endpoint needs, in order.

    A node without ``inputs`` takes the output of the node before it on its chain (``next``, or the next node
    listed); the start node takes the request's input. A node with ``inputs`` starts a chain of its own and
    takes the named nodes' outputs: one name passes that output as it is, several pass a dict by node name,
    a mapping passes a dict under the given keys.
    """

    deps: dict[str, tuple[str, ...]]
    keys: dict[str, tuple[str, ...] | None]
    endpoints: dict[str, str]
    plans: dict[str, tuple[str, ...]]
    unreachable: tuple[str, ...]

    def consumers(self, plan: tuple[str, ...]) -> dict[str, int]:
        """How many nodes of ``plan`` take each node's output (the endpoint's target counts once more)."""
        counts = dict.fromkeys(plan, 0)
        for name in plan:
            for dep in self.deps[name]:
                if dep in counts:
                    counts[dep] += 1
        counts[plan[-1]] += 1
        return counts


def build_graph(
    nodes: Sequence[NodeSpec],
    start: str | None,
    *,
    output: str | None = None,
    endpoints: dict[str, str] | None = None,
    file: str | None = None,
) -> Graph:
    """Resolve chains and ``inputs`` into dependencies, and each endpoint into the ordered nodes it needs.

    Raises:
        SpecError: unknown node names, a node reached by two chains, a cycle, or an endpoint whose node
            cannot receive any input.
    """
    index = _index(nodes, file)
    known = ", ".join(index)
    first = start if start is not None else nodes[0].name
    if first not in index:
        raise SpecError(f"start_node_name {first!r} is not a node (known: {known})", file=file, field="start_node_name")
    deps: dict[str, tuple[str, ...]] = {}
    keys: dict[str, tuple[str, ...] | None] = {}
    for node in nodes:
        if node.inputs is not None:
            names, node_keys = _declared_inputs(node, index, known, file)
            deps[node.name], keys[node.name] = names, node_keys
    if first not in deps:
        deps[first], keys[first] = (INPUT,), None
    chain_of: dict[str, str] = {}
    for root in [first, *(n.name for n in nodes if n.inputs is not None and n.name != first)]:
        _follow_chain(nodes, index, root, deps, keys, chain_of, file)
    outputs = dict(endpoints or {})
    default_target = output if output is not None else _chain_end(nodes, index, first)
    outputs = {DEFAULT_ENDPOINT: default_target, **outputs}
    plans: dict[str, tuple[str, ...]] = {}
    for endpoint, target in outputs.items():
        field = "output" if endpoint == DEFAULT_ENDPOINT and output is not None else f"endpoints.{endpoint}"
        if target not in index:
            raise SpecError(
                f"endpoint {endpoint!r} names unknown node {target!r} (known: {known})", file=file, field=field
            )
        plans[endpoint] = _plan(target, deps, index, file)
    needed = {name for plan in plans.values() for name in plan}
    unreachable = tuple(n.name for n in nodes if n.name not in needed)
    return Graph(deps=deps, keys=keys, endpoints=outputs, plans=plans, unreachable=unreachable)


def _index(nodes: Sequence[NodeSpec], file: str | None) -> dict[str, int]:
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
    return index


def _declared_inputs(
    node: NodeSpec, index: dict[str, int], known: str, file: str | None
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    raw = node.inputs
    assert raw is not None  # the caller checks
    if isinstance(raw, dict):
        keys: tuple[str, ...] | None = tuple(raw)
        names = tuple(raw.values())
    else:
        names = tuple(raw)
        keys = names if len(names) > 1 else None
    for name in names:
        if name != INPUT and name not in index:
            raise SpecError(
                f"unknown node {name!r} (known: {known}, or {INPUT} for the request)",
                file=file,
                node=node.name,
                field="inputs",
            )
        if name == node.name:
            raise SpecError("a node cannot take its own output", file=file, node=node.name, field="inputs")
    return names, keys


def chained_successor(nodes: Sequence[NodeSpec], index: int) -> str | None:
    """Like ``successor``, but a node that declares ``inputs`` is never reached by "the next node listed"."""
    node = nodes[index]
    if node.next is not None:
        return node.next
    if index + 1 < len(nodes) and nodes[index + 1].inputs is None:
        return nodes[index + 1].name
    return None


def _follow_chain(
    nodes: Sequence[NodeSpec],
    index: dict[str, int],
    root: str,
    deps: dict[str, tuple[str, ...]],
    keys: dict[str, tuple[str, ...] | None],
    chain_of: dict[str, str],
    file: str | None,
) -> None:
    current: str | None = root
    previous: str | None = None
    seen: list[str] = []
    while current is not None:
        if current in seen:
            cycle = " -> ".join([*seen[seen.index(current) :], current])
            raise SpecError(f"cycle: {cycle}", file=file, node=seen[-1], field="next")
        if previous is not None:
            if current in chain_of and chain_of[current] != root:
                raise SpecError(
                    f"node {current!r} is reached both from {chain_of[current]!r} and from {root!r}; give it "
                    "`inputs` to say what it takes",
                    file=file,
                    node=previous,
                    field="next",
                )
            if nodes[index[current]].inputs is not None:
                raise SpecError(
                    f"node {current!r} declares inputs, so it cannot also be a `next`",
                    file=file,
                    node=previous,
                    field="next",
                )
            deps[current], keys[current] = (previous,), None
        chain_of[current] = root
        seen.append(current)
        previous, current = current, chained_successor(nodes, index[current])


def _chain_end(nodes: Sequence[NodeSpec], index: dict[str, int], first: str) -> str:
    current = first
    while (following := chained_successor(nodes, index[current])) is not None:
        current = following
    return current


def _plan(target: str, deps: dict[str, tuple[str, ...]], index: dict[str, int], file: str | None) -> tuple[str, ...]:
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise SpecError(f"cycle through inputs: {cycle}", file=file, node=name, field="inputs")
        if name not in deps:
            raise SpecError(
                "this node receives no input: it is not the start node, no `next` leads to it and it declares no "
                "`inputs`",
                file=file,
                node=name,
                field="inputs",
            )
        state[name] = 1
        for dep in sorted(deps[name], key=lambda d: index.get(d, -1)):
            if dep != INPUT:
                visit(dep, (*path, name))
        state[name] = 2
        order.append(name)

    visit(target, ())
    return tuple(order)

"""Program building checks slot flow; `when` selects nodes per request."""

import pytest

from vidloom.core.program import Node, Program, ProgramError
from vidloom.core.request import GenerationRequest


def _node(name, reads, writes, when=None):
    return Node(name, reads=reads, writes=writes, run=lambda slots, ctx: {w: name for w in writes}, when=when)


def test_reads_are_satisfied_by_request_inputs_and_earlier_writes_only():
    # c reads a request input and a slot written two nodes earlier: valid.
    Program(
        nodes=(_node("a", ("request",), ("x",)), _node("b", ("x",), ("y",)), _node("c", ("request", "x"), ("z",))),
        inputs=frozenset({"request"}),
        outputs=("y", "z"),
    )
    # The error lists exactly the slots nothing provides, not the ones that are provided.
    with pytest.raises(ProgramError, match=r"node 'c' reads \['w', 'v'\] but no earlier node"):
        Program(
            nodes=(_node("a", ("request",), ("x",)), _node("c", ("x", "w", "request", "v"), ("z",))),
            inputs=frozenset({"request"}), outputs=("z",),
        )
    # A slot is not available to the node that writes it.
    with pytest.raises(ProgramError, match=r"node 'a' reads \['x'\]"):
        Program(nodes=(_node("a", ("x",), ("x",)),), inputs=frozenset(), outputs=("x",))


def test_read_before_write_fails_naming_node_and_slot():
    with pytest.raises(ProgramError, match=r"node 'b' reads \['z'\]"):
        Program(nodes=(_node("a", ("request",), ("x",)), _node("b", ("z",), ("y",))), inputs=frozenset({"request"}), outputs=("y",))


def test_slot_written_later_does_not_count():
    with pytest.raises(ProgramError):
        Program(nodes=(_node("b", ("x",), ("y",)), _node("a", ("request",), ("x",))), inputs=frozenset({"request"}), outputs=("y",))


def test_unwritten_output_fails():
    with pytest.raises(ProgramError, match=r"program outputs \['video', 'audio'\] are never written"):
        Program(nodes=(_node("a", ("request",), ("x",)),), inputs=frozenset({"request"}), outputs=("x", "video", "audio"))


def test_duplicate_node_names_fail():
    with pytest.raises(ProgramError, match="duplicate"):
        Program(nodes=(_node("a", ("request",), ("x",)), _node("a", ("x",), ("y",))), inputs=frozenset({"request"}), outputs=("y",))


def test_node_needs_exactly_one_body():
    with pytest.raises(ValueError):
        Node("n", reads=(), writes=())


def test_when_selects_nodes_and_keeps_their_order():
    seen = []

    def only_cfg(request):
        seen.append(request)
        return request.uses_cfg

    program = Program(
        nodes=(_node("a", ("request",), ("x",)), _node("neg", ("request",), ("n",), when=only_cfg),
               _node("b", ("x",), ("y",)), _node("c", ("y",), ("z",), when=lambda r: r.seed == 3)),
        inputs=frozenset({"request"}),
        outputs=("z",),
    )
    guided = GenerationRequest("p", guidance_scale=5.0, seed=3)
    assert [n.name for n in program.active_nodes(guided)] == ["a", "neg", "b", "c"]
    assert seen == [guided] and seen[0] is guided  # `when` is asked about this very request
    assert [n.name for n in program.active_nodes(GenerationRequest("p", guidance_scale=1.0, seed=3))] == ["a", "b", "c"]
    assert [n.name for n in program.active_nodes(GenerationRequest("p", guidance_scale=5.0, seed=4))] == ["a", "neg", "b"]
    # guidance 1.0 turns CFG off (diffusers: > 1): the boundary itself
    assert [n.name for n in program.active_nodes(GenerationRequest("p", guidance_scale=1.0001))][:2] == ["a", "neg"]
    assert Node("n", (), (), run=lambda s, c: {}).applies(GenerationRequest("p"))  # no `when`: always

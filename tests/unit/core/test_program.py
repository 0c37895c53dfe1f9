"""Program building checks slot flow; `when` selects nodes per request."""

import pytest

from vidloom.core.program import Node, Program, ProgramError
from vidloom.core.request import GenerationRequest


def _node(name, reads, writes, when=None):
    return Node(name, reads=reads, writes=writes, run=lambda slots, ctx: {w: name for w in writes}, when=when)


def test_valid_program_builds():
    program = Program(
        nodes=(_node("a", ("request",), ("x",)), _node("b", ("x",), ("y",))),
        inputs=frozenset({"request"}),
        outputs=("y",),
    )
    assert [n.name for n in program.nodes] == ["a", "b"]


def test_read_before_write_fails_naming_node_and_slot():
    with pytest.raises(ProgramError, match=r"node 'b' reads \['z'\]"):
        Program(nodes=(_node("a", ("request",), ("x",)), _node("b", ("z",), ("y",))), inputs=frozenset({"request"}), outputs=("y",))


def test_slot_written_later_does_not_count():
    with pytest.raises(ProgramError):
        Program(nodes=(_node("b", ("x",), ("y",)), _node("a", ("request",), ("x",))), inputs=frozenset({"request"}), outputs=("y",))


def test_unwritten_output_fails():
    with pytest.raises(ProgramError, match="never written"):
        Program(nodes=(_node("a", ("request",), ("x",)),), inputs=frozenset({"request"}), outputs=("video",))


def test_duplicate_node_names_fail():
    with pytest.raises(ProgramError, match="duplicate"):
        Program(nodes=(_node("a", ("request",), ("x",)), _node("a", ("x",), ("y",))), inputs=frozenset({"request"}), outputs=("y",))


def test_node_needs_exactly_one_body():
    with pytest.raises(ValueError):
        Node("n", reads=(), writes=())


def test_when_selects_nodes():
    only_cfg = _node("neg", ("request",), ("n",), when=lambda r: r.uses_cfg)
    program = Program(nodes=(_node("a", ("request",), ("x",)), only_cfg), inputs=frozenset({"request"}), outputs=("x",))
    assert [n.name for n in program.active_nodes(GenerationRequest("p", guidance_scale=5.0))] == ["a", "neg"]
    assert [n.name for n in program.active_nodes(GenerationRequest("p", guidance_scale=1.0))] == ["a"]

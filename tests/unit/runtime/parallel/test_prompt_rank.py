"""--text-encoder-rank without processes: the plan and the cards refuse what cannot work, naming the field; the
flag reaches the plan; an encoded prompt's nest crosses ranks intact; the receiving rank holds no encoder weights.
(tests/integration/test_parallel_text_encoder_rank.py runs real pools; the capability audit runs thread ranks.)"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom import registry
from vidloom.cli import build_parser
from vidloom.cli.deploy_args import deploy_config
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.parallel import ParallelPlan, TokenLayout
from vidloom.core.program import Node, Program
from vidloom.runtime.parallel.plan import check_model
from vidloom.runtime.parallel.prompt_rank import encode_on_one_rank, pack, unpack
from vidloom.runtime.parallel.shard_weights import held_weight_bytes
from vidloom.text_encoders.elsewhere import EncoderElsewhere, encoder_or_elsewhere

CPU = torch.device("cpu")


@pytest.mark.parametrize("kwargs, match", [
    (dict(text_encoder_rank=0), r"parallel.text_encoder_rank \(--text-encoder-rank\) .* runs one process"),
    (dict(sp=2, text_encoder_rank=2), r"parallel.text_encoder_rank \(--text-encoder-rank\) is 2, .* ranks 0 to 1"),
    (dict(sp=2, cfg=2, text_encoder_rank=-1), r"parallel.text_encoder_rank .* must be a rank number >= 0"),
    (dict(sp=2, text_encoder_rank=True), r"parallel.text_encoder_rank .* must be a rank number"),
])
def test_the_plan_refuses_a_rank_it_does_not_have(kwargs, match):
    with pytest.raises(DeployError, match=match):
        ParallelPlan(**kwargs)


@pytest.mark.parametrize("model", ["cosmos3-demo", "helios-demo"])
def test_a_family_whose_prompt_is_not_one_encoder_node_refuses_it_by_name(model):
    deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2, text_encoder_rank=0))
    with pytest.raises(DeployError, match=r"text_encoder_rank \(--text-encoder-rank\): "):
        registry.check_deploy(registry.resolve_card(model), deploy)


def test_a_layout_without_prompt_nodes_refuses_it():
    layout = TokenLayout(num_heads=2, streams=("text", "image"), split="pad", prompt_nodes=())
    with pytest.raises(DeployError, match=r"parallel.text_encoder_rank \(--text-encoder-rank\): this model encodes"):
        check_model(ParallelPlan(sp=2, text_encoder_rank=1), layout)


def test_the_flag_reaches_the_plan_and_its_description():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--sp", "2", "--text-encoder-rank", "1"])
    plan = deploy_config(args).parallel
    assert plan.text_encoder_rank == 1 and plan.describe() == "sp=2 x cfg=1 (text encoder on rank 1)"


@dataclass(frozen=True)
class _Embeds:
    text: torch.Tensor
    mask: torch.Tensor | None
    lengths: tuple[int, ...]


Pair = namedtuple("Pair", "cond uncond")


def test_a_nest_of_tensors_none_tuples_and_dataclasses_packs_and_unpacks_intact():
    value = {"prompt_embeds": Pair(_Embeds(torch.randn(1, 3, 4), None, (3,)), [torch.arange(5), "text", 2.5]),
             "negative_embeds": None, "global_states": torch.ones(2, dtype=torch.bfloat16)}
    sent: list[torch.Tensor] = []
    nest = pack(value, sent, CPU)
    assert len(sent) == 3
    back = unpack(nest, [t.clone() for t in sent])
    assert back["negative_embeds"] is None and isinstance(back["prompt_embeds"], Pair)
    embeds = back["prompt_embeds"].cond
    assert isinstance(embeds, _Embeds) and embeds.mask is None and embeds.lengths == (3,)
    assert torch.equal(embeds.text, value["prompt_embeds"].cond.text)
    assert back["prompt_embeds"].uncond[1:] == ["text", 2.5]
    assert back["global_states"].dtype == torch.bfloat16


def _encode_program(calls: list[int], rank: int, fail: bool = False) -> Program:
    def encode(slots, ctx):
        calls.append(rank)
        if fail:
            raise InvalidRequest("prompt", "too long")
        return {"prompt_embeds": _Embeds(torch.full((1, 2, 3), 7.0), torch.ones(1, 2, dtype=torch.bool), (2,)),
                "negative_embeds": None}

    return Program(nodes=(Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"),
                               run=encode),), inputs=frozenset({"request"}), outputs=("prompt_embeds",))


@pytest.mark.parametrize("fail", [False, True])
def test_only_the_owner_runs_the_node_and_every_rank_gets_its_slots_or_its_error(fail):
    calls: list[int] = []

    def rank(comm):
        program = encode_on_one_rank(_encode_program(calls, comm.rank, fail), ("encode_text",), 2, comm, CPU)
        try:
            return program.nodes[0].run({"request": None}, None)
        except InvalidRequest as exc:
            return exc

    results = run_ranks(thread_group(3), rank)
    assert calls == [2]
    if fail:
        assert all(isinstance(r, InvalidRequest) and (r.field, r.message) == ("prompt", "too long") for r in results)
        return
    for slots in results:
        assert slots["negative_embeds"] is None and slots["prompt_embeds"].lengths == (2,)
        assert torch.equal(slots["prompt_embeds"].text, torch.full((1, 2, 3), 7.0))
        assert slots["prompt_embeds"].mask.dtype == torch.bool


def test_a_program_without_the_prompt_node_is_refused():
    program = _encode_program([], 0)
    with pytest.raises(DeployError, match=r"has no prompt node \(encode_prompt\)"):
        encode_on_one_rank(program, ("encode_prompt",), 0, thread_group(1)[0], CPU)


def test_the_rank_without_the_encoder_holds_none_of_its_bytes():
    encoder = torch.nn.Linear(8, 8)
    deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2, text_encoder_rank=0))
    here = encoder_or_elsewhere(lambda: encoder, deploy, here=True)
    away = encoder_or_elsewhere(lambda: pytest.fail("a receiving rank loaded the encoder"), deploy, here=False)
    assert here is encoder and isinstance(away, EncoderElsewhere)
    assert held_weight_bytes({"text_encoder": here}) == (64 + 8) * 4
    assert held_weight_bytes({"text_encoder": away}) == 0
    with pytest.raises(AttributeError, match=r"text_encoder is held by rank 0 \(parallel.text_encoder_rank\)"):
        away.encode(["x"])

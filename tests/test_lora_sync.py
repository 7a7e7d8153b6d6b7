"""LoRA sync by adapters (`hybrid_engines/lora_sync.py`): adapter layouts follow the weight's TP split, and
every rank's merge equals its slice of W + (B @ A) * scaling, for row- and column-split weights, over rounds."""

import torch

from rlinf_like.hybrid_engines.lora_sync import AdapterMerger, AdapterSpec, adapter_layouts, with_adapters
from rlinf_like.hybrid_engines.reshard.layout import box_slices, sharded

OUT, IN, R, SCALING = 8, 6, 2, 1.5
COLUMN = sharded("m.q_proj.weight", (OUT, IN), 2, dim=0, mode="chunk")  # column-parallel: output rows split
ROW = sharded("m.o_proj.weight", (OUT, IN), 2, dim=1, mode="chunk")  # row-parallel: input columns split


def test_adapter_layouts_take_the_rows_or_columns_their_weight_slice_needs():
    a, b = adapter_layouts(COLUMN, R)
    assert (a.name, b.name) == ("m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight")
    assert a.boxes == (((0, 2), (0, 6)),) * 2 and b.boxes == (((0, 4), (0, 2)), ((4, 8), (0, 2)))
    a, b = adapter_layouts(ROW, R)
    assert a.boxes == (((0, 2), (0, 3)), ((0, 2), (3, 6))) and b.boxes == (((0, 8), (0, 2)),) * 2
    spec = AdapterSpec(rank=R, scaling=SCALING, targets=("m.q_proj.weight",))
    assert [l.name for l in with_adapters([COLUMN, ROW], spec)] == [
        "m.q_proj.weight", "m.o_proj.weight", "m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight"]


def test_each_rank_serves_its_slice_of_the_merged_weight_over_full_and_adapter_only_rounds():
    g = torch.Generator().manual_seed(0)
    base = {l.name: torch.randn(OUT, IN, generator=g) for l in (COLUMN, ROW)}
    spec = AdapterSpec(rank=R, scaling=SCALING, targets=tuple(base))
    for rank in range(2):
        served = {l.name: base[l.name][box_slices(l.boxes[rank])].clone() for l in (COLUMN, ROW)}
        merger = AdapterMerger(spec, served, [COLUMN, ROW], rank)
        for round_, full in enumerate((True, False, False)):
            adapters = {}
            for l in (COLUMN, ROW):
                a, b = torch.randn(R, IN, generator=g), torch.randn(OUT, R, generator=g)
                adapters[l.name] = (a, b)
                la, lb = adapter_layouts(l, R)
                merger.buffers[la.name].copy_(a[box_slices(la.boxes[rank])])  # what the sync writes
                merger.buffers[lb.name].copy_(b[box_slices(lb.boxes[rank])])
                if full:  # a full round writes the unmerged base into the served tensor
                    served[l.name].copy_(base[l.name][box_slices(l.boxes[rank])])
            merger.after_round(full=full)
            for l in (COLUMN, ROW):
                a, b = adapters[l.name]
                whole = base[l.name] + (b @ a) * SCALING  # peft's merge
                torch.testing.assert_close(served[l.name], whole[box_slices(l.boxes[rank])], rtol=0, atol=1e-6)

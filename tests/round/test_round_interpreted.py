"""The round's GPU path, kernel for kernel, run by Triton's interpreter on the CPU: with ``TRITON_INTERPRET=1`` every
``auto`` backend picks its Triton kernel as on CUDA (attention, norms, rotary, K/V writes and commit, the DDTree
build, the tree mask and acceptance walk, the round's tail, the embedding and rotary-table lookups), so decoding
the zoo dense pair in fp32 this way must give the target's own greedy tokens: one prompt with plain decoding and
DDTree, a left-padded batch of two with DDTree. The test also checks that the kernels it is about ran."""

from __future__ import annotations

import pytest
from kernel_harness import run_lines_interpreted

CODE = '''
import json
from unittest import mock
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import specdec
from specdec.kernels.kv_commit import triton as kv_commit
from specdec.kernels.round_tail import triton as round_tail
from specdec.kernels.row_gather import triton as row_gather
from specdec.kernels.rms_norm import triton as rms_norm
from specdec.kernels.tree_attention import triton as attention
from specdec.loading import asset_path, zoo_dir

zoo = zoo_dir()
model = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(zoo / "tokenizer")
drafter = specdec.DFlashDrafter.from_pretrained(asset_path("drafters") / "zoo-dense", target=model)
rows = [json.loads(line)["prompt"] for line in (zoo / "prompts_dev.jsonl").read_text().splitlines()[:2]]
spies = {name: mock.patch.object(module, name, side_effect=getattr(module, name)) for module, name in (
    (kv_commit, "kv_commit_triton"), (round_tail, "round_tail_triton"), (rms_norm, "rms_norm_triton"),
    (attention, "tree_attention_triton"), (row_gather, "row_gather_triton"))}
calls = {name: spy.start() for name, spy in spies.items()}
ids = tok(rows[0], return_tensors="pt").input_ids[:, -96:]
want = model.generate(ids, do_sample=False, max_new_tokens=8)
for tree in (None, specdec.DDTree(budget=15, topk=4)):
    got = specdec.generate(model, ids, drafter=None if tree is None else drafter, tree=tree, max_new_tokens=8)
    assert torch.equal(got.sequences, want), (tree, got.sequences[0, -8:], want[0, -8:])
tok.padding_side = "left"
batch = tok([r[-200:] for r in rows], return_tensors="pt", padding=True)
want = model.generate(**batch, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id)
got = specdec.generate(model, **batch, drafter=drafter, tree=specdec.DDTree(budget=15, topk=4), max_new_tokens=6,
                       pad_token_id=tok.pad_token_id)
assert torch.equal(got.sequences, want), (got.sequences[:, -6:], want[:, -6:])
assert all(spy.call_count for spy in calls.values()), {name: spy.call_count for name, spy in calls.items()}
'''


@pytest.mark.interpreter
def test_the_gpu_path_through_the_interpreter_equals_hf_greedy():
    run_lines_interpreted(CODE)

"""``row_gather``: rows of a table picked by an index (``table[index]``), and the routing of plain embedding
lookups through it. The reference against Python indexing row by row; the Triton launch (interpreter on CPU,
compiled on GPU, ``torch.empty`` poisoned) against the reference bit for bit over fp32 / bf16 / fp16 tables of one to
three dims (an embedding, the rotary tables ``[positions, 2, D]``, a vector), rows wider than one block, an int32
index, a table whose rows are contiguous but strided apart, an empty index; an index outside the table gives rows of
zeros. Which modules are plain lookups, the scope that routes them (and restores them), and the ``Backends`` field.
The round's use end to end (the target's embedding, the DFlash block's and the rotary tables, token for token
against HF) is ``tests/round/test_round_interpreted.py``.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch
from kernel_harness import capture_without_host_reads, interpreted_outputs, poison_empty

import specdec.kernels.row_gather as gather
from specdec.kernels.row_gather import (
    embed,
    embedding_forward,
    embedding_modules,
    fits_triton,
    plain_table,
    row_gather,
    row_gather_reference,
)


def cases() -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for shape, index_shape, dtype in [
        ((8192, 384), (1, 16), torch.bfloat16),  # the zoo target's embedding, a 16-node tree
        ((300, 2, 64), (2, 5), torch.float32),  # rotary tables by position
        ((50,), (7,), torch.float32),
        ((10, 3000), (4,), torch.float16),  # rows wider than one block
        ((64, 24), (3, 2, 4), torch.bfloat16),
    ]:
        table = torch.randn(shape, generator=gen).to(dtype)
        out.append({"table": table, "index": torch.randint(shape[0], index_shape, generator=gen)})
    out.append({"table": out[0]["table"], "index": out[0]["index"].int()})  # an int32 index
    wide = torch.randn(40, 48, generator=gen)
    out.append({"table": wide[:, :24], "index": torch.randint(40, (9,), generator=gen)})  # rows 48 apart
    out.append({"table": out[1]["table"], "index": torch.zeros(0, 3, dtype=torch.long)})
    return out


def brute(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    rows = [table[i] for i in index.reshape(-1).tolist()]
    flat = torch.stack(rows) if rows else table[:0]
    return flat.reshape(*index.shape, *table.shape[1:])


def check(case: dict, got: torch.Tensor) -> None:
    want = brute(case["table"], case["index"])
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)


def test_reference_is_python_indexing():
    for case in cases():
        check(case, row_gather_reference(case["table"], case["index"]))


def test_auto_is_the_reference_on_cpu_and_triton_is_refused():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("checks the CPU dispatch without the interpreter")
    case = cases()[0]
    check(case, row_gather(case["table"], case["index"]))
    with pytest.raises(ValueError, match="GPU"):
        row_gather(case["table"], case["index"], impl="triton")


def test_calls_the_kernel_cannot_take_are_refused_or_take_the_reference():
    table = torch.randn(6, 4)
    assert fits_triton(table, torch.tensor([1, 2]))
    assert not fits_triton(table, torch.tensor([1.0, 2.0]))  # a float index
    assert not fits_triton(table.t(), torch.tensor([1, 2]))  # rows not contiguous
    assert not fits_triton(table.requires_grad_(), torch.tensor([1]))
    with pytest.raises(ValueError, match="impl='triton' takes a table with contiguous rows"):
        row_gather(torch.randn(6, 4).t(), torch.tensor([1]), impl="triton")
    grad = torch.randn(6, 4, requires_grad=True)
    row_gather(grad, torch.tensor([1, 1])).sum().backward()  # CPU auto: the reference, with its gradient
    assert grad.grad[1].eq(2).all()


def test_backends_field_reaches_the_dispatch():
    from specdec.backends import Backends, use

    with use(Backends(row_gather="torch")):
        assert gather.IMPL == "torch" and not gather.gather_kernel_for("cpu")
    with use(Backends(row_gather="triton")):
        assert gather.gather_kernel_for("cpu")
    with pytest.raises(ValueError, match="row_gather"):
        Backends(row_gather="cuda")


def test_plain_tables_only():
    plain = torch.nn.Embedding(5, 3)
    assert plain_table(plain) is plain.weight
    assert plain_table(torch.nn.Embedding(5, 3, max_norm=1.0)) is None
    scaled = torch.nn.Embedding(5, 3)
    scaled.forward = lambda ids: torch.nn.Embedding.forward(scaled, ids) * 2
    assert plain_table(scaled) is None
    routed = torch.nn.Embedding(5, 3)
    routed.forward = types.MethodType(embedding_forward, routed)  # the scope's own routing stays a plain lookup
    assert plain_table(routed) is routed.weight
    handle = plain.register_forward_hook(lambda m, args, out: out * 2)
    try:
        assert plain_table(plain) is None
        ids = torch.tensor([[1, 4]])
        assert torch.equal(embed(plain, ids), plain.weight[ids] * 2)  # the hook runs: its own forward
    finally:
        handle.remove()

    class Sub(torch.nn.Embedding):
        pass

    assert plain_table(Sub(5, 3)) is None


def test_a_scope_routes_the_embedding_and_restores_it():
    from models import tiny_model

    from specdec.attention import AttentionScope

    model = tiny_model("qwen3")
    modules = embedding_modules(model, None)
    assert modules == [model.get_input_embeddings()]
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    pairs = [(m, types.MethodType(embedding_forward, m)) for m in modules]
    with torch.no_grad():
        want = model(ids).logits
        with AttentionScope(model, grouped=False, forwards=pairs):
            assert all("forward" in m.__dict__ for m in modules)
            got = model(ids).logits
    assert not any("forward" in m.__dict__ for m in modules)
    assert torch.equal(got, want)


# --- Triton through the interpreter ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("row_gather"), {"cases": cases()})


@pytest.mark.interpreter
def test_interpreted_equals_the_reference_bit_for_bit(interpreted):
    for case, got in zip(interpreted["cases"], interpreted["outputs"], strict=True):
        check(case, got)
    table, got = interpreted["outside"]
    assert torch.equal(got[0], table[2]) and got[1:].eq(0).all()
    assert interpreted["embed_calls"] == 1  # a plain module's lookup launched the kernel


def _run_interpreted(folder: Path) -> None:
    import specdec.kernels.row_gather.triton as kernel

    data = torch.load(folder / "cases.pt")
    poison_empty()
    out = {"outputs": [row_gather(c["table"], c["index"], impl="triton") for c in data["cases"]]}
    table = torch.randn(5, 7)
    out["outside"] = (table, row_gather(table, torch.tensor([2, 5, -1]), impl="triton"))
    calls, launch = [], kernel.row_gather_triton
    kernel.row_gather_triton = lambda *a: (calls.append(1), launch(*a))[1]
    with torch.no_grad():  # (a weight with autograd history to keep takes the reference)
        embed(torch.nn.Embedding(6, 4), torch.tensor([[0, 5]]))  # auto: Triton in the interpreter
    out["embed_calls"] = len(calls)
    torch.save(out, folder / "outputs.pt")


@pytest.mark.gpu
def test_compiled_equals_the_reference_on_cuda_and_replays():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for case in cases():
        table, index = case["table"].cuda(), case["index"].cuda()
        check(case, row_gather(table, index, impl="triton"))
        check(case, row_gather(table, index))  # auto: Triton on CUDA
    case = cases()[0]
    table, index = case["table"].cuda(), case["index"].cuda()
    graph, out = capture_without_host_reads(lambda: row_gather(table, index))
    fresh = torch.randint(table.shape[0], index.shape, generator=torch.Generator().manual_seed(9))
    index.copy_(fresh)
    graph.replay()
    check({"table": case["table"], "index": fresh}, out)


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))

"""``trees.build.topk_last``: ``torch.topk`` over the last dim on the CPU, the DDTree builder's top-k kernel under
Triton's interpreter (and on CUDA: ``tests/gpu/test_topk_last_cuda.py``), both against ``torch.topk`` and, where
values tie, against the (value desc, id asc) order worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from kernel_harness import interpreted_outputs

from specdec.trees.build import topk_last
from specdec.verify.draws import exponential_keys


def _cases() -> dict:
    gen = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(2, 5, 300, generator=gen) * 3, -1)
    probs[..., ::4] = 0.0  # outside the support: keys -0.0, drawn after every token inside it
    u = torch.rand(2, 5, 300, generator=gen).clamp(min=1e-30)
    tied = torch.zeros(3, 40)
    tied[:, 3::5] = 1.0
    wide = torch.randn(2, 17000, generator=gen)  # past the rows held in registers: the kernel that scans the row
    wide[0, 5:9] = -7.0  # a tie for the smallest
    return {"logq": torch.log_softmax(torch.randn(3, 6, 500, generator=gen), -1), "keys": exponential_keys(probs, u),
            "tied": tied, "wide": wide}  # fmt: skip


def _outputs(cases: dict) -> dict:
    return {"largest": topk_last(cases["logq"], 7), "smallest": topk_last(cases["keys"], 9, largest=False),
            "tied": topk_last(cases["tied"], 4), "tied_small": topk_last(cases["tied"], 4, largest=False),
            "wide": topk_last(cases["wide"], 3), "wide_small": topk_last(cases["wide"], 6, largest=False)}  # fmt: skip


def _check(cases: dict, out: dict) -> None:
    want = cases["logq"].topk(7, dim=-1)
    assert torch.equal(out["largest"][0], want.values) and torch.equal(out["largest"][1], want.indices)
    want = cases["keys"].topk(9, dim=-1, largest=False)
    assert torch.equal(out["smallest"][1], want.indices) and torch.equal(out["smallest"][0], want.values)
    assert out["smallest"][1].shape == (2, 5, 9) and out["smallest"][1].dtype == torch.long
    want = cases["wide"].topk(3, dim=-1)
    assert torch.equal(out["wide"][0], want.values) and torch.equal(out["wide"][1], want.indices)
    want = cases["wide"].topk(6, dim=-1, largest=False)
    assert torch.equal(out["wide_small"][0], want.values)
    assert sorted(out["wide_small"][1][0, :4].tolist()) == [5, 6, 7, 8]  # the tie (its order: below)
    assert torch.equal(out["wide_small"][1][0, 4:], want.indices[0, 4:])
    assert torch.equal(out["wide_small"][1][1], want.indices[1])


def test_cpu_is_torch_topk():
    cases = _cases()
    _check(cases, _outputs(cases))


@pytest.mark.interpreter
def test_interpreted_kernel_equals_torch_topk(tmp_path):
    pytest.importorskip("triton")
    data = interpreted_outputs(__file__, tmp_path, {"cases": _cases()})
    assert data["ran_kernel"]
    _check(data["cases"], data["outputs"])
    # ties by the smaller id, largest or smallest first
    assert data["outputs"]["tied"][1].tolist() == [[3, 8, 13, 18]] * 3
    assert data["outputs"]["tied_small"][1].tolist() == [[0, 1, 2, 4]] * 3
    assert data["outputs"]["wide_small"][1][0, :4].tolist() == [5, 6, 7, 8]


def _run_interpreted(folder: Path) -> None:
    from unittest import mock

    from specdec.kernels.ddtree_build import triton as kernels

    data = torch.load(folder / "cases.pt")
    with mock.patch.object(kernels, "topk_rows_triton", side_effect=kernels.topk_rows_triton) as spy:
        outputs = _outputs(data["cases"])
    torch.save({"outputs": outputs, "ran_kernel": spy.call_count == 6}, folder / "outputs.pt")


if __name__ == "__main__":
    _run_interpreted(Path(sys.argv[1]))

"""``runtime.copy_to_host``: the copy is enqueued where it is called, and waiting for it does not wait for work
enqueued after it (the decode loop reads the first token while the first round runs)."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime import copy_to_host


def test_the_copy_holds_the_values_at_the_call_on_cpu():
    values = torch.tensor([3, 1, 4])
    wait = copy_to_host(values)
    values.fill_(0)  # changed after the copy was taken
    assert wait().tolist() == [3, 1, 4]


@pytest.mark.gpu
def test_waiting_for_the_copy_does_not_wait_for_later_work_on_cuda():
    values = torch.tensor([3, 1, 4], device="cuda")
    torch.cuda.synchronize()
    wait = copy_to_host(values)
    values.fill_(0)  # enqueued after the copy: the copy still holds the earlier values
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU cycles enqueued after the copy
    later = torch.cuda.Event()
    later.record()
    assert wait().tolist() == [3, 1, 4]
    assert not later.query()  # the wait returned while the later work was still running
    torch.cuda.synchronize()

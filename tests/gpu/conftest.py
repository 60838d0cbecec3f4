import pytest
import torch


@pytest.fixture(scope="session")
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device: run `python -m pytest -m gpu tests/gpu` on a GPU machine")
    return torch.device("cuda")

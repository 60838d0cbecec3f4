import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # tiny models: threads only add contention

REPO = Path(__file__).resolve().parents[1]


def zoo_path() -> Path:
    return Path(os.environ.get("SPECDEC_ZOO", REPO.parent / "shared" / "zoo")).resolve()


@pytest.fixture(scope="session")
def zoo() -> Path:
    path = zoo_path()
    # The tokenizer is shared; a zoo copy may hold one target only (a test of the other fails naming its folder).
    if not (path / "tokenizer").is_dir() or not any((path / t).is_dir() for t in ("target-dense", "target-hybrid")):
        pytest.fail(f"zoo fixtures not found at {path}; set SPECDEC_ZOO to the zoo folder")
    return path

"""Drafter training against a frozen target: the DFlash objective (``docs/dflash.md``) and the EAGLE-3 training-time
test (``docs/eagle3.md``).

``train_dflash(TrainConfig(...))`` and ``train_eagle3(Eagle3TrainConfig(...))`` are the entry points;
``python -m specdec.train --help`` runs DFlash training standalone, ``python -m specdec train drafter=eagle3``
either from the app.
"""

from specdec.train.dflash import TrainConfig, train_dflash
from specdec.train.eagle3 import Eagle3TrainConfig, train_eagle3

__all__ = ["Eagle3TrainConfig", "TrainConfig", "train_dflash", "train_eagle3"]

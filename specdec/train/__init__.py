"""Drafter training against a frozen target: the DFlash objective (``docs/dflash.md``), the EAGLE-3 training-time
test (``docs/eagle3.md``) and the MTP head's unrolled objective (``docs/mtp.md``).

``train_dflash(TrainConfig(...))``, ``train_eagle3(Eagle3TrainConfig(...))`` and ``train_mtp(MTPTrainConfig(...))``
are the entry points; ``python -m specdec.train --help`` runs DFlash training standalone, ``python -m specdec train
drafter=eagle3`` (or ``drafter=mtp``) any of them from the app.
"""

from specdec.train.dflash import TrainConfig, train_dflash
from specdec.train.eagle3 import Eagle3TrainConfig, train_eagle3
from specdec.train.mtp import MTPTrainConfig, train_mtp

__all__ = ["Eagle3TrainConfig", "MTPTrainConfig", "TrainConfig", "train_dflash", "train_eagle3", "train_mtp"]

"""Drafter training: the DFlash objective against a frozen target (``docs/dflash.md``).

``train_dflash(TrainConfig(...))`` is the entry point; ``python -m specdec.train --help`` runs it standalone.
"""

from specdec.train.dflash import TrainConfig, train_dflash

__all__ = ["TrainConfig", "train_dflash"]

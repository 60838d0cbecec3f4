"""Standalone DFlash training: ``python -m specdec.train --target T --corpus DIR --out-dir OUT [...]``.

Every ``TrainConfig`` field is a flag (``--max-steps 500``; tuples take several values; booleans have
``--no-...``; ``none`` unsets an optional field). Logs go to stderr; ``--quiet`` keeps only warnings.
``python -m specdec.train tokenize --tokenizer T --corpus SRC... --out tokens.pt`` tokenizes a corpus once
for ``--corpus-cache``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import types
import typing

from specdec.train.dflash import TrainConfig, train_dflash


def _flag_type(annotation) -> tuple[type, bool, bool]:
    """(element type, is a tuple, may be None) of a config annotation."""
    args = typing.get_args(annotation)
    optional = isinstance(annotation, types.UnionType) and type(None) in args
    if optional:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0], True, optional
    return annotation, False, optional


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec.train", description="Train a DFlash drafter.")
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind, many, _ = _flag_type(hints[f.name])
        name = "--" + f.name.replace("_", "-")
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        if kind is bool:
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(name, type=kind, nargs="+" if many else None, required=required, default=default)
    return parser


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tokenize"]:
        from specdec.train.data import main as tokenize_main

        return tokenize_main(argv[1:])
    args = vars(build_parser().parse_args(argv))
    logging.basicConfig(
        level=logging.WARNING if args.pop("quiet") else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(message)s",
    )
    kwargs = {k: tuple(v) if isinstance(v, list) else (None if v == "none" else v) for k, v in args.items()}
    return train_dflash(TrainConfig(**kwargs))


if __name__ == "__main__":
    main()

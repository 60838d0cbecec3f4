"""Training corpora for drafters: text files, JSONL (``text`` field) or folders/globs of source files.

Documents are read in sorted path order, deduplicated by content, tokenized with the target's tokenizer,
joined with an end-of-text token after each, and packed into fixed-length rows.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from fnmatch import fnmatch
from pathlib import Path

import torch

__all__ = ["check_sources", "iter_documents", "load_eval_prompts", "main", "pack_tokens", "tokenize_documents"]

logger = logging.getLogger(__name__)

_GLOB_CHARS = set("*?[")


def _expand(source: str, suffixes: Sequence[str]) -> list[Path]:
    if _GLOB_CHARS & set(source):
        return sorted(Path(p) for p in glob.glob(source, recursive=True) if os.path.isfile(p))
    path = Path(source)
    if path.is_dir():
        found = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            found += [Path(root) / f for f in sorted(files) if f.endswith(tuple(suffixes))]
        return found
    if path.is_file():
        return [path]
    raise FileNotFoundError(f"corpus source {source!r} is not a file, a folder or a glob matching files.")


def check_sources(sources: Sequence[str]) -> None:
    """``FileNotFoundError`` naming the corpus sources that are neither a file, a folder nor a matching glob."""
    missing = [s for s in sources if not (glob.glob(s, recursive=True) if _GLOB_CHARS & set(s) else Path(s).exists())]
    if missing:
        raise FileNotFoundError(f"corpus sources not found: {missing} (give files, folders or globs that match).")


def _excluded(path: Path, exclude: Sequence[str]) -> bool:
    """True if a path component equals a pattern, or the whole path matches it as a glob."""
    parts = set(path.parts) | {path.stem}
    return any(pat in parts or fnmatch(str(path), pat) for pat in exclude)


def iter_documents(
    sources: Sequence[str], *, exclude: Sequence[str] = (), suffixes: Sequence[str] = (".py",)
) -> Iterator[str]:
    """Yield the documents of ``sources``, deduplicated by content.

    Args:
        sources: files (``.jsonl``: one document per line from its ``text`` field; anything else: the whole
            file), folders (walked for ``suffixes``) or globs (``**`` recurses).
        exclude: names of path components to skip (e.g. a package name such as ``"sympy"``) or globs.
        suffixes: file endings collected when walking folders. Default ``(".py",)``.
    """
    seen: set[bytes] = set()
    for source in sources:
        for path in _expand(source, suffixes):
            if _excluded(path, exclude):
                continue
            try:
                raw = path.read_text(encoding="utf-8", errors="ignore")
            except OSError as err:
                logger.warning("skipping %s: %s", path, err)
                continue
            texts = (
                (json.loads(line).get("text", "") for line in raw.splitlines() if line.strip())
                if path.suffix == ".jsonl"
                else (raw,)
            )
            for text in texts:
                digest = hashlib.blake2b(text.encode("utf-8", "ignore"), digest_size=16).digest()
                if text.strip() and digest not in seen:
                    seen.add(digest)
                    yield text


def tokenize_documents(
    documents: Iterator[str], tokenizer, *, eos_token_id: int, max_tokens: int | None = None, batch_docs: int = 256
) -> torch.Tensor:
    """Tokenize documents (no special tokens) and join them, each followed by ``eos_token_id``.

    Args:
        documents: texts.
        tokenizer: an HF (fast) tokenizer.
        eos_token_id (int): separator appended after each document.
        max_tokens (int | None): stop once this many tokens are collected (the tail is cut).
        batch_docs (int): documents per tokenizer call. Default 256.

    Returns:
        torch.Tensor: ``[T]`` int32 token stream.
    """
    chunks: list[torch.Tensor] = []
    total = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        for doc in ids:
            chunks.append(torch.tensor([*doc, eos_token_id], dtype=torch.int32))
            total += len(doc) + 1
        batch.clear()

    for doc in documents:
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
            if max_tokens is not None and total >= max_tokens:
                break
    if batch and (max_tokens is None or total < max_tokens):
        flush()
    if not chunks:
        raise ValueError("the corpus is empty: no document was found or all were excluded.")
    stream = torch.cat(chunks)
    return stream[:max_tokens] if max_tokens is not None else stream


def pack_tokens(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cut a token stream into ``[N, seq_len]`` rows (the remainder is dropped)."""
    rows = stream.numel() // seq_len
    if rows == 0:
        raise ValueError(f"the corpus has {stream.numel()} tokens, fewer than one sequence of {seq_len}.")
    return stream[: rows * seq_len].view(rows, seq_len)


def load_eval_prompts(path: str, *, limit: int | None = None) -> list[str]:
    """Prompts of a JSONL file (``prompt`` field, else ``text``), in file order."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                prompts.append(row.get("prompt", row.get("text", "")))
            if limit is not None and len(prompts) >= limit:
                break
    return prompts


def main(argv: list[str] | None = None) -> None:
    """``python -m specdec.train tokenize --tokenizer T --corpus SRC... --out tokens.pt``: tokenize once, reuse."""
    import argparse

    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(prog="python -m specdec.train tokenize", description="Tokenize a drafter corpus.")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--corpus", nargs="+", required=True)
    parser.add_argument("--corpus-exclude", nargs="*", default=[])
    parser.add_argument("--corpus-suffixes", nargs="*", default=[".py"])
    parser.add_argument("--max-corpus-tokens", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    tokenizer.model_max_length = 1 << 62
    docs = iter_documents(args.corpus, exclude=args.corpus_exclude, suffixes=args.corpus_suffixes)
    stream = tokenize_documents(docs, tokenizer, eos_token_id=tokenizer.eos_token_id, max_tokens=args.max_corpus_tokens)
    torch.save(stream, args.out)
    logger.info("%d tokens -> %s", stream.numel(), args.out)

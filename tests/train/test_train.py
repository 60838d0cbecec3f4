"""DFlash training: block visibility, label alignment, corpus handling, and a short run whose loss must fall."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest
import torch
from models import tiny_model
from transformers import PreTrainedTokenizerFast

from specdec.drafters.dflash import DFlashDrafter
from specdec.train import TrainConfig, train_dflash
from specdec.train.__main__ import build_parser
from specdec.train.data import iter_documents, pack_tokens, tokenize_documents
from specdec.train.dflash import block_hidden, dflash_loss, sample_anchors, target_features

SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]


def tiny_target(vocab: int = 128, seed: int = 0):
    return tiny_model(
        "qwen3", seed=seed, vocab_size=vocab, num_hidden_layers=4, max_position_embeddings=1024,
        eos_token_id=0, pad_token_id=1, tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip


def test_block_sees_only_context_before_its_anchor_and_its_own_block():
    target = tiny_target()
    drafter = DFlashDrafter.for_target(target, mask_token_id=2, num_layers=2, block_size=4, target_layer_ids=(1, 2))
    ids = torch.randint(3, 128, (1, 32), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids, drafter.target_layer_ids)
    anchors = torch.tensor([[5, 12, 20]])
    embed = target.get_input_embeddings()
    with torch.no_grad():
        base = block_hidden(drafter.model, embed, ids, feats, anchors)
        later = feats.clone()
        later[:, 12:] += 1.0  # context at/after anchor 12 must not reach block 1 (nor block 0)
        moved = block_hidden(drafter.model, embed, ids, later, anchors)
        earlier = feats.clone()
        earlier[:, 11] += 1.0  # the last context row before anchor 12 must reach block 1
        moved_early = block_hidden(drafter.model, embed, ids, earlier, anchors)
        other = ids.clone()
        other[0, 20] = (other[0, 20] + 1) % 128  # another block's root
        moved_root = block_hidden(drafter.model, embed, other, feats, anchors)
    torch.testing.assert_close(moved[:, :2], base[:, :2])
    assert not torch.allclose(moved[:, 2], base[:, 2])
    assert not torch.allclose(moved_early[:, 1], base[:, 1])
    torch.testing.assert_close(moved_root[:, :2], base[:, :2])


def test_loss_labels_are_tokens_at_anchor_plus_k():
    vocab, size = 16, 4
    ids = torch.arange(20)[None] % vocab
    anchors = torch.tensor([[2, 7, 11]])
    labels = ids[0, anchors[0, :, None] + torch.arange(size)]  # slot k -> token at anchor + k

    def oracle(shift):
        hidden = 30.0 * torch.nn.functional.one_hot((labels + shift) % vocab, vocab).float()[None]
        return hidden  # [1, n, B, V]; identity LM head below

    head = torch.nn.Identity()
    loss, metrics = dflash_loss(oracle(0), head, ids, anchors, gamma=7.0)
    assert loss.item() < 1e-6 and metrics["accept"] == size - 1 and metrics["acc1"] == 1.0
    loss_shift, metrics_shift = dflash_loss(oracle(1), head, ids, anchors, gamma=7.0)
    assert loss_shift.item() > 10 and metrics_shift["accept"] == 0.0


def test_sample_anchors_leave_room_for_a_block():
    a = sample_anchors(64, 40, block_size=8, num_anchors=10, generator=torch.Generator().manual_seed(0), device="cpu")
    assert a.shape == (64, 10) and int(a.min()) >= 1 and int(a.max()) <= 32
    assert bool((a[:, 1:] > a[:, :-1]).all())


def test_corpus_reading_excludes_dedups_and_packs(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "sympy").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("x = 1\n")  # duplicate
    (tmp_path / "pkg" / "c.txt").write_text("not python")
    (tmp_path / "sympy" / "d.py").write_text("held out")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "world"}) + "\n")
    docs = list(iter_documents([str(tmp_path), str(tmp_path / "docs.jsonl")], exclude=["sympy"]))
    assert docs == ["x = 1\n", "hello", "world"]

    class Tok:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[len(t)] * 3 for t in texts]}

    stream = tokenize_documents(iter(docs), Tok(), eos_token_id=0)
    assert stream.tolist() == [6, 6, 6, 0, 5, 5, 5, 0, 5, 5, 5, 0]
    assert pack_tokens(stream, 5).shape == (2, 5)


def test_cli_flags_map_to_config():
    args = vars(
        build_parser().parse_args(
            [
                "--target",
                "t",
                "--corpus",
                "a",
                "b",
                "--out-dir",
                "o",
                "--target-layer-ids",
                "1",
                "3",
                "--no-progress",
                "--lr",
                "1e-3",
            ]
        )
    )
    args.pop("quiet")
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    assert cfg.corpus == ("a", "b") and cfg.target_layer_ids == (1, 3) and cfg.progress is False and cfg.lr == 1e-3


def _tokenizer(texts: list[str], folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[1], mask_token=SPECIALS[2]
    )
    fast.save_pretrained(folder)
    return fast


def small_run(tmp_path, **overrides) -> tuple[TrainConfig, object, object]:
    """A 20-step CPU run on a learnable toy corpus: (config, tokenizer, target)."""
    cycle = "def value ( self , index ) : return range ( index ) + self . cache [ index ] \n"
    texts = [cycle * 20 for _ in range(6)]  # slot k's label follows from the root: learnable in a few steps
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(texts):
        (corpus / f"f{i}.py").write_text(text)
    tok = _tokenizer(texts, tmp_path / "tok")
    target = tiny_target(vocab=len(tok))
    target.save_pretrained(tmp_path / "target")
    settings = dict(
        target=str(tmp_path / "target"),
        tokenizer=str(tmp_path / "tok"),
        corpus=(str(corpus),),
        out_dir=str(tmp_path / "out"),
        num_layers=1,
        target_layer_ids=(1, 2),
        block_size=4,
        seq_len=32,
        num_anchors=8,
        batch_size=4,
        lr=1e-2,
        warmup_ratio=0.1,
        max_steps=20,
        log_every=1,
        eval_every=0,
        eval_num_prompts=2,
        eval_prompt_tokens=16,
        eval_new_tokens=8,
        save_every=0,
        progress=False,
        device="cpu",
    )
    return TrainConfig(**{**settings, **overrides}), tok, target


def test_train_dflash_loss_falls(tmp_path):
    """A few steps on a tiny target must cut the loss well below its start (and write a loadable checkpoint)."""
    cfg, tok, target = small_run(tmp_path)
    summary = train_dflash(cfg)
    losses = [r["loss"] for r in summary["losses"]]
    assert summary["steps"] == 20 and len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0], losses
    drafter = DFlashDrafter.from_pretrained(tmp_path / "out", target=target, strict=True)
    assert drafter.config.target_layer_ids == (1, 2) and drafter.config.mask_token_id == tok.mask_token_id
    assert {"tau", "acc1"} <= set(summary["evals"][-1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out", "target", "tok"]  # no staging folder
    assert {"config.json", "model.safetensors", "train_log.jsonl", "train_summary.json"} <= {
        p.name for p in (tmp_path / "out").iterdir()
    }


def test_train_config_string_corpus_is_one_path():
    cfg = TrainConfig(target="t", out_dir="o", corpus="/data/src", corpus_suffixes=".py", corpus_exclude="sympy")
    assert cfg.corpus == ("/data/src",) and cfg.corpus_suffixes == (".py",) and cfg.corpus_exclude == ("sympy",)
    assert TrainConfig(target="t", out_dir="o", corpus=["a", "b"], target_layer_ids=[1, 3]).target_layer_ids == (1, 3)


@pytest.mark.parametrize("corpus", [(), "", None, []])
def test_train_config_missing_corpus(corpus):
    with pytest.raises(ValueError, match="corpus is required"):
        TrainConfig(target="t", out_dir="o", corpus=corpus)


def test_train_missing_corpus_source_fails_before_writing(tmp_path):
    cfg = TrainConfig(target="t", out_dir=str(tmp_path / "out"), corpus=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="corpus sources not found"):
        train_dflash(cfg)
    with pytest.raises(ValueError, match="corpus is required: corpus_cache"):
        train_dflash(TrainConfig(target="t", out_dir=str(tmp_path / "out"), corpus_cache=str(tmp_path / "c.pt")))
    assert list(tmp_path.iterdir()) == []


def test_failed_run_leaves_no_checkpoint_folder(tmp_path):
    cfg, _, _ = small_run(tmp_path, eval_prompts=str(tmp_path / "missing.jsonl"))  # fails after loading
    with pytest.raises(FileNotFoundError):
        train_dflash(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "target", "tok"]


def test_failed_run_keeps_its_last_checkpoint_aside(tmp_path, monkeypatch, caplog):
    cfg, _, target = small_run(tmp_path, save_every=5)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")  # an earlier run's file stays as it was
    calls = []

    def loss_then_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) > 7:
            raise RuntimeError("boom")
        return dflash_loss(*args, **kwargs)

    monkeypatch.setattr("specdec.train.dflash.dflash_loss", loss_then_fail)
    with pytest.raises(RuntimeError, match="boom"), caplog.at_level(logging.WARNING):
        train_dflash(cfg)
    assert (tmp_path / "out" / "config.json").read_text() == "{}"
    (kept,) = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert "the checkpoint of step 5 is kept in" in caplog.text and str(kept) in caplog.text
    assert DFlashDrafter.from_pretrained(kept, target=target, strict=True).config.block_size == 4


@pytest.mark.parametrize("steps", [0, -1, True])
def test_max_steps_below_one_is_refused_before_any_work(tmp_path, steps):
    with pytest.raises(ValueError, match=r"max_steps=.* int >= 1.*e\.g\. max_steps=\d+"):
        TrainConfig(target="t", out_dir=str(tmp_path / "out"), corpus=str(tmp_path), max_steps=steps)
    assert list(tmp_path.iterdir()) == []


def test_run_logs_where_it_saved(tmp_path, caplog):
    cfg, _, _ = small_run(tmp_path, max_steps=2)
    with caplog.at_level(logging.INFO, logger="specdec.train"):
        train_dflash(cfg)
    last = caplog.records[-1].getMessage()
    assert "saved" in last and last.endswith(str((tmp_path / "out").resolve()))


def test_progress_reaches_the_last_step_between_log_lines(tmp_path, capsys):
    cfg, _, _ = small_run(tmp_path, max_steps=5, log_every=10, progress=True)
    train_dflash(cfg)
    shown = capsys.readouterr().out  # not a terminal: the bar's final state only
    assert "5/5" in shown and "1/5" not in shown


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_files_get_the_umask_permissions(tmp_path, umask):
    cfg, _, _ = small_run(tmp_path, max_steps=2, save_every=1)
    old = os.umask(umask)
    try:
        train_dflash(cfg)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "train_log.jsonl", "train_summary.json"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)

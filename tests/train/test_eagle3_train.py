"""EAGLE-3 training: the unrolled objective against a chain-drafting reference, the draft vocabulary against a
brute-force count, and a short run whose head must accept more than an untrained one (output still HF's)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from test_train import _tokenizer, tiny_target

import specdec
from specdec.drafters.eagle3 import Eagle3Drafter
from specdec.train.data import iter_documents, pack_tokens, tokenize_documents
from specdec.train.eagle3 import (
    Eagle3TrainConfig,
    draft_vocabulary,
    eagle3_loss,
    target_states,
    train_eagle3,
    ttt_logits,
)


def _head(target, *, draft_vocab_size: int, seed: int = 0) -> Eagle3Drafter:
    """A head with weights large enough that every input moves its logits."""
    drafter = Eagle3Drafter.for_target(target, layer_ids=(1, 2, 3), draft_vocab_size=draft_vocab_size, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in drafter.model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return drafter


def reference_loss(drafter, target, ids, steps: int, decay: float) -> torch.Tensor:
    """The objective written as what it stands for: from every position t of every row, a greedy chain draft as
    the head runs it at inference (its key/value cache holding the rows of the true context before t, then one row
    per step, each step fed the head's own previous output and the next true token), scored step by step with the
    soft cross-entropy against the target's distribution over the draft vocabulary."""
    model, embed = drafter.model, target.get_input_embeddings()
    used = model.target_ids().tolist()
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in drafter.hidden_state_ids], -1)
    batch, seq = ids.shape
    sums = [torch.zeros(()) for _ in range(steps)]
    for b in range(batch):
        for t in range(seq - 1):
            past = None
            if t > 0:  # the committed rows 0..t-1: fused state of position j with the token at j + 1
                _, _, past = model(embed(ids[b : b + 1, 1 : t + 1]), model.fuse(feats[b : b + 1, :t]),
                                   torch.arange(t)[None])  # fmt: skip
            hidden = model.fuse(feats[b : b + 1, t : t + 1])
            for k in range(steps):
                if t + k + 1 > seq - 1:
                    break
                token = ids[b : b + 1, t + k + 1 : t + k + 2]
                logits, hidden, past = model(embed(token), hidden, torch.tensor([[t + k]]), past)
                row = out.logits[b, t + k + 1]
                if int(row.argmax()) not in used:
                    continue
                p = torch.softmax(row[used], -1)
                sums[k] = sums[k] - (p * torch.log_softmax(logits[0, 0], -1)).sum()
    total = torch.zeros(())
    for k in range(steps):
        total = total + decay**k * sums[k] / (batch * (seq - 1 - k))
    return total


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_loss_matches_a_chain_drafting_reference(steps):
    torch.set_num_threads(1)
    target = tiny_target()
    drafter = _head(target, draft_vocab_size=48)
    ids = torch.randint(3, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    d2t, t2d = draft_vocabulary(ids, 48, 128)
    drafter.model.d2t.copy_(d2t)
    drafter.model.t2d.copy_(t2d)
    feats, logits = target_states(target, ids, drafter.hidden_state_ids)
    step_logits = ttt_logits(drafter.model, target.get_input_embeddings(), ids, feats, steps)
    loss, _ = eagle3_loss(step_logits, logits, drafter.model.target_ids(), decay=0.8)
    in_draft = t2d[logits.argmax(-1)]
    assert in_draft.any() and not in_draft.all()  # both kinds of rows are exercised
    want = reference_loss(drafter, target, ids, steps, 0.8)
    assert abs(loss.item() - want.item()) < 1e-5, (loss.item(), want.item())
    loss.backward()  # gradients reach every weight of the head
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.model.parameters())


def test_draft_vocabulary_is_the_most_frequent_tokens():
    gen = torch.Generator().manual_seed(0)
    rows = (torch.rand(6, 50, generator=gen) ** 3 * 40).long()  # skewed, with ties and absent ids
    for size in (1, 7, 25, 60):
        d2t, t2d = draft_vocabulary(rows, size, 60)
        counts = Counter(rows.flatten().tolist())
        ranked = sorted(range(60), key=lambda i: (-counts.get(i, 0), i))
        want = sorted(ranked[:size])
        assert (torch.arange(size) + d2t).tolist() == want
        assert t2d.nonzero().flatten().tolist() == want
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocabulary(rows, 61, 60)


def _setup(tmp_path):
    cycle = "def value ( self , index ) : return range ( index ) + self . cache [ index ] \n"
    texts = [cycle * 20 for _ in range(6)] + [f"x{i} = {i} * ( y - {i} ) \n" * 40 for i in range(6)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(texts):
        (corpus / f"f{i}.py").write_text(text)
    tok = _tokenizer(texts, tmp_path / "tok")
    target = tiny_target(vocab=len(tok))
    target.save_pretrained(tmp_path / "target")
    return corpus, tok, target


@pytest.mark.slow  # 300 training steps: about a minute on two cores
def test_training_raises_acceptance_and_the_head_loads_back(tmp_path):
    torch.set_num_threads(1)
    corpus, tok, target = _setup(tmp_path)
    cfg = Eagle3TrainConfig(
        target=str(tmp_path / "target"), tokenizer=str(tmp_path / "tok"), corpus=str(corpus),
        out_dir=str(tmp_path / "out"), target_layer_ids=(1, 2, 3), intermediate_size=128, draft_vocab_size=64,
        prompt_tokens=12, seq_len=40, batch_size=8, lr=3e-3, warmup_ratio=0.05, max_steps=300, log_every=10,
        eval_every=0, eval_num_prompts=2, eval_new_tokens=8, save_every=0, save_dtype="float32", progress=False,
        device="cpu",
    )  # fmt: skip
    summary = train_eagle3(cfg)
    losses = [r["loss"] for r in summary["losses"]]
    # the soft targets' own entropy is a floor the loss cannot go below: it falls by a third, not to zero
    assert summary["steps"] == 300 and sum(losses[-3:]) / 3 < 0.75 * losses[0], losses
    out = tmp_path / "out"
    assert {"config.json", "model.safetensors", "train_log.jsonl", "train_summary.json", "TRAINING.md"} <= {
        p.name for p in out.iterdir()
    }
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["draft_vocab_size"] == 64
    head = Eagle3Drafter.from_pretrained(out, target=target)
    assert head.hidden_state_ids == (2, 3, 4)

    # the draft vocabulary: the 64 most frequent ids of the sequences the run trained on (brute force count)
    docs = iter_documents([str(corpus)])
    stream = tokenize_documents(docs, tok, eos_token_id=tok.eos_token_id)
    prompts = pack_tokens(stream, 12)
    held = prompts[-2:].long()
    counts: Counter = Counter()
    with torch.no_grad():
        for p in prompts[:-2]:
            seq = p.long().tolist()
            for _ in range(28):  # greedy, without a cache and without stopping at end-of-text
                seq.append(int(target(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            counts.update(seq)
    ranked = sorted(range(len(tok)), key=lambda i: (-counts.get(i, 0), i))
    assert head.model.target_ids().tolist() == sorted(ranked[:64])

    untrained = Eagle3Drafter.for_target(target, layer_ids=(1, 2, 3), intermediate_size=128, draft_vocab_size=64)
    untrained.model.d2t.copy_(head.model.d2t)
    untrained.model.t2d.copy_(head.model.t2d)
    tau = {}
    for name, drafter in (("trained", head), ("untrained", untrained)):
        lengths = []
        for ids in held:
            ids = ids[None]
            want = target.generate(ids, max_new_tokens=24, do_sample=False)
            got = specdec.generate(target, ids, drafter=drafter, tree=specdec.Chain(k=4), max_new_tokens=24,
                                   do_sample=False)  # fmt: skip
            assert torch.equal(got.sequences, want), name
            lengths += got.stats.accept_lengths
        tau[name] = sum(lengths) / len(lengths)
    assert tau["trained"] > tau["untrained"] + 0.5, tau


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="corpus is required"):
        Eagle3TrainConfig(target="t", out_dir="o")
    with pytest.raises(ValueError, match="seq_len=16 leaves no room"):
        Eagle3TrainConfig(target="t", out_dir="o", corpus="c", prompt_tokens=16, seq_len=16)
    with pytest.raises(ValueError, match="ttt_steps=0"):
        Eagle3TrainConfig(target="t", out_dir="o", corpus="c", ttt_steps=0)


# -- the command line ---------------------------------------------------------------------------------------
def _compose(overrides: list[str]) -> dict:
    """The resolved config ``python -m specdec train <overrides>`` runs on (keys checked as the app checks them)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf, open_dict

    from specdec import cli

    cli._register_resolvers()
    with initialize_config_module("specdec.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    plain = OmegaConf.to_container(cfg, resolve=True)
    cli.check_keys(plain, choices, "train")
    return plain


def test_cli_drafter_switch_maps_to_the_eagle3_config():
    from specdec import cli
    from specdec.train import TrainConfig

    plain = _compose(["drafter=eagle3", "corpus=src", "eagle3.draft_vocab_size=2048", "eagle3.seq_len=96",
                      "max_steps=7", "prompts.limit=3"])  # fmt: skip
    assert cli.train_kind(plain) == "eagle3"
    cfg = Eagle3TrainConfig(**cli.train_settings(plain))
    assert (cfg.draft_vocab_size, cfg.seq_len, cfg.max_steps, cfg.eval_num_prompts) == (2048, 96, 7, 3)
    assert cfg.out_dir == "drafters/dense-eagle3" and cfg.corpus == ("src",)
    assert cfg.target_layer_ids is None and cfg.intermediate_size is None  # not DFlash's taps and width
    assert (cfg.ttt_steps, cfg.step_decay, cfg.lr) == (7, 0.8, Eagle3TrainConfig.lr)
    plain = _compose(["corpus=src"])  # the default stays DFlash, with DFlash's settings
    assert cli.train_kind(plain) == "dflash"
    dflash = TrainConfig(**cli.train_settings(plain))
    assert dflash.target_layer_ids == (1, 3, 4, 6) and dflash.seq_len == 1024 and dflash.out_dir == "drafters/dense"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["drafter=ngram"], r"train trains drafter=dflash, drafter=eagle3 or drafter=mtp, not drafter=ngram"),
        (["drafter=eagle3", "block_size=4"], r"block_size is a setting of drafter=dflash.*drop it"),
        (["drafter=eagle3", "seq_len=64"], r"seq_len is a setting of drafter=dflash.*set eagle3\.seq_len"),
        (["drafter=eagle3", "out_dir=x"], r"set eagle3\.out_dir"),
        (["eagle3.ttt_steps=3"], r"eagle3\.ttt_steps applies to drafter=eagle3"),
        (["drafter=eagle3", "drafter.path=x"], r"drafter\.path='x' is a decoding setting.*init_from="),
        (["drafter=eagle3", "+eagle3.foo=1"], r"eagle3\.foo is not a setting of train"),
    ],
)
def test_cli_settings_of_the_other_drafter_are_errors(overrides, message):
    from specdec import cli

    with pytest.raises(ValueError, match=message):
        cli.train_settings(_compose([*overrides, "corpus=src"]))


def test_cli_trains_and_writes_a_loadable_head(zoo, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    repo = Path(__file__).resolve().parents[2]
    corpus = tmp_path / "corpus.py"
    corpus.write_text("def value(self, index):\n    return range(index) + self.cache[index]\n" * 100)
    out = tmp_path / "head"
    args = [
        "train", "drafter=eagle3", f"corpus={corpus}", f"eagle3.out_dir={out}", "max_steps=4",
        "eagle3.draft_vocab_size=256", "eagle3.intermediate_size=64", "eagle3.prompt_tokens=8", "eagle3.seq_len=24",
        "eagle3.num_sequences=8", "eagle3.batch_size=2", "prompts.limit=1", "eval_prompt_tokens=8",
        "eval_new_tokens=4", "eval_every=0", "save_dtype=float32", "log_every=1", "threads=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "SPECDEC_DEBUG")}
    run = subprocess.run([sys.executable, "-m", "specdec", *args], cwd=tmp_path, env={**env, "PYTHONPATH": str(repo)},
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "4/4" in run.stdout and any("saved the EAGLE-3 head" in ln for ln in run.stdout.splitlines())
    assert {"config.json", "model.safetensors", "train_log.jsonl", "train_summary.json", "TRAINING.md"} <= {
        p.name for p in out.iterdir()
    }
    log = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4] and sum("eval" in r for r in log) == 2
    target = AutoModelForCausalLM.from_pretrained(zoo / "target-dense", dtype=torch.float32)
    head = Eagle3Drafter.from_pretrained(out, target=target)
    assert head.config.draft_vocab_size == 256 and head.hidden_state_ids == (2, 4, 5)
    assert "EAGLE-3 head" in (out / "TRAINING.md").read_text()

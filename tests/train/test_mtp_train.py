"""MTP training: the unrolled objective against a chain-drafting loop written here, the initialisation from the
target's last layer, the command line, and the shipped head of the zoo hybrid target (loaded through a checkpoint
copy, output equal to HF's greedy)."""

from __future__ import annotations

import json

import pytest
import torch
from models import tiny_model
from state.hybrid_harness import tiny_hybrid

from specdec.drafters.mtp import MTPDrafter, read_mtp_tensors, with_mtp_head, write_mtp_head
from specdec.train.mtp import (
    MTPTrainConfig,
    init_from_last_layer,
    mtp_loss,
    mtp_step_logits,
    target_last_hidden,
)

TARGETS = {
    "qwen3_5": lambda: tiny_hybrid("qwen3_5"),
    "qwen3": lambda: tiny_model("qwen3", num_hidden_layers=3, scale=2.0),
}


def sharp_head(target, seed: int = 0) -> MTPDrafter:
    """A head whose every weight moves its logits (norm weights away from their identity too)."""
    drafter = MTPDrafter.random(target, seed=seed, std=0.2)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in drafter.model.parameters():
            if p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return drafter


def reference_loss(drafter, target, ids, steps: int, decay: float) -> torch.Tensor:
    """The objective written as what it stands for: from every position t of every row, a greedy chain draft as the
    head runs at inference (a cache holding the head's rows of the true context before t, one row per step after
    it, each step fed the head's own previous output and the next true token, at position t + k), each step's
    distribution scored with the soft cross-entropy against the target's distribution of the token it drafts."""
    from transformers import DynamicCache

    module, stack = drafter.model, target.model
    embed, head, rotary = target.get_input_embeddings(), target.get_output_embeddings(), stack.rotary_emb
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    batch, seq = ids.shape
    sums = [torch.zeros(()) for _ in range(steps)]

    def run(tokens, h, positions, cache):
        x = embed(tokens)
        n, past = positions.shape[1], cache.get_seq_length()
        allowed = torch.arange(past + n)[None] <= positions[0, :, None]  # the cache holds positions 0 .. past - 1
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
        # multimodal rotary modules (Qwen3.5's) take one position row per grid axis; text uses the same row thrice
        rope_positions = positions[None].expand(3, -1, -1) if hasattr(rotary, "mrope_section") else positions
        return module(x, h, rotary(x, rope_positions), mask, positions, cache)

    for b in range(batch):
        for t in range(seq - 1):
            cache = DynamicCache()
            if t > 0:  # committed rows 0..t-1: the target's hidden state at j with the token at j + 1
                run(ids[b : b + 1, 1 : t + 1], hidden[b : b + 1, :t], torch.arange(t)[None], cache)
            h = hidden[b : b + 1, t : t + 1]
            for k in range(steps):
                if t + k + 1 > seq - 1:
                    break
                h = run(ids[b : b + 1, t + k + 1 : t + k + 2], h, torch.tensor([[t + k]]), cache)
                p = torch.softmax(out.logits[b, t + k + 1], -1)
                sums[k] = sums[k] - (p * torch.log_softmax(head(h)[0, 0], -1)).sum()
    total = torch.zeros(())
    for k in range(steps):
        total = total + decay**k * sums[k] / (batch * (seq - 1 - k))
    return total


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("family", list(TARGETS))
def test_loss_matches_a_chain_drafting_reference(family, steps):
    torch.set_num_threads(1)
    target = TARGETS[family]().requires_grad_(False)  # frozen, as the trainer holds it
    drafter = sharp_head(target)
    ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(0))
    hidden, logits = target_last_hidden(target, ids)
    loss, metrics = mtp_loss(mtp_step_logits(drafter, ids, hidden, steps), logits, decay=0.8)
    want = reference_loss(drafter, target, ids, steps, 0.8)
    assert abs(loss.item() - want.item()) < 1e-5, (loss.item(), want.item())
    assert set(metrics) == {"acc0", f"acc{steps - 1}", "accept"}
    loss.backward()  # gradients reach every weight of the head
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.model.parameters())


def test_init_copies_the_targets_last_attention_layer():
    target = tiny_hybrid("qwen3_5")  # layers: gated delta net, attention, gated delta net
    drafter = MTPDrafter.random(target, seed=3)
    fc = drafter.model.fc.weight.clone()
    module = init_from_last_layer(drafter, target).model
    for (name, mine), theirs in zip(module.layers[0].state_dict().items(), target.model.layers[1].state_dict().values(),
                                    strict=True):  # fmt: skip
        assert torch.equal(mine, theirs), name
    assert torch.equal(module.norm.weight, target.model.norm.weight)
    assert torch.equal(module.fc.weight, fc)  # fc keeps its random start
    x = torch.randn(2, target.config.hidden_size)  # the input norms start as a plain RMS normalisation
    rms = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    for norm in (module.pre_fc_norm_embedding, module.pre_fc_norm_hidden):
        torch.testing.assert_close(norm(x), rms)


def test_head_files_round_trip_through_a_checkpoint_copy(tmp_path):
    target = tiny_hybrid("qwen3_5")
    target.save_pretrained(tmp_path / "ckpt", max_shard_size="200KB")
    assert (tmp_path / "ckpt" / "model.safetensors.index.json").is_file()
    drafter = sharp_head(target, seed=4)
    write_mtp_head(drafter, tmp_path / "head", dtype=torch.bfloat16)
    assert [p.name for p in (tmp_path / "head").iterdir()] == ["model-mtp.safetensors"]
    assert all(k.startswith("mtp.") for k in read_mtp_tensors(tmp_path / "head"))
    for path in (tmp_path / "ckpt", *(tmp_path / "ckpt").iterdir()):  # a read-only store (as the zoo is)
        path.chmod(0o555 if path.is_dir() else 0o444)
    folder = with_mtp_head(tmp_path / "ckpt", tmp_path / "head", tmp_path / "copy")
    assert all(p.stat().st_mode & 0o200 for p in (folder, *folder.iterdir()))  # the copy is writable
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["mtp.fc.weight"] == "model-mtp.safetensors"
    assert json.loads((folder / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    loaded = MTPDrafter.from_pretrained(folder, target=target)
    for name, value in drafter.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], value.to(torch.bfloat16).float()), name
    with pytest.raises(ValueError, match="holds no mtp"):
        with_mtp_head(tmp_path / "ckpt", tmp_path / "ckpt", tmp_path / "copy2")


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="corpus is required"):
        MTPTrainConfig(target="t", out_dir="o")
    with pytest.raises(ValueError, match="seq_len=16 leaves no room"):
        MTPTrainConfig(target="t", out_dir="o", corpus="c", prompt_tokens=16, seq_len=16)
    with pytest.raises(ValueError, match="mtp_steps=0"):
        MTPTrainConfig(target="t", out_dir="o", corpus="c", mtp_steps=0)
    with pytest.raises(ValueError, match="init='copy'"):
        MTPTrainConfig(target="t", out_dir="o", corpus="c", init="copy")


# -- the command line ---------------------------------------------------------------------------------------
def test_cli_drafter_switch_maps_to_the_mtp_config():
    from test_eagle3_train import _compose

    from specdec import cli

    plain = _compose(["drafter=mtp", "target=hybrid", "corpus=src", "mtp.mtp_steps=2", "mtp.seq_len=96",
                      "max_steps=7", "prompts.limit=3"])  # fmt: skip
    assert cli.train_kind(plain) == "mtp"
    cfg = MTPTrainConfig(**cli.train_settings(plain))
    assert (cfg.mtp_steps, cfg.seq_len, cfg.max_steps, cfg.eval_num_prompts) == (2, 96, 7, 3)
    assert cfg.out_dir == "drafters/hybrid-mtp" and cfg.corpus == ("src",) and cfg.target.endswith("target-hybrid")
    assert (cfg.init, cfg.step_decay, cfg.lr, cfg.eval_chain) == ("last_layer", 0.8, MTPTrainConfig.lr, 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["drafter=mtp", "block_size=4"], r"block_size is a setting of drafter=dflash.*drop it \(MTP heads"),
        (["drafter=mtp", "seq_len=64"], r"seq_len is a setting of drafter=dflash.*set mtp\.seq_len"),
        (["drafter=mtp", "target_layer_ids=[1]"], r"target_layer_ids is a setting of drafter=dflash.*drop it"),
        (["mtp.mtp_steps=2"], r"mtp\.mtp_steps applies to drafter=mtp"),
        (["drafter=eagle3", "mtp.lr=0.1"], r"mtp\.lr applies to drafter=mtp"),
        (["drafter=mtp", "drafter.path=x"], r"drafter\.path='x' is a decoding setting.*init_from="),
        (["drafter=mtp", "+mtp.foo=1"], r"mtp\.foo is not a setting of train"),
    ],
)
def test_cli_settings_of_other_drafters_are_errors(overrides, message):
    from test_eagle3_train import _compose

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
        "train", "drafter=mtp", "target=hybrid", f"corpus={corpus}", f"mtp.out_dir={out}", "max_steps=3",
        "mtp.mtp_steps=2", "mtp.prompt_tokens=8", "mtp.seq_len=20", "mtp.num_sequences=4", "mtp.batch_size=2",
        "prompts.limit=1", "eval_prompt_tokens=8", "eval_new_tokens=4", "eval_every=0", "save_dtype=float32",
        "log_every=1", "threads=1", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "SPECDEC_DEBUG")}
    run = subprocess.run([sys.executable, "-m", "specdec", *args], cwd=tmp_path, env={**env, "PYTHONPATH": str(repo)},
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert any("saved the MTP head" in ln for ln in (run.stdout + run.stderr).splitlines())
    assert {"model-mtp.safetensors", "train_log.jsonl", "train_summary.json", "TRAINING.md"} == {
        p.name for p in out.iterdir()
    }
    log = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3] and sum("eval" in r for r in log) == 2
    target = AutoModelForCausalLM.from_pretrained(zoo / "target-hybrid", dtype=torch.float32)
    folder = with_mtp_head(zoo / "target-hybrid", out, tmp_path / "with-head")
    head = MTPDrafter.from_pretrained(folder, target=target)
    assert torch.equal(head.model.fc.weight, read_mtp_tensors(out)["mtp.fc.weight"])
    assert "MTP head" in (out / "TRAINING.md").read_text()

"""RoundRobinPipeline on tiny Hugging Face models (Qwen3, Llama, Qwen3-MoE), full fine-tuning and LoRA:
gradients equal the unpipelined model's, and three host AdamW steps equal plain AdamW."""

import copy
import os

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime._testing import relative_error, tiny_hf_fields  # noqa: E402
from bubbleless_runtime.lora import apply_lora  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402
from bubbleless_runtime.pool import RoundRobinPipeline  # noqa: E402
from bubbleless_schedules.roundrobin_layout import PoolGroups  # noqa: E402

TINY = tiny_hf_fields(vocab_size=64, num_hidden_layers=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, router_aux_loss_coef=0.02)
MODELS = {
    "qwen3": ("qwen3", TINY),
    "llama": ("llama", {k: v for k, v in TINY.items() if k != "head_dim"}),
    "qwen3_moe": ("qwen3_moe", {**TINY, **MOE}),
}
CUT = PoolGroups((2, 2), 2, (1, 2, 1))  # 6 layers: embedding, 4 decoders, head; boundaries differ on purpose
M = 4


def _models(name: str, lora: bool):
    architecture, fields = MODELS[name]
    model = build_causal_lm(architecture, seed=0, **fields)
    if lora:
        model = apply_lora(model, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj"])
        with torch.no_grad():  # peft starts B at zero: move it so every adapter gets a gradient
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(hash(n) % 1000))
    return pipeline_model(model), pipeline_model(copy.deepcopy(model))


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (8, 12), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    return ids, labels


def _reference(ref, ids, labels):
    """Unpipelined: the sum over micro-batches of the same loss, through the same layers."""
    total = 0.0
    for x, y in zip(ids.chunk(M), labels.chunk(M), strict=True):
        for layer in ref.layers:
            x = layer(x)
        loss = ref.loss_fn(x, y)
        loss.backward()
        total += float(loss.detach())
    return total


def _trainable(piped):
    return [(n, p) for n, p in piped.model.named_parameters() if p.requires_grad]


def _assert_loss_and_grads_match(piped, ref, loss, ids, labels) -> None:
    """The pool's summed loss and every trainable gradient equal the unpipelined model's (``ref`` runs its
    backward here)."""
    want_loss = _reference(ref, ids, labels)
    assert abs(float(loss) - want_loss) <= 1e-5 * abs(want_loss)
    got, want = dict(_trainable(piped)), dict(_trainable(ref))
    assert got.keys() == want.keys() and got
    errors = {n: relative_error(got[n].grad, want[n].grad) for n in want if want[n].grad is not None}
    assert max(errors.values()) <= 1e-5, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", list(MODELS))
def test_rt_pool_hf_gradients_equal_unpipelined(name, lora):
    piped, ref = _models(name, lora)
    frozen = {n: p.detach().clone() for n, p in piped.model.named_parameters() if not p.requires_grad}
    ids, labels = _batch()
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 4, num_microbatches=M, loss_fn=piped.loss_fn,
                              partition=CUT, timeout=120)
    _assert_loss_and_grads_match(piped, ref, pipe.step(ids, labels), ids, labels)
    assert bool(frozen) == lora
    after = dict(piped.model.named_parameters())
    assert all(torch.equal(after[n], before) for n, before in frozen.items())  # their host copies untouched
    assert all(after[n].grad is None for n in frozen)  # and no gradient given to them


def plain_adamw(params) -> torch.optim.AdamW:
    """Plain torch AdamW with these tests' host optimizer settings (lr 3e-3, betas 0.9/0.95, decay 0.01 on matrices)."""
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=3e-3, betas=(0.9, 0.95))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_rt_pool_hf_three_host_adamw_steps_equal_plain_adamw(lora):
    piped, ref = _models("qwen3", lora)
    options = {"name": "adamw", "lr": 3e-3, "betas": (0.9, 0.95), "weight_decay": 0.01, "max_grad_norm": 1.0}
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 3, num_microbatches=M, loss_fn=piped.loss_fn,
                              partition=CUT, optimizer=options, timeout=120)
    params = [p for _, p in _trainable(ref)]
    plain = plain_adamw(params)
    for seed in (1, 2, 3):
        ids, labels = _batch(seed)
        pipe.step(ids, labels)
        plain.zero_grad()
        _reference(ref, ids, labels)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        plain.step()
    got, want = dict(_trainable(piped)), dict(_trainable(ref))
    errors = {n: relative_error(got[n].detach(), want[n].detach()) for n in want}
    assert max(errors.values()) <= 1e-5, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_rt_pool_hf_fused_head_loss_in_chunks_never_makes_full_logits(name):
    """The last group runs head and loss chunk by chunk (7 tokens, not a multiple of the sequence): the
    same loss and gradients, and the LM head never sees more than one chunk of tokens at once."""
    from bubbleless_runtime.loss_scaling import ScaledLoss
    from bubbleless_runtime.models.loss import CausalLMLoss

    piped, ref = _models(name, lora=False)
    base = piped.loss_fn
    chunked = CausalLMLoss(num_experts=base.num_experts, num_moe_layers=base.num_moe_layers,
                           aux_loss_coef=base.aux_loss_coef, chunk_tokens=7)
    loss_fn = ScaledLoss(chunked)
    loss_fn.factor = 0.25
    rows = []
    piped.layers[-1].lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].reshape(-1, 32).shape[0]))
    ids, labels = _batch()
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 4, num_microbatches=M, loss_fn=loss_fn,
                              partition=CUT, timeout=120)
    loss = pipe.step(ids, labels)
    total = 0.0
    for x, y in zip(ids.chunk(M), labels.chunk(M), strict=True):
        for layer in ref.layers:
            x = layer(x)
        part = ref.loss_fn(x, y) * 0.25
        part.backward()
        total += float(part.detach())
    assert abs(float(loss) - total) <= 1e-5 * abs(total)
    got, want = dict(_trainable(piped)), dict(_trainable(ref))
    errors = {n: relative_error(got[n].grad, want[n].grad) for n in want if want[n].grad is not None}
    assert max(errors.values()) <= 1e-5, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    # the device copies keep the caller's hook: every token went through the head, at most 7 at a time
    assert sum(rows) == ids.numel() and max(rows) <= 7


def test_rt_pool_hf_lora_base_weights_memory_mapped_from_the_checkpoint(tmp_path):
    """A LoRA run whose frozen base weights come memory-mapped from the model's own model.safetensors:
    the base weights in RAM are zeroed first, so only the file can give the unpipelined gradients."""
    from bubbleless_runtime.models import checkpoint_key_of

    pytest.importorskip("safetensors")
    architecture, fields = MODELS["qwen3"]
    build_causal_lm(architecture, seed=0, **fields).save_pretrained(tmp_path)  # HF's own key names
    piped, ref = _models("qwen3", lora=True)
    with torch.no_grad():
        for p in piped.model.parameters():
            if not p.requires_grad:
                p.zero_()
    layers = piped.layers
    pipe = RoundRobinPipeline(layers, devices=["cpu"] * 4, num_microbatches=M, loss_fn=piped.loss_fn, partition=CUT,
                              frozen_safetensors=tmp_path / "model.safetensors",
                              safetensors_key=checkpoint_key_of(piped.model, layers), timeout=120)
    assert all(float(hp.param.abs().sum()) > 0 for hp in pipe.store.params if not hp.trainable and hp.param.dim() > 1)
    ids, labels = _batch()
    pipe.step(ids, labels)
    _reference(ref, ids, labels)
    got, want = dict(_trainable(piped)), dict(_trainable(ref))
    assert max(relative_error(got[n].grad, want[n].grad) for n in want) <= 1e-5

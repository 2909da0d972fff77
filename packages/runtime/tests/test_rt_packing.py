"""Per-document attention through the pipeline: a packed batch (documents laid end to end, segments
carried with the activations through every stage) and a right-padded batch give Hugging Face's loss and
gradients, the HF model run unpipelined on the same batch with restarting position ids / attention_mask."""

import os

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime.data_batches import TokenBatches  # noqa: E402
from bubbleless_runtime.data_tokenize import IGNORE_INDEX, Sample  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, chunked_cross_entropy, pipeline_model  # noqa: E402
from bubbleless_runtime.models.layers import positions_of  # noqa: E402

VOCAB = 64
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
FIELDS = {"llama": TINY, "qwen3": {**TINY, "head_dim": 8}, "qwen3_moe": {
    **TINY, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "router_aux_loss_coef": 0.05}, "qwen2": TINY, "mistral": {**TINY, "head_dim": 8, "sliding_window": 16}}


def documents(count: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = int(torch.randint(3, 14, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        prompt = int(torch.randint(1, n - 1, (1,), generator=g))
        out.append(Sample(ids, [IGNORE_INDEX] * prompt + ids[prompt:], f"doc:{i}"))
    return out


def batch_of(packing: bool, rows: int = 8):
    from bubbleless_runtime.data_packing import pack

    docs = documents(40)
    grouped = pack(docs, 32) if packing else [[d] for d in docs]
    return TokenBatches(rows=grouped, batch_size=rows, seq_len=32, packing=packing, pad_id=0, seed=1).batch(0)


def hf_loss(model, inputs, labels, num_microbatches: int, *, packing: bool):
    """Hugging Face's model on each micro-batch: restarting position ids (packed; HF then masks each
    document off the others) or the padding attention_mask; summed per-micro-batch mean losses."""
    ids, segments = inputs
    total = 0.0
    for i, s, y in zip(ids.chunk(num_microbatches), segments.chunk(num_microbatches),
                       labels.chunk(num_microbatches), strict=True):
        kwargs = {"position_ids": positions_of(s)} if packing else {"attention_mask": s}
        # use_cache=False: with a cache, Hugging Face skips its packed-sequence masking
        coef = getattr(model.config, "router_aux_loss_coef", 0.0)
        out = model(input_ids=i, use_cache=False, output_router_logits=bool(coef) or None, **kwargs)
        total = total + chunked_cross_entropy(out.logits, y)
        if coef:  # MoE: Hugging Face's load-balancing loss (padding left out through attention_mask)
            total = total + coef * out.aux_loss
    return total


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "qwen3_moe", "qwen2", "mistral"])
@pytest.mark.parametrize("packing", [True, False])
def test_cut_layers_match_hugging_face(architecture, packing):
    inputs, labels = batch_of(packing)
    if packing:
        assert (inputs[1].max(dim=1).values > 1).all()  # several documents per row
    else:
        assert (inputs[1] == 0).any()  # padding
    fields = FIELDS[architecture]
    if packing and "router_aux_loss_coef" in fields:
        # given restarting position ids (no attention mask), Hugging Face's load balancing counts the
        # padding after the last document; ours leaves it out, so compare packed rows without it
        fields = {**fields, "router_aux_loss_coef": 0.0}
    model = build_causal_lm(architecture, seed=0, **fields)
    reference = hf_loss(model, inputs, labels, 2, packing=packing)
    reference.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    piped = pipeline_model(model)
    total = 0.0
    for i, s, y in zip(inputs[0].chunk(2), inputs[1].chunk(2), labels.chunk(2), strict=True):
        x = (i, s)
        for layer in piped.layers:
            x = layer(x)
        total = total + piped.loss_fn(x, y)
    total.backward()
    torch.testing.assert_close(total, reference, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if name in want:
            torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_documents_do_not_see_each_other():
    """A packed row's second document gets the logits it gets alone: nothing leaks across the boundary."""
    model = build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"]).eval()
    layers = pipeline_model(model).layers
    a, b = torch.randint(1, VOCAB, (1, 7)), torch.randint(1, VOCAB, (1, 5))
    segments = torch.tensor([[1] * 7 + [2] * 5])
    x = (torch.cat([a, b], dim=1), segments)
    for layer in layers:
        x = layer(x)
    alone = model(input_ids=b).logits
    torch.testing.assert_close(x[:, 7:], alone, rtol=1e-5, atol=1e-5)


def _rank(rank, schedule, packing, port, out):
    import torch.distributed as dist

    from bubbleless_runtime.pipeline import Pipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    try:
        inputs, labels = batch_of(packing)
        reference = build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"])
        want_loss = hf_loss(reference, inputs, labels, 4, packing=packing)
        want_loss.backward()
        want = {n: p.grad for n, p in reference.named_parameters()}
        model = build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"])
        piped = pipeline_model(model)
        pipe = Pipeline(piped.layers, schedule=schedule, num_microbatches=4, loss_fn=piped.loss_fn)
        loss = pipe.step(inputs, labels)
        mine = {id(p) for p in pipe.parameters()}
        errors = {n: float((p.grad - want[n]).abs().max() / want[n].abs().max().clamp(min=1e-12))
                  for n, p in model.named_parameters() if id(p) in mine}
        result = {"errors": errors, "loss": None if loss is None else float(loss), "want": float(want_loss)}
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "packing"), [("zbv", True), ("1f1b", False)])
def test_four_ranks_match_hugging_face(tmp_path, schedule, packing):
    import torch.multiprocessing as mp

    from bubbleless_runtime._testing import free_port

    # fork: test modules are imported by path (importlib mode), so spawn could not pickle the worker.
    mp.start_processes(_rank, args=(schedule, packing, free_port(), str(tmp_path)), nprocs=4, start_method="fork")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    losses = [r["loss"] for r in results if r["loss"] is not None]
    assert len(losses) == 1 and losses[0] == pytest.approx(results[0]["want"], rel=1e-5)
    errors = {name: e for r in results for name, e in r["errors"].items()}
    assert len(errors) == sum(1 for _ in build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"]).parameters())
    assert max(errors.values()) < 1e-4, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("packing", [True, False])
def test_round_robin_pool_matches_hugging_face(packing):
    """The device pool (4 CPU devices, asymmetric groups, fused head): segments ride with the activations
    through its host buffers too."""
    from bubbleless_runtime.pool import RoundRobinPipeline
    from bubbleless_schedules.roundrobin_layout import PoolGroups

    inputs, labels = batch_of(packing)
    reference = build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"])
    want_loss = hf_loss(reference, inputs, labels, 4, packing=packing)
    want_loss.backward()
    model = build_causal_lm("qwen3", seed=0, **FIELDS["qwen3"])
    piped = pipeline_model(model)
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 4, num_microbatches=4, loss_fn=piped.loss_fn,
                              partition=PoolGroups((3, 3), 2, (2, 2, 2)), timeout=120)
    loss = pipe.step(inputs, labels)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_moe_load_balancing_leaves_padding_out_as_hugging_face_does():
    from bubbleless_runtime.models.loss import _real_tokens

    (ids, segments), _labels = batch_of(False)
    model = build_causal_lm("qwen3_moe", seed=0, **FIELDS["qwen3_moe"])
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=segments, output_router_logits=True, use_cache=False).aux_loss
        unmasked = model(input_ids=ids, output_router_logits=True, use_cache=False).aux_loss
        piped = pipeline_model(model)
        x = (ids, segments)
        for layer in piped.layers:
            x = layer(x)
        _logits, stats, carried = x
        ours = piped.loss_fn.aux_loss(stats, tokens=_real_tokens(carried, ids))
    assert abs(float(masked - unmasked)) > 1e-5  # the padding matters for this batch
    torch.testing.assert_close(ours, masked, rtol=1e-6, atol=1e-7)

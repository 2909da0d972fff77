"""LoRA: only adapters train, and the saved adapter loads with PeftModel.from_pretrained (1 and 2 ranks)."""

import os

import pytest
import torch

pytest.importorskip("peft")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime._testing import free_port, tiny_hf_fields  # noqa: E402
from bubbleless_runtime.lora import apply_lora, save_lora_adapter  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402

TINY = tiny_hf_fields(vocab_size=128)


def forward(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def train_one_step(peft_model, layers, ids):
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    pipeline_model(peft_model).loss_fn(forward(layers, ids), ids).backward()
    optimizer.step()


def test_only_adapters_train_and_saved_adapter_reloads(tmp_path):
    from peft import PeftModel

    peft_model = apply_lora(build_causal_lm("qwen3", seed=0, **TINY), rank=4, alpha=8)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen_before = {n: p.clone() for n, p in peft_model.named_parameters() if not p.requires_grad}

    layers = pipeline_model(peft_model).layers
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    before = forward(layers, ids).detach()
    train_one_step(peft_model, layers, ids)
    after = forward(layers, ids).detach()
    assert not torch.allclose(before, after)
    for name, p in peft_model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[name]), name

    save_lora_adapter(peft_model, tmp_path)
    assert (tmp_path / "adapter_config.json").exists()
    reloaded = PeftModel.from_pretrained(build_causal_lm("qwen3", seed=0, **TINY), tmp_path).eval()
    torch.testing.assert_close(reloaded(input_ids=ids).logits, after)


def test_bad_lora_settings_raise():
    model = build_causal_lm("qwen3", seed=0, **TINY)
    with pytest.raises(ValueError, match="match no module"):
        apply_lora(model, target_modules=["nope_proj"])
    with pytest.raises(ValueError, match="positive"):
        apply_lora(model, rank=0)


def _two_rank_save(rank, path, port):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        peft_model = apply_lora(build_causal_lm("qwen3", seed=0, **TINY), rank=4)
        decoder = peft_model.get_base_model().model.layers[rank]
        owned = [p for p in decoder.parameters() if p.requires_grad]
        with torch.no_grad():  # each rank "trains" only its own layer's adapters, differently
            for p in owned:
                p.fill_(0.01 * (rank + 1))
        save_lora_adapter(peft_model, path, owned=owned)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_gather_their_adapters_into_one_save(tmp_path):
    import torch.multiprocessing as mp
    from peft import PeftModel

    port = free_port()
    # fork: test modules are imported by path (importlib mode), so spawn could not pickle the worker.
    mp.start_processes(_two_rank_save, args=(str(tmp_path), port), nprocs=2, start_method="fork")
    reloaded = PeftModel.from_pretrained(build_causal_lm("qwen3", seed=0, **TINY), tmp_path)
    for rank in range(2):
        layer = reloaded.get_base_model().model.layers[rank]
        values = torch.cat([p.flatten() for n, p in layer.named_parameters() if "lora_" in n])
        torch.testing.assert_close(values, torch.full_like(values, 0.01 * (rank + 1)))


def test_an_adapter_of_a_local_base_named_by_a_relative_path_records_it_absolute(tmp_path, monkeypatch):
    import json

    from bubbleless_runtime.generate import adapter_base

    base = tmp_path / "work" / "base-model"
    build_causal_lm("qwen3", seed=0, **TINY).save_pretrained(base)
    monkeypatch.chdir(tmp_path / "work")  # training ran here, with model.path: base-model
    peft_model = apply_lora(build_causal_lm("qwen3", seed=0, **TINY), rank=4, alpha=8)
    for config in peft_model.peft_config.values():
        config.base_model_name_or_path = "base-model"
    save_lora_adapter(peft_model, tmp_path / "adapter")
    recorded = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(base)
    monkeypatch.chdir(tmp_path)  # generate from elsewhere still finds it
    assert adapter_base(str(tmp_path / "adapter"), None) == str(base)
    # an adapter written before, with the relative path: the error says what to do
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "base-model"}))
    with pytest.raises(ValueError, match=r"names its base model by the relative path 'base-model'.*pass --base DIR"):
        adapter_base(str(tmp_path / "adapter"), None)

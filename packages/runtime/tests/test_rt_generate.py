"""``bubbleless generate``: a saved model or LoRA adapter continues a prompt, as ``model.generate`` does."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bubbleless_runtime.cli import main  # noqa: E402
from bubbleless_runtime.generate import GenerationSettings, generate_text, load_for_generation  # noqa: E402

WORDS = "the cat sat on a mat and the dog ran to the red ball while birds sang in green trees"
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant : {% endif %}"
)


def build_tokenizer():
    """A word-level tokenizer trained in memory on a few strings: no file from any hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator([WORDS, "user assistant :"], trainers.WordLevelTrainer(
        special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>",
                                        bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(directory, model, tokenizer) of a tiny Llama saved with save_pretrained, tokenizer beside it."""
    directory = tmp_path_factory.mktemp("model")
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, model, tokenizer


def reference(model, tokenizer, ids, **knobs):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             pad_token_id=tokenizer.pad_token_id, **knobs)
    return tokenizer.decode(out[0, ids.shape[-1]:], skip_special_tokens=True)


def test_greedy_output_is_model_generates(saved, capsys):
    directory, model, tokenizer = saved
    want = reference(model, tokenizer, tokenizer("the cat sat", return_tensors="pt")["input_ids"], do_sample=False)
    assert want.strip()  # the random model says something before any end-of-sequence
    assert main(["generate", "--model", str(directory), "--prompt", "the cat sat", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_chat_uses_the_template(saved, capsys):
    directory, model, tokenizer = saved
    ids = tokenizer("<s> user : the dog </s> <s> assistant :", return_tensors="pt")["input_ids"]
    want = reference(model, tokenizer, ids, do_sample=False)
    assert main(["generate", "--model", str(directory), "--prompt", "the dog", "--chat", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == want + "\n"
    plain = generate_text(model, tokenizer, "the dog", GenerationSettings(max_new_tokens=8))
    assert plain == reference(model, tokenizer, tokenizer("the dog", return_tensors="pt")["input_ids"],
                              do_sample=False)


def test_sampling_follows_the_seed(saved):
    directory, _, _ = saved
    model, tokenizer = load_for_generation(str(directory))

    def draw(seed, top_p=1.0, temperature=5.0):
        settings = GenerationSettings(max_new_tokens=12, sample=True, seed=seed, top_p=top_p, temperature=temperature)
        return generate_text(model, tokenizer, "the cat", settings)

    assert draw(1) == draw(1)
    assert len({draw(seed) for seed in range(4)}) > 1  # a flat distribution: seeds draw different words
    greedy = generate_text(model, tokenizer, "the cat", GenerationSettings(max_new_tokens=12))
    assert draw(3, top_p=1e-6) == greedy  # a nucleus of one token is the greedy choice


def test_a_lora_adapter_loads_on_its_base(saved, tmp_path, capsys):
    from peft import LoraConfig, PeftModel, get_peft_model

    directory, _, tokenizer = saved
    base = transformers.AutoModelForCausalLM.from_pretrained(directory)  # name_or_path: the base's directory
    torch.manual_seed(1)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))  # random B: the adapter changes the output
    adapter = tmp_path / "adapter"
    lora.save_pretrained(adapter)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(directory)
    ids = tokenizer("a red ball", return_tensors="pt")["input_ids"]
    loaded = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(directory), adapter).eval()
    want = reference(loaded, tokenizer, ids, do_sample=False)
    args = ["generate", "--model", str(adapter), "--prompt", "a red ball", "--max-new-tokens", "8"]
    assert main(args) == 0  # the base from the adapter config, the tokenizer from the base
    assert capsys.readouterr().out == want + "\n"
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    assert main(args) == 2
    assert "does not name its base model" in capsys.readouterr().err
    assert main([*args, "--base", str(directory)]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_bad_directories_say_what_is_missing(saved, tmp_path, capsys):
    directory, model, _ = saved

    def error(*args):
        assert main(["generate", "--prompt", "the", *args]) == 2
        return capsys.readouterr().err

    assert "does not exist" in error("--model", str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in error("--model", str(tmp_path / "empty"))
    model.save_pretrained(tmp_path / "no-tokenizer")
    message = error("--model", str(tmp_path / "no-tokenizer"))
    assert "no tokenizer in" in message and "--tokenizer DIR" in message
    assert "--base is for LoRA adapters" in error("--model", str(directory), "--base", str(directory))
    assert "add --sample" in error("--model", str(directory), "--temperature", "0.7")
    assert "--top-p must be in (0, 1]" in error("--model", str(directory), "--sample", "--top-p", "0")
    assert "--max-new-tokens must be at least 1" in error("--model", str(directory), "--max-new-tokens", "0")


def test_the_tokenizer_can_come_from_elsewhere(saved, tmp_path, capsys):
    directory, model, tokenizer = saved
    model.save_pretrained(tmp_path / "weights-only")
    args = ["generate", "--model", str(tmp_path / "weights-only"), "--tokenizer", str(directory), "--prompt", "the cat"]
    assert main([*args, "--max-new-tokens", "8"]) == 0
    ids = tokenizer("the cat", return_tensors="pt")["input_ids"]
    assert capsys.readouterr().out == reference(model, tokenizer, ids, do_sample=False) + "\n"


def test_chat_without_a_template_is_refused(saved, tmp_path, capsys):
    directory, model, tokenizer = saved
    plain = build_tokenizer()
    plain.chat_template = None
    plain.save_pretrained(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert not config.get("chat_template")
    assert main(["generate", "--model", str(directory), "--tokenizer", str(tmp_path / "tok"), "--prompt", "x",
                 "--chat"]) == 2
    assert "no chat template" in capsys.readouterr().err

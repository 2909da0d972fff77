"""A user's dataset: records read and checked (file and line in every error), tokenized with the loss
on completions / assistant turns only, cached, packed or padded, batched deterministically."""

import os
import re
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))  # _data_fixtures, beside this file

from _data_fixtures import chats, pairs, tiny_tokenizer, write_jsonl  # noqa: E402

from bubbleless_runtime.config import RunConfig, load_config  # noqa: E402
from bubbleless_runtime.data_batches import TokenBatches  # noqa: E402
from bubbleless_runtime.data_build import build_data  # noqa: E402
from bubbleless_runtime.data_files import read_records  # noqa: E402
from bubbleless_runtime.data_packing import fill, fit_length, pack  # noqa: E402
from bubbleless_runtime.data_tokenize import IGNORE_INDEX, Sample, tokenize_record  # noqa: E402


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"prompt": "a", "completion": "b"}', '{"prompt": "a"}'], r"data.jsonl:2: missing field 'completion'"),
        (['{"text": "a"}', "not json"], r"data.jsonl:2: not valid JSON"),
        (['{"messages": [{"role": "user", "content": "hi"}]}'], r"data.jsonl:1: the chat has no assistant turn"),
        (['{"messages": [{"role": "boss", "content": "hi"}]}'], r"data.jsonl:1: messages\[0\] has role 'boss'"),
        (['{"foo": 1}'], r"data.jsonl:1: cannot tell the record format"),
        (["", "  "], r"data.jsonl: the file holds no records"),
        (['{"text": 3}'], r"data.jsonl:1: field 'text' must be a string"),
    ],
)
def test_bad_records_name_file_and_line(tmp_path, lines, match):
    path = write_jsonl(tmp_path / "data.jsonl", lines)
    with pytest.raises(ValueError, match=match):
        read_records(path)


def test_formats_and_directories(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", pairs(3))
    write_jsonl(tmp_path / "b.jsonl", pairs(2))
    (tmp_path / "notes.md").write_text("ignored")
    found, records = read_records(tmp_path)
    assert found == "prompt_completion" and len(records) == 5
    assert records[3].source.endswith("b.jsonl:1")
    text = tmp_path / "t" / "corpus.txt"
    text.parent.mkdir()
    text.write_text("first paragraph\nstill first\n\nsecond one\n")
    found, records = read_records(text)
    assert found == "text" and [r.fields["text"] for r in records] == ["first paragraph\nstill first", "second one"]
    assert records[1].source.endswith("corpus.txt:4")
    with pytest.raises(ValueError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")


def test_labels_cover_completions_and_assistant_turns_only():
    tok = tiny_tokenizer()
    from bubbleless_runtime.data_files import Record

    pair = tokenize_record(Record(fields=pairs(2)[1], source="x:1"), "prompt_completion", tok)
    prompt = tok("Convert 1 km to metres: ")["input_ids"]
    assert pair.labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert pair.labels[len(prompt):] == pair.input_ids[len(prompt):] and pair.input_ids[-1] == tok.eos_token_id
    everything = tokenize_record(Record(fields=pairs(2)[1], source="x:1"), "prompt_completion", tok, train_on_prompt=True)
    assert everything.labels[1:] == everything.input_ids[1:] and everything.labels[0] == IGNORE_INDEX

    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 plus 3?"},
                         {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 4 plus 4?"},
                         {"role": "assistant", "content": "8"}]}
    sample = tokenize_record(Record(fields=chat, source="x:1"), "messages", tok)
    trained = tok.decode([t for t, label in zip(sample.input_ids, sample.labels, strict=True) if label != IGNORE_INDEX])
    assert trained == "5<|im_end|>\n8<|im_end|>\n"  # the turns the template adds for the assistant, nothing else
    assert sample.input_ids == tok.apply_chat_template(chat["messages"], tokenize=True, return_dict=True)["input_ids"]


def test_packing_and_truncation():
    samples = [Sample(list(range(1, n + 1)), [IGNORE_INDEX] + list(range(2, n + 1)), f"f:{n}") for n in (3, 4, 2, 6, 9)]
    fitted = fit_length(samples, 8, "truncate")
    assert (fitted.truncated, fitted.dropped) == (1, 0) and len(fitted.samples[-1].input_ids) == 8
    assert fit_length(samples, 8, "drop").dropped == 1
    rows = pack(fitted.samples, 8)
    assert [[len(s.input_ids) for s in row] for row in rows] == [[3, 4], [2, 6], [8]]
    ids, segments, labels = fill(rows, 8, pad_id=0)
    assert segments[0].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
    assert labels[0].tolist() == [IGNORE_INDEX, 2, 3, IGNORE_INDEX, 2, 3, 4, IGNORE_INDEX]
    assert ids[0, 7] == 0


def test_batches_are_a_pure_function_of_the_index():
    rows = [[Sample([i, i + 1], [IGNORE_INDEX, i + 1], "x")] for i in range(10)]
    data = TokenBatches(rows=rows, batch_size=4, seq_len=8, packing=False, pad_id=0, seed=3)
    assert data.batches_per_epoch == 2
    (ids, segments), labels = data.batch(5)
    again = TokenBatches(rows=rows, batch_size=4, seq_len=8, packing=False, pad_id=0, seed=3).batch(5)
    assert torch.equal(ids, again[0][0]) and ids.shape == (4, 8)  # padded up to a multiple of 16, capped at seq_len
    firsts = sorted(data.batch(0)[0][0][:, 0].tolist() + data.batch(1)[0][0][:, 0].tolist())
    assert len(set(firsts)) == 8  # an epoch visits rows without repeats
    with pytest.raises(ValueError, match="fewer than data.batch_size"):
        TokenBatches(rows=rows, batch_size=16, seq_len=8, packing=False, pad_id=0)


def _config(tmp_path, **data):
    config = RunConfig()
    config.model.path = str(tmp_path / "model")
    config.train.output_dir = str(tmp_path / "out")
    for key, value in data.items():
        setattr(config.data, key, value)
    return config


def test_build_data_caches_splits_and_reports(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    path = write_jsonl(tmp_path / "chat.jsonl", chats(40))
    config = _config(tmp_path, path=path, batch_size=4, seq_len=64, validation_fraction=0.25)
    first = build_data(config, tok)
    assert "cache written" in first.summary and first.validation.batches_per_epoch == 2
    assert len(first.train.rows) < 30  # 30 training chats packed several to a row
    import bubbleless_runtime.data_build as build

    monkeypatch.setattr(build, "tokenize_records", lambda *a, **k: pytest.fail("tokenized again"))
    second = build_data(config, tok)
    assert "cache reused" in second.summary
    assert torch.equal(first.train.batch(3)[0][0], second.train.batch(3)[0][0])
    write_jsonl(tmp_path / "chat.jsonl", chats(41))  # a changed file is never served stale tokens
    with pytest.raises(pytest.fail.Exception, match="tokenized again"):
        build_data(config, tok)


def test_data_config_errors(tmp_path):
    with pytest.raises(ValueError, match="data.path needs model.path"):
        load_config(text="data: {path: x.jsonl}")
    with pytest.raises(ValueError, match="data.truncation"):
        load_config(text="data: {truncation: cut}")
    with pytest.raises(ValueError, match="model.dtype"):
        load_config(text="model: {dtype: fp8}")
    with pytest.raises(ValueError, match="need data.path"):
        load_config(text="data: {validation_fraction: 0.1}")


def test_text_records_train_every_token_and_validation_path(tmp_path):
    tok = tiny_tokenizer()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"the quick brown fox number {i} jumps" for i in range(24)) + "\n")
    held = write_jsonl(tmp_path / "held.jsonl", [{"text": f"hello world {i}"} for i in range(8)])
    config = _config(tmp_path, path=str(corpus), batch_size=4, seq_len=32, packing=False, validation_path=held)
    split = build_data(config, tok)
    sample = split.train.rows[0][0]
    assert sample.labels[1:] == sample.input_ids[1:] and sample.input_ids[-1] == tok.eos_token_id
    assert split.validation.batches_per_epoch == 2 and "validation: 8 samples" in split.summary
    (ids, segments), labels = split.train.batch(0)
    assert ids.shape[1] % 16 == 0 and ids.shape[1] <= 32  # padded to a multiple of 16, at most seq_len
    assert set(segments.unique().tolist()) <= {0, 1} and labels.shape == ids.shape


def test_over_long_samples_are_counted_or_refused(tmp_path):
    tok = tiny_tokenizer()
    long = [{"prompt": "short ", "completion": " ".join(["fox"] * 40)}] + pairs(8)
    path = write_jsonl(tmp_path / "long.jsonl", long)
    split = build_data(_config(tmp_path, path=path, batch_size=2, seq_len=24, truncation="drop"), tok)
    assert "0 truncated, 1 dropped" in split.summary
    split = build_data(_config(tmp_path, path=path, batch_size=2, seq_len=24), tok)
    assert "1 truncated, 0 dropped (data.truncation: truncate), " in split.summary
    assert re.search(r"truncate\), (\d+) of [\d,]+ tokens cut", split.summary), split.summary
    assert "warning" not in split.summary


def test_a_text_file_without_blank_lines_is_one_sample_and_the_cut_is_said(tmp_path):
    tok = tiny_tokenizer()
    text = tmp_path / "book.txt"
    text.write_text("\n".join(f"line {i} of the book" for i in range(60)) + "\n")
    split = build_data(_config(tmp_path, path=text, batch_size=1, seq_len=24), tok)
    assert "1 truncated" in split.summary
    assert re.search(r"warning: more than half the tokens \([\d,]+ of [\d,]+\) are cut at data.seq_len 24: a .txt "
                     r"record is a paragraph", split.summary), split.summary


def test_a_byte_order_mark_is_skipped_and_another_encoding_is_refused_naming_file_and_line(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "bom.jsonl").write_bytes(bom + b'{"text": "caf\xc3\xa9"}\n{"text": "b"}\n')
    assert [r.fields["text"] for r in read_records(tmp_path / "bom.jsonl")[1]] == ["café", "b"]
    (tmp_path / "bom.json").write_bytes(bom + b'[{"text": "a"}]')
    assert read_records(tmp_path / "bom.json")[1][0].fields == {"text": "a"}
    (tmp_path / "bom.txt").write_bytes(bom + b"first\n\nsecond\n")
    assert [r.fields["text"] for r in read_records(tmp_path / "bom.txt")[1]] == ["first", "second"]
    (tmp_path / "sep.jsonl").write_text('{"text": "a\u2028b"}\n{"text": "c"}\n', encoding="utf-8")
    assert len(read_records(tmp_path / "sep.jsonl")[1]) == 2  # a JSON string may hold U+2028: one record
    for name in ("latin1.txt", "latin1.jsonl"):
        body = b"fine\n\ncaf\xe9\n" if name.endswith(".txt") else b'{"text": "a"}\n{"text": "caf\xe9"}\n'
        (tmp_path / name).write_bytes(body)
        with pytest.raises(ValueError, match=rf"{name}:[23]: not UTF-8 text \(byte 0xe9 at offset \d+\); save the "
                                             r"file as UTF-8"):
            read_records(tmp_path / name)

"""
Tests of data.py, readers/ and shapes/prepare.py: the negatives encodings, the <|image_1|> marker, the fill/cut
rule, the prepared table (converted once, by one writer, memory-mapped, its cache key), the sharded and resumable
sampler (through DataLoader worker processes), length-sorted batches and their targets, every bad-input case, and
the toy benchmark read by both readers. The real downloads' layouts are tests/test_downloads.py's.

    python -m pytest -q tests/test_data.py
"""

import itertools
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from common import UserError
from data import ShardedBatchSampler, collate_train, split_by_length
from readers.evaluation import find_eval_datasets, read_eval_dataset
from readers.mmeb import MMEB_DATASETS
from shapes import prepare as prepare_module
from tests.rows import read_rows, train_dataset

SHAPES_SIZES = dict(num_train=50, num_eval=10)  # the smallest prepare() allows


def skipped(reports):
    return sum(sum(r.bad.values()) for r in reports)


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    return prepare_module.prepare(str(tmp_path_factory.mktemp("shapes")), seed=0, **SHAPES_SIZES)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def save_image(path, size=(40, 30), colour=(200, 30, 30), mode="RGB"):
    Image.new("RGB", size, colour).convert(mode).save(path)
    return path.name


def record(i, **fields):
    """A valid text-only MMEB-train record with distinct texts."""
    return {"qry": f"query {i}", "qry_image_path": "", "pos_text": f"positive {i}", "pos_image_path": "",
            "neg_text": [f"negative {i}.{k}" for k in range(5)], "neg_image_path": "", **fields}


def texts(sides):
    return [s["text"] for s in sides]


# -----------------------------------------------------------------------------
# training rows

def test_negative_encodings(tmp_path):
    save_image(tmp_path / "n.png")
    records = [
        record(0, neg_text=["a", "b"], neg_image_path=["n.png", ""]),  # lists
        record(1, neg_text="['c', 'd']", neg_image_path="['n.png', '']"),  # Python list in a string (mmE5)
        record(2, neg_text='["e", "f"]', neg_image_path=None),  # JSON list in a string
        record(3, neg_text="g", neg_image_path=""),  # one string: one negative
        record(4, neg_text=[], neg_image_path=["n.png", "n.png"]),  # image-only negatives
    ]
    jsonl = write_jsonl(tmp_path / "train.jsonl", records)
    parquet = str(tmp_path / "train.parquet")  # the same rows as Parquet, negatives as strings
    as_strings = [dict(r, neg_text=json.dumps(r["neg_text"]) if isinstance(r["neg_text"], list) else r["neg_text"],
                       neg_image_path=str(r["neg_image_path"] or "")) for r in records]
    pq.write_table(pa.Table.from_pylist(as_strings), parquet)
    image = str(tmp_path / "n.png")
    for path in (jsonl, parquet):
        rows, _ = read_rows(tmp_path, path, str(tmp_path), num_hard_negatives=2, seed=0)
        assert [r["candidates"][1:] for r in (rows[0], rows[1], rows[2])] == [
            [{"text": "a", "image": image}, {"text": "b", "image": None}],
            [{"text": "c", "image": image}, {"text": "d", "image": None}],
            [{"text": "e", "image": None}, {"text": "f", "image": None}]]
        assert rows[3]["candidates"][1] == {"text": "g", "image": None}  # the second one is filled
        assert rows[4]["candidates"][1:] == [{"text": "positive 4", "image": image}] * 2  # mmE5: the positive's text
        assert rows[0]["query"] == {"text": "query 0", "image": None}


def test_fill_and_cut(tmp_path):
    counts = [0, 1, 2, 5, 8, 3, 0, 7, 4, 6] * 3
    records = [record(i, neg_text=[f"negative {i}.{k}" for k in range(n)]) for i, n in enumerate(counts)]
    for r in records[:10]:
        r["pos_text"] = "shared label"  # like a class label: must never come back as a negative
    main = write_jsonl(tmp_path / "main.jsonl", records)
    other = write_jsonl(tmp_path / "other.jsonl", [record(i, pos_text=f"other {i}") for i in range(5)])
    rows, reports = read_rows(tmp_path, [main, {"path": other, "max_rows": 3}], str(tmp_path), num_hard_negatives=5, seed=0)
    assert len(rows) == 30 + 3  # max_rows caps the second file
    assert reports[0].filled_and_cut(5) == (18, 9) and reports[0].negative_range() == (0, 3, 8)
    for i, n in enumerate(counts):
        candidates = texts(rows[i]["candidates"])
        own = [f"negative {i}.{k}" for k in range(n)]
        assert len(candidates) == 6 and len(set(candidates)) == 6
        assert candidates[1:1 + min(n, 5)] == own[:5]  # cut keeps the first five
        filled = candidates[1 + min(n, 5):]
        assert candidates[0] not in filled and (i >= 10 or "shared label" not in filled)
        assert not any(t.startswith("other") for t in filled)  # from the same subset only
        assert all(not t.startswith(f"negative {i}.") for t in filled)
    again, _ = read_rows(tmp_path, [main, {"path": other, "max_rows": 3}], str(tmp_path), num_hard_negatives=5, seed=0)
    reseeded, _ = read_rows(tmp_path, [main, {"path": other, "max_rows": 3}], str(tmp_path), num_hard_negatives=5, seed=1)
    assert [r["candidates"] for r in again] == [r["candidates"] for r in rows]  # deterministic
    assert [r["candidates"] for r in reseeded] != [r["candidates"] for r in rows]

    lonely = write_jsonl(tmp_path / "lonely.jsonl", [record(0, neg_text=[])])
    with pytest.raises(UserError, match="cannot fill"):
        read_rows(tmp_path, lonely, str(tmp_path), num_hard_negatives=2)
    with pytest.raises(UserError, match=r"train_data entry \('x', 3\): expected a path, or a dict"):
        read_rows(tmp_path, [("x", 3)], str(tmp_path))
    with pytest.raises(UserError, match=r"'weight': 0.5\}; 'wieght': did you mean 'weight'\?$"):  # a misspelt key
        read_rows(tmp_path, [{"path": main, "wieght": 3, "zzz": 1}], str(tmp_path))


def test_image_marker_never_reaches_the_tokens(tmp_path, preprocessor):
    save_image(tmp_path / "q.png", size=(64, 64))
    write_jsonl(tmp_path / "t.jsonl", [
        record(0, qry="<|image_1|>\nWhat colour is it?", qry_image_path="q.png",
               pos_text="<|image_1|> red", neg_text=["<|image_1|>\nRepresent the given image."],
               neg_image_path=["q.png"])])
    item = train_dataset(tmp_path, preprocessor, str(tmp_path / "t.jsonl"), str(tmp_path), 1)[0]
    decode = preprocessor.tokenizer.decode
    query, positive, negative = item["query"], *item["candidates"]
    for feature in (query, positive, negative):
        assert "image_1" not in decode(feature["input_ids"])
    image_pad = preprocessor.pad_ids["image"]
    assert (query["input_ids"] == image_pad).sum() > 0 and (negative["input_ids"] == image_pad).sum() > 0
    assert (positive["input_ids"] == image_pad).sum() == 0 and "pixel_values" not in positive  # marker dropped
    text = decode(query["input_ids"])
    assert text.index("<|vision_end|>") < text.index("What colour is it?")  # the image where the marker was


def test_images_become_rgb_within_the_pixel_budget(tmp_path, tiny_checkpoint):
    from model import Preprocessor
    max_pixels = 96 * 96
    preprocessor = Preprocessor.from_pretrained(tiny_checkpoint, max_pixels=max_pixels)
    for k, mode in enumerate(["RGBA", "L", "P", "CMYK"]):
        save_image(tmp_path / f"{k}.{'jpg' if mode == 'CMYK' else 'png'}", size=(300, 200), mode=mode)
    records = [record(k, qry_image_path=f"{k}.{'jpg' if k == 3 else 'png'}") for k in range(4)]
    dataset = train_dataset(tmp_path, preprocessor, write_jsonl(tmp_path / "t.jsonl", records), str(tmp_path), 1)
    for k in range(4):
        query = dataset[k]["query"]
        _, grid_h, grid_w = query["image_grid_thw"][0].tolist()  # in 16-pixel patches
        assert grid_h * grid_w * 16 * 16 <= max_pixels and grid_h % 2 == 0 and grid_w % 2 == 0
        assert grid_w > grid_h  # landscape stays landscape
        assert query["pixel_values"].shape == (grid_h * grid_w, 3 * 16 * 16)  # three channels, as bytes
        assert query["pixel_values"].dtype == torch.uint8


# -----------------------------------------------------------------------------
# the sampler

@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_sampler_gives_each_row_to_one_rank_per_epoch(world_size):
    num_rows, batch_size = 48, 8
    samplers = [ShardedBatchSampler(num_rows, batch_size, rank, world_size, seed=3) for rank in range(world_size)]
    single = iter(ShardedBatchSampler(num_rows, batch_size, seed=3))
    iterators = [iter(s) for s in samplers]
    epochs = []
    for epoch in range(2):
        seen = []
        for _ in range(num_rows // batch_size):
            shares = [next(it) for it in iterators]
            assert all(len(share) == batch_size // world_size for share in shares)
            assert sum(shares, []) == next(single)  # global batches do not depend on world_size
            seen += sum(shares, [])
        assert sorted(seen) == list(range(num_rows))
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # a fresh permutation per epoch

    partial = iter(ShardedBatchSampler(50, batch_size, seed=3))
    seen = sum((next(partial) for _ in range(50 // batch_size)), [])
    assert len(seen) == 48 and len(set(seen)) == 48  # the partial batch is dropped


class RowIndices(torch.utils.data.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return i


def batches_of(sampler, count, num_workers=2):
    loader = torch.utils.data.DataLoader(RowIndices(), batch_sampler=sampler, num_workers=num_workers,
                                         collate_fn=list)
    out = []
    for batch in loader:
        out.append(batch)
        sampler.position += 1  # consumed: the loop, not the prefetching workers, moves the position
        if len(out) == count:
            break
    return out


def test_sampler_resumes_the_identical_sequence_through_dataloader_workers():
    def sampler():
        return ShardedBatchSampler(20, 4, rank=1, world_size=2, seed=7)  # 5 batches an epoch
    straight = batches_of(sampler(), 13)
    first = sampler()
    before = batches_of(first, 7)  # workers have prefetched past batch 7 by now
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    assert state["position"] == 7
    resumed = sampler()
    resumed.load_state_dict(state)
    assert before + batches_of(resumed, 6) == straight  # crosses into the third epoch too
    with pytest.raises(ValueError, match="seed"):
        ShardedBatchSampler(20, 4, rank=1, world_size=2, seed=8).load_state_dict(state)


# -----------------------------------------------------------------------------
# batches

def padded(lengths, chunks):
    return sum(max(lengths[i] for i in chunk) * len(chunk) for chunk in chunks)


def in_runs(order, size):
    return [order[k:k + size] for k in range(0, len(order), size)]


def random_lengths(rng, n):
    return [rng.choice([rng.randint(5, 40), rng.randint(60, 1600)]) for _ in range(n)]  # texts and images


def test_split_by_length_examples():
    lengths = [5, 100, 7, 90, 3, 60, 60]
    chunks = split_by_length(lengths, max_items=4)
    assert chunks == [[1, 3], [5, 6], [2, 0, 4]]  # 3 = ceil(sqrt(7)) calls, cut where padding is least
    assert padded(lengths, chunks) == 341 < padded(lengths, in_runs([1, 3, 5, 6, 2, 0, 4], 4)) == 421
    assert split_by_length(lengths) == [[1, 3, 5, 6, 2, 0, 4]]  # no max_items: one chunk, longest first
    assert split_by_length([], max_items=4) == [] and split_by_length([]) == []


@pytest.mark.parametrize("n", [1, 2, 7, 32, 100, 192])
def test_split_by_length_count_depends_on_n_only(n):
    rng = random.Random(n)
    for max_items in (4, 32):
        counts = set()
        for _ in range(5):  # different lengths on different ranks: the same number of forward calls
            chunks = split_by_length(random_lengths(rng, n), max_items)
            assert sorted(sum(chunks, [])) == list(range(n))  # every index exactly once
            assert all(0 < len(c) <= max_items for c in chunks)
            counts.add(len(chunks))
        assert counts == {min(n, max(-(-n // max_items), math.ceil(math.sqrt(n))))}


def test_split_by_length_is_the_least_padding_cut():
    rng = random.Random(0)
    for _ in range(100):
        n = rng.randint(1, 9)
        lengths = [rng.randint(1, 50) for _ in range(n)]
        max_items = rng.choice([None, 1, 2, 3, 5])
        chunks = split_by_length(lengths, max_items)
        order = sum(chunks, [])
        assert order == sorted(range(n), key=lambda i: -lengths[i])
        brute = min(padded(lengths, [order[a:b] for a, b in zip([0, *cut], [*cut, n])])
                    for cut in itertools.combinations(range(1, n), len(chunks) - 1)
                    if all(b - a <= (max_items or n) for a, b in zip([0, *cut], [*cut, n])))
        assert padded(lengths, chunks) == brute, (lengths, max_items, chunks)


def test_split_by_length_pads_no_more_than_runs_of_max_items():
    rng = random.Random(1)
    for n, max_items in [(32, 32), (192, 32), (48, 8)]:
        lengths = random_lengths(rng, n)
        runs = in_runs(sorted(range(n), key=lambda i: -lengths[i]), max_items)
        least = padded(lengths, split_by_length(lengths, max_items))
        assert least <= padded(lengths, runs)
        if max_items == 32:  # train.py's micro_batch: clearly less, not just no more
            assert least < 0.85 * padded(lengths, runs)


def unpadded(chunks):
    """The rows of a list of collated chunks, padding removed, in order."""
    return [chunk["input_ids"][r, :int(chunk["attention_mask"][r].sum())]
            for chunk in chunks for r in range(len(chunk["input_ids"]))]


def test_collated_batches_put_each_positive_at_its_target(shapes, preprocessor, tmp_path):
    num_negatives, max_items = 3, 3
    rows, _ = read_rows(tmp_path, shapes["train"], shapes["images"], num_negatives, seed=0)
    dataset = train_dataset(tmp_path, preprocessor, shapes["train"], shapes["images"], num_negatives, seed=0)
    sampler = ShardedBatchSampler(len(dataset), batch_size=8, rank=0, world_size=2, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2,
                                         collate_fn=collate_train(preprocessor, max_items=max_items))
    batch = next(iter(loader))
    n = 4
    queries, candidates = unpadded(batch["query"]), unpadded(batch["candidate"])
    assert len(queries) == n and len(candidates) == n * (1 + num_negatives)
    assert [len(q) for q in queries] == sorted((len(q) for q in queries), reverse=True)
    # forward calls: max(ceil(n / max_items), ceil(sqrt(n))): 2 for the 4 queries, 6 for the 16 candidates
    assert [len(batch["query"]), len(batch["candidate"])] == [2, 6]
    assert all(len(chunk["input_ids"]) <= max_items for chunk in batch["query"] + batch["candidate"])
    assert sorted(batch["rows"].tolist()) == sorted(next(iter(sampler)))
    for i, row in enumerate(batch["rows"].tolist()):
        sides = rows[row]
        assert torch.equal(queries[i], preprocessor(sides["query"]["text"], sides["query"]["image"])["input_ids"])
        for k, side in enumerate(sides["candidates"]):
            ids = preprocessor(side["text"], side["image"])["input_ids"]
            if k == 0:
                assert torch.equal(candidates[batch["targets"][i]], ids)  # the positive at its target
            else:
                assert any(torch.equal(c, ids) for c in candidates)  # every hard negative is in the batch
    items = [dataset[i] for i in range(16)]
    chunks = [c for side in ("query", "candidate") for c in collate_train(preprocessor, 4)(items)[side]]
    padded_share = sum(int((c["attention_mask"] == 0).sum()) for c in chunks) / sum(c["attention_mask"].numel() for c in chunks)
    one_chunk = [c for side in ("query", "candidate") for c in collate_train(preprocessor, None)(items)[side]]
    one_chunk_share = sum(int((c["attention_mask"] == 0).sum()) for c in one_chunk) / sum(c["attention_mask"].numel() for c in one_chunk)
    assert 0 <= padded_share < one_chunk_share  # length-sorted chunks pad less than one chunk a side


# -----------------------------------------------------------------------------
# bad input

GOOD = dict(qry="<|image_1|> a query", qry_image_path="ok.png")
BAD_ROWS = {  # name: (fields of the bad row, the field the error names)
    "missing image": (dict(qry_image_path="missing.png"), "qry_image_path"),
    "missing column": (dict(pos_text=None), "pos_text"),
    "empty query": (dict(qry="<|image_1|>", qry_image_path=""), "qry"),
    "negatives not strings": (dict(neg_text=[1999, 2003]), "neg_text"),
    "negatives mismatch": (dict(neg_text=["a", "b"], neg_image_path=["ok.png"]), "neg_image_path"),
}


def bad_train_file(tmp_path, fields):
    save_image(tmp_path / "ok.png")
    records = [record(i, **GOOD) for i in range(6)]
    records[2].update(fields)
    if fields.get("pos_text", "") is None:
        del records[2]["pos_text"]
    return write_jsonl(tmp_path / "bad.jsonl", records)


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_training_rows_raise_naming_file_row_and_field(tmp_path, case):
    fields, field = BAD_ROWS[case]
    path = bad_train_file(tmp_path, fields)
    with pytest.raises(UserError) as error:
        read_rows(tmp_path, path, str(tmp_path), num_hard_negatives=2)
    assert path in str(error.value) and "line 3" in str(error.value) and repr(field) in str(error.value)


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_training_rows_are_skipped_and_counted(tmp_path, case):
    path = bad_train_file(tmp_path, BAD_ROWS[case][0])
    rows, reports = read_rows(tmp_path, path, str(tmp_path), num_hard_negatives=2, skip_bad_rows=True)
    assert len(rows) == 5 and skipped(reports) == 1
    assert "query 2" not in [r["query"]["text"] for r in rows]
    report = "\n".join(reports[0].lines())  # what train.py and --check_data=True print of the subset
    assert re.search(rf"bad rows: 1 \S.*, e\.g\. {re.escape(path)} line 3 field '{BAD_ROWS[case][1]}'", report)


def undecodable_images(tmp_path):
    """name -> an image file that exists but cannot be decoded (or is refused), each a way a real dataset breaks."""
    save_image(tmp_path / "whole.png", size=(64, 64))
    data = (tmp_path / "whole.png").read_bytes()
    files = {"truncated.png": data[:len(data) // 2], "empty.jpg": b"", "not_an_image.jpg": b"<html>oops</html>"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    save_image(tmp_path / "huge.png", size=(120, 120))  # over the pixel limit the test sets
    save_image(tmp_path / "thin.png", size=(1000, 4))  # aspect ratio 250
    return list(files) + ["huge.png", "thin.png"]


def test_undecodable_images_name_file_row_and_field_or_are_skipped_the_same_way_every_time(tmp_path, preprocessor,
                                                                                          monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 120 x 120 is then over twice the limit: refused
    bad = undecodable_images(tmp_path)
    records = [record(i) for i in range(10)]
    for k, name in enumerate(bad):  # rows 1, 3, 5, 7, 9: a bad image each, in a different field
        records[2 * k + 1].update([("qry_image_path", name)] if k % 2 else [("pos_image_path", name)])
    path = write_jsonl(tmp_path / "t.jsonl", records)
    strict = train_dataset(tmp_path, preprocessor, path, str(tmp_path), num_hard_negatives=1)
    # thin.png's 4,000 pixels are over the limit set here, not twice over it: Pillow warns, then reads it
    with pytest.warns(Image.DecompressionBombWarning, match="4000 pixels"):
        for k, name in enumerate(bad):
            field = "qry_image_path" if k % 2 else "pos_image_path"
            with pytest.raises(UserError, match=rf"t\.jsonl line {2 * k + 2} field '{field}': (cannot read )?image '[^']*{name}'"):
                strict[2 * k + 1]
        skipping = train_dataset(tmp_path, preprocessor, path, str(tmp_path), num_hard_negatives=1, skip_bad_rows=True)
        for k in range(len(bad)):
            item = skipping[2 * k + 1]  # the next row, which decodes; after the last row comes the first
            assert item["row"] == (2 * k + 2) % 10 and len(item["skipped"]) == 1 and bad[k] in item["skipped"][0]
            assert torch.equal(item["query"]["input_ids"], skipping[(2 * k + 2) % 10]["query"]["input_ids"])
    assert skipping[0]["skipped"] == [] and skipping[0]["row"] == 0
    loader = torch.utils.data.DataLoader(skipping, batch_size=10, num_workers=1, collate_fn=collate_train(preprocessor, 4))
    batch = next(iter(loader))  # through a worker: the same rows, the skips reported with the batch
    assert sorted(batch["rows"].tolist()) == [0, 0, 2, 2, 4, 4, 6, 6, 8, 8] and len(batch["skipped"]) == 5


def test_lines_that_are_not_utf8_or_nest_too_deep_are_bad_rows(tmp_path):
    lines = [json.dumps(record(i)).encode() for i in range(5)]
    lines[1] = json.dumps(record(1)).encode().replace(b"query 1", b"query \xff\xfe 1")  # Latin-1 bytes, not UTF-8
    lines[3] = b"[" * 100_000 + b"]" * 100_000  # valid JSON nested 100,000 deep
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(UserError, match=r"t\.jsonl line 2: not UTF-8 text \(.* at byte 15\)"):
        read_rows(tmp_path, str(path), str(tmp_path), 1)
    path.write_bytes(b"\n".join(lines[:1] + lines[2:]) + b"\n")
    with pytest.raises(UserError, match=r"t\.jsonl line 3: not a JSON object"):
        read_rows(tmp_path, str(path), str(tmp_path), 1)
    path.write_bytes(b"\n".join(lines) + b"\n")
    rows, reports = read_rows(tmp_path, str(path), str(tmp_path), 1, skip_bad_rows=True)
    assert skipped(reports) == 2 and len(rows) == 3


def test_a_corrupt_json_line_is_named_by_one_line_number_and_its_column(tmp_path):
    lines = [json.dumps(record(i)) for i in range(14)]
    lines[11] = '{"qry": "' + "x" * 31 + "\t" + 'a tab", "pos_text": "p"}'  # a raw tab: JSON's strings refuse it
    assert lines[11].index("\t") == 40  # column 41
    path = tmp_path / "corrupt.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _, reports = read_rows(tmp_path, str(path), str(tmp_path), 1, skip_bad_rows=True)
    example = reports[0].examples["not UTF-8 JSON"]
    assert skipped(reports) == 1 and example.startswith(f"{path} line 12: not a JSON object (column 41: ")
    assert example[len(str(path)):].count("line") == 1 and "control character" in example
    with pytest.raises(UserError) as error:  # the run's refusal carries the same one line
        read_rows(tmp_path, str(path), str(tmp_path), 1)
    assert f"{path} line 12: not a JSON object (column 41: " in str(error.value)


def test_image_paths_may_not_leave_image_dir(tmp_path):
    (tmp_path / "images").mkdir()
    save_image(tmp_path / "images" / "in.png")
    save_image(tmp_path / "outside.png")
    for i, escape in enumerate([str(tmp_path / "outside.png"), "../outside.png", "sub/../../outside.png"]):
        path = write_jsonl(tmp_path / f"t{i}.jsonl", [record(0, qry_image_path="in.png"),
                                                       record(1, pos_image_path=escape)])
        with pytest.raises(UserError, match=rf"t{i}\.jsonl line 2 field 'pos_image_path': image path .* leaves image_dir"):
            read_rows(tmp_path, path, str(tmp_path / "images"), 1)
        rows, _ = read_rows(tmp_path, path, str(tmp_path / "images"), 1, allow_any_image_path=True)
        assert rows[1]["candidates"][0]["image"] == str(tmp_path / "outside.png")
        assert skipped(read_rows(tmp_path, path, str(tmp_path / "images"), 1, skip_bad_rows=True)[1]) == 1


def test_a_field_outside_its_layout_is_a_bad_row_naming_it_and_the_closest_known_one(tmp_path):
    save_image(tmp_path / "photo.png")
    plain = [{"query": f"q {i}", "positive": f"p {i}", "negatives": [f"n {i}"]} for i in range(6)]
    plain[2] = {"query": "q 2", "query_img": "photo.png", "positive": "p 2"}  # would train as a text-only query
    plain[4] = {"query": "q 4", "positve": "p 4", "positive_image": "photo.png"}  # its text would be dropped
    path = write_jsonl(tmp_path / "mine.jsonl", plain)
    with pytest.raises(UserError) as error:
        read_rows(tmp_path, path, str(tmp_path), 1)
    assert f"{path} line 3 field 'query_img'" in str(error.value) and "'query_image'?" in str(error.value)
    rows, reports = read_rows(tmp_path, path, str(tmp_path), 1, skip_bad_rows=True)
    assert len(rows) == 4 and skipped(reports) == 2
    report = "\n".join(reports[0].lines())  # what --check_data=True prints: each unknown field, and its fix
    for line, field, known in ((3, "query_img", "query_image"), (5, "positve", "positive")):
        assert re.search(rf"bad rows: 1 .*{field}.*, e\.g\. {re.escape(path)} line {line} field '{field}': .*"
                         rf"did you mean '{known}'\?", report), report
    # a column no layout has, in a known layout's Parquet file: every row bad, named by file and column
    table = pa.Table.from_pylist([dict(record(i), qry_img="photo.png") for i in range(3)])
    pq.write_table(table, tmp_path / "mined.parquet")
    with pytest.raises(UserError) as error:
        read_rows(tmp_path, str(tmp_path / "mined.parquet"), str(tmp_path), 1)
    assert "mined.parquet row 0 field 'qry_img'" in str(error.value) and "'qry_image_path'?" in str(error.value)
    rows, reports = read_rows(tmp_path, str(tmp_path / "mined.parquet"), str(tmp_path), 1, skip_bad_rows=True)
    assert rows == [] and reports[0].bad == {"unknown field 'qry_img'": 3}
    # what the real layouts carry beside the fields is read as before: mmE5-synthetic's modality, tools/mine.py's
    # neg_score, the index pandas writes
    table = pa.Table.from_pylist([dict(record(i), modality="I2T", neg_score="[0.5]") for i in range(3)])
    pq.write_table(table.append_column("__index_level_0__", pa.array([7, 8, 9])), tmp_path / "known.parquet")
    rows, reports = read_rows(tmp_path, str(tmp_path / "known.parquet"), str(tmp_path), 1)
    assert len(rows) == 3 and not reports[0].bad


def test_check_data_finds_an_image_deleted_after_the_conversion_as_a_conversion_would(tmp_path):
    from readers import training
    from readers.reports import SourceReport
    from tests.rows import table
    for name in ("a.png", "b.png", "c.png"):
        save_image(tmp_path / name)
    records = [record(i, qry_image_path="a.png") for i in range(6)]
    records[2]["qry_image_path"] = "b.png"
    records[4]["neg_image_path"] = ["", "c.png", "", "", ""]
    path = write_jsonl(tmp_path / "t.jsonl", records)
    cached = table(str(tmp_path / "first"), path, str(tmp_path), 1)  # converted while every image was there
    os.remove(tmp_path / "b.png")
    os.remove(tmp_path / "c.png")
    found = table(str(tmp_path / "first"), path, str(tmp_path), 1)  # a start: the cached table, images not looked at
    assert found.path == cached.path and not found.subsets[0]["bad"]
    subsets = training.subsets_on_disk(found)
    report = SourceReport.from_dict(subsets[0])
    assert report.bad == {"missing image": 2} and report.rows == 4
    assert report.examples["missing image"] == f"{path} line 3 field 'qry_image_path': image not found: {tmp_path / 'b.png'}"
    refusal = training.problems(subsets, 1, skip_bad_rows=False)
    assert len(refusal) == 1 and "2 bad rows" in refusal[0] and f"{path} line 3" in refusal[0]
    assert training.problems(subsets, 1, skip_bad_rows=True) == []  # counted, skipped
    # the same report a fresh conversion writes now
    with pytest.raises(UserError, match=re.escape(f"{path} line 3 field 'qry_image_path': image not found")):
        table(str(tmp_path / "fresh"), path, str(tmp_path), 1)
    _, fresh = read_rows(str(tmp_path / "fresh"), path, str(tmp_path), 1, skip_bad_rows=True)
    assert {key: getattr(report, key) for key in ("bad", "examples", "files", "negatives", "judged")} == \
        {key: getattr(fresh[0], key) for key in ("bad", "examples", "files", "negatives", "judged")}
    assert [line for line in report.lines() if "bad rows" in line] == \
        [line for line in fresh[0].lines() if "bad rows" in line]
    # a negative's image, named by its field as the conversion names it
    save_image(tmp_path / "c.png")
    records[2]["qry_image_path"] = "a.png"
    path = write_jsonl(tmp_path / "u.jsonl", records)
    found = table(str(tmp_path / "second"), path, str(tmp_path), 1)
    os.remove(tmp_path / "c.png")
    report = SourceReport.from_dict(training.subsets_on_disk(found)[0])
    assert report.examples == {"missing image": f"{path} line 5 field 'neg_image_path[1]': image not found: "
                                                f"{tmp_path / 'c.png'}"}


def test_a_line_that_is_not_json_is_a_bad_row(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(record(i)) + "\n" for i in range(4)) + "{not json\n")
    with pytest.raises(UserError, match="line 5"):
        read_rows(tmp_path, str(path), str(tmp_path), 2)
    assert skipped(read_rows(tmp_path, str(path), str(tmp_path), 2, skip_bad_rows=True)[1]) == 1


# -----------------------------------------------------------------------------
# the toy benchmark

def test_shapes_benchmark_is_read_by_both_readers(shapes, tmp_path):
    rows, reports = read_rows(tmp_path, shapes["train"], shapes["images"], num_hard_negatives=5)
    assert len(rows) == SHAPES_SIZES["num_train"] and skipped(reports) == 0  # every image was checked to exist
    names, empty = find_eval_datasets(shapes["eval"], shapes["images"])
    assert empty == []
    assert len(names) == 10 and sum(n.endswith("-OOD") for n in names) == 5
    assert not set(names) & set(MMEB_DATASETS)
    unseen = {f"{c} {s}" for c, s in prepare_module.UNSEEN}
    train_text = Path(shapes["train"]).read_text()
    assert not any(label in train_text for label in unseen)  # unseen combinations: never in training
    for name in names:
        eval_rows, report = read_eval_dataset(Path(shapes["eval"]) / name, shapes["images"])  # checks images exist
        assert not report.bad and len(eval_rows) == SHAPES_SIZES["num_eval"]
        for row in eval_rows:
            candidates = [(c["text"], c["image"]) for c in row["candidates"]]
            assert len(candidates) == 10 and len(set(candidates)) == 10
        if name == "Shapes-CLS-OOD":
            assert all(row["candidates"][0]["text"] in unseen for row in eval_rows)
        if name == "Shapes-T2I":
            assert eval_rows[0]["query"]["text"].startswith("Retrieve an image that best matches")


def test_prepare_is_deterministic_and_runs_from_the_command_line(shapes, tmp_path):
    out = tmp_path / "shapes"
    command = [f"--out_dir={out}", "--seed=0", "--pretrain=False"] + [f"--{k}={v}" for k, v in SHAPES_SIZES.items()]
    prepare_module.main(command)  # python -m shapes.prepare's own entry (its pretraining: tests/test_toy.py's)
    assert (out / "tiny-qwen3.5" / "config.json").is_file()  # the model config/shapes_*.py start from
    fixture_root = Path(shapes["train"]).parent
    files = sorted(p.relative_to(fixture_root) for p in fixture_root.rglob("*") if p.is_file())
    written = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert files == sorted(p for p in written if p.parts[0] != "tiny-qwen3.5" and p.name != prepare_module.STAMP)
    assert all((fixture_root / f).read_bytes() == (out / f).read_bytes() for f in files)
    other = prepare_module.prepare(str(tmp_path / "seed1"), seed=1, **SHAPES_SIZES)
    assert Path(other["train"]).read_bytes() != Path(shapes["train"]).read_bytes()


# -----------------------------------------------------------------------------
# the prepared table

def test_the_table_is_converted_once_and_read_through_a_memory_map(tmp_path, capsys):
    import pickle
    import pyarrow
    from data import TrainTable
    from readers.training import prepared_table
    source = write_jsonl(tmp_path / "rows.jsonl", [record(i) for i in range(40)])
    tables = str(tmp_path / "tables")
    path = prepared_table(source, str(tmp_path), tables)
    assert "converting" in capsys.readouterr().out
    assert prepared_table(source, str(tmp_path), tables) == path  # found again: not converted again
    assert "converting" not in capsys.readouterr().out
    assert sorted(os.listdir(tables)) == sorted([os.path.basename(path), os.path.basename(path)[:-6] + ".json"])
    before = pyarrow.total_allocated_bytes()
    table = TrainTable(path)
    texts = [table.row(i)["query"]["text"] for i in range(len(table))]
    assert texts == [f"query {i}" for i in range(40)]
    assert pyarrow.total_allocated_bytes() - before < 4096  # the rows are the map's pages, not a copy
    assert len(pickle.dumps(table)) < 20_000  # what a DataLoader worker receives: the path, not the rows
    # what the table is made from: the sources and the options that change a row, not the seed or the fill
    assert prepared_table(source, str(tmp_path), tables, instructions="dataset") != path
    records = [record(i) for i in range(40)]
    records[20]["qry"] = "query X0"  # the same size, within the same clock tick: still another table
    write_jsonl(tmp_path / "rows.jsonl", records)
    assert os.path.getsize(source) == os.path.getsize(tmp_path / "rows.jsonl")
    assert prepared_table(source, str(tmp_path), tables) != path
    with open(path, "r+b") as f:  # a table cut short is refused, naming the way out
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(UserError, match=re.escape(path) + ".*delete .*convert again"):
        TrainTable(path).row(0)


@pytest.mark.slow
def test_one_writer_converts_while_the_others_wait(tmp_path):
    import contextlib
    import io
    import multiprocessing
    import socket
    import subprocess
    import threading

    from common import lock_record
    from readers import training
    source = write_jsonl(tmp_path / "rows.jsonl", [record(i) for i in range(3000)])
    results = multiprocessing.get_context("fork").Queue()

    def rank():  # a forked process, as a rank of its own: its output and the path it got
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            path = training.prepared_table(source, str(tmp_path), str(tmp_path / "tables"))
        results.put((out.getvalue(), path))

    ranks = [multiprocessing.get_context("fork").Process(target=rank) for _ in range(3)]  # three ranks at once
    for process in ranks:
        process.start()
    outputs = [results.get(timeout=120) for _ in ranks]
    for process in ranks:
        process.join(timeout=60)
    assert all(process.exitcode == 0 for process in ranks), outputs
    assert sum("converting" in output for output, _ in outputs) == 1  # one wrote it
    assert len({path for _, path in outputs}) == 1
    # a lock left by a writer that died on this host, or whose pid now runs another process, is taken over
    other = write_jsonl(tmp_path / "other.jsonl", [record(i) for i in range(5)])
    target = training.table_path(training.train_entries(other, str(tmp_path)),
                                 [training.train_subsets(other, "original")], str(tmp_path / "tables"), "original",
                                 "paper", False)

    def convert_aside(lines):  # in a thread (a daemon), so a writer that waits for ever fails the test, not hangs it
        thread = threading.Thread(target=lambda: lines.append(training.prepared_table(other, str(tmp_path),
                                                                                      str(tmp_path / "tables"))))
        thread.daemon = True
        thread.start()
        return thread

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    reused = lock_record()
    for holder in ({"host": socket.gethostname(), "pid": dead.pid}, dict(reused, process_start=reused["process_start"] + 1)):
        json.dump(holder, open(target + ".lock", "w"))
        lines = []
        convert_aside(lines).join(timeout=60)
        assert lines == [target] and not os.path.exists(target + ".lock"), holder
        os.remove(target)
        os.remove(target[:-len(".arrow")] + ".json")
    # another host's writer is not ours to judge: this waits, and converts once the lock is gone
    json.dump({"host": "elsewhere", "pid": 1}, open(target + ".lock", "w"))
    lines = []
    waiting = convert_aside(lines)
    time.sleep(1.5)
    assert waiting.is_alive() and not lines
    os.remove(target + ".lock")  # it finished or was cleared: the waiter converts
    waiting.join(timeout=60)
    assert lines == [target] and os.path.isfile(target)


def test_your_own_rows_in_the_plain_layout_need_no_code(tmp_path):
    save_image(tmp_path / "photo.png")
    plain = [{"query": "find the red one", "query_image": "", "positive": "", "positive_image": "photo.png",
              "negatives": ["a blue one", ""], "negative_images": ["", "photo.png"]},
             {"query": "what is shown?", "query_image": "photo.png", "positive": "a red rectangle",
              "negatives": ["a green circle"]}]
    jsonl = write_jsonl(tmp_path / "mine.jsonl", plain)
    parquet = str(tmp_path / "mine.parquet")
    pq.write_table(pa.Table.from_pylist([dict(p, positive_image=p.get("positive_image", ""),
                                              negative_images=p.get("negative_images", [""])) for p in plain]), parquet)
    image = str(tmp_path / "photo.png")
    for path in (jsonl, parquet):
        rows, reports = read_rows(tmp_path, path, str(tmp_path), num_hard_negatives=2, instructions="dataset")
        assert reports[0].layout == "plain" and len(rows) == 2
        assert rows[0]["query"] == {"text": "find the red one", "image": None}
        assert rows[0]["candidates"] == [{"text": "", "image": image}, {"text": "a blue one", "image": None},
                                         {"text": "", "image": image}]  # an image negative stays image-only here
        assert rows[1]["query"] == {"text": "what is shown?", "image": image}
        assert rows[1]["candidates"][:2] == [{"text": "a red rectangle", "image": None},
                                             {"text": "a green circle", "image": None}]  # the third filled
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(UserError, match=r"bad\.jsonl line 1 field 'query': no query column.* qry,.*query,.*question"):
        read_rows(tmp_path, bad, str(tmp_path), 1)


def test_a_scalar_negative_is_one_text_unless_it_is_a_list_of_strings(tmp_path):
    # MMEB-train's negative columns are scalar strings, which VLM2Vec reads whole even where one begins with '[';
    # mmE5's hold list literals. The rule: a string that parses to a list of strings is that list, any other string
    # one entry
    from readers.records import ImagePaths, list_field, train_row
    for text in ("[Note] no data for 2010", "[x]", "[1999, 2003]", "['a', 'b'"):
        assert list_field({"neg_text": text}, "neg_text") == [text]
        row, missing = train_row({"qry": "a query", "qry_image_path": "", "pos_text": "the answer", "pos_image_path": "",
                                  "neg_text": text, "neg_image_path": ""}, ImagePaths(str(tmp_path)), lambda t: t)
        assert row["negatives"] == [text] and row["negative_images"] == [None] and missing == 0
    assert list_field({"neg_text": "['', 'a']"}, "neg_text") == ["", "a"]  # mmE5's literal
    assert list_field({"neg_text": '["b", null]'}, "neg_text") == ["b", ""]  # JSON
    assert list_field({"neg_text": "[]"}, "neg_text") == []


def test_an_image_dir_that_does_not_exist_is_said_as_that_not_only_as_bad_rows(tmp_path):
    from readers.reports import SourceReport
    save_image(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "t.jsonl", [record(i, qry_image_path="a.png") for i in range(4)])
    wrong = str(tmp_path / "no_such_folder")
    for skip in (False, True):  # skipping bad rows does not hide a folder that is not there
        with pytest.raises(UserError, match=rf"^train_data: {re.escape(path)}: image_dir '{re.escape(wrong)}' does not "
                                            r"exist, so the images and videos of 4 rows, named relative to it, are "
                                            r"missing: pass --image_dir="):
            read_rows(tmp_path / str(skip), path, wrong, skip_bad_rows=skip)
    text_only = write_jsonl(tmp_path / "text.jsonl", [record(i) for i in range(4)])
    rows, reports = read_rows(tmp_path, text_only, wrong)  # rows without images need no image_dir
    assert len(rows) == 4 and not reports[0].bad
    nothing = SourceReport("x.jsonl", "", "(a file)")  # a source no row was read from names no layout
    assert nothing.lines()[0].endswith("layout unknown: no row read)")

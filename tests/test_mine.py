"""
Tests of tools/mine.py and tools/judge.py on the toy benchmark with the tiny random Qwen3.5 (shapes/tiny_model.py)
as both the mining embedder and the judge: the mined file in the mmE5 layout, read back as train.py reads it; its
negatives closer to their queries than data.py's random fill; its scores the embedder's own similarity; the near-duplicate
threshold; the judge's scores against softmax(logit_yes, logit_no) computed here with plain transformers; refined
sampling; an interrupted judge run resumed; two gloo ranks against one process.

    python -m pytest -q tests/test_mine.py
"""
import ast
import json
import functools
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from common import UserError
from media import IMAGE_MARKER
from runs.export import load_embedder
from shapes.prepare import prepare
from tests.rows import read_rows, train_dataset
from tools import judge as judging
from tools import mine
from tests.toyrun import torchrun

pytestmark = pytest.mark.slow  # mines and judges the toy in this process, trains and evaluates on what it mined

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K, POOL, MAX_PIXELS = 3, 8, 4096  # negatives a row, candidates pooled a query; 64 x 64 images: 4 tokens each


@pytest.fixture(scope="module")
def toy(tmp_path_factory, tiny_checkpoint):
    """The toy's training rows, and one torch thread while this module runs (two spin against other work on a
    2-core machine; the README's Threads)."""
    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("mine")
    paths = prepare(str(root / "shapes"), seed=0, num_train=60, num_eval=10)
    yield {"root": root, "train": paths["train"], "images": paths["images"], "tiny": tiny_checkpoint}
    torch.set_num_threads(threads)


def mine_args(toy, out, *args):
    return [f"--init_from={toy['tiny']}", f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}",
            f"--table_dir={toy['root'] / 'tables'}", f"--out={out}", f"--pool_size={POOL}", f"--num_hard_negatives={K}",
            "--num_workers=0",
            f"--max_pixels={MAX_PIXELS}", "--duplicate_threshold=0.999", "--threads=1", *args]


def run_mine(toy, out, *args):
    return mine.main(mine_args(toy, out, *args))


@pytest.fixture(scope="module")
def mined(toy):
    out = toy["root"] / "mined"
    summary = run_mine(toy, out)
    return {"out": str(out), "summary": summary, "table": pq.read_table(out / "train" / "train.parquet").to_pylist()}


@pytest.fixture(scope="module")
def embedder(toy):
    return load_embedder(toy["tiny"], max_pixels=MAX_PIXELS)[0].eval()


def side(toy, text, image):
    return {"text": text, "image": os.path.join(toy["images"], image) if image else None}


def negatives_of(toy, record):
    texts, images = ast.literal_eval(record["neg_text"]), ast.literal_eval(record["neg_image_path"])
    return [side(toy, t, i) for t, i in zip(texts, images)]


VECTORS = {}  # (text, image) -> the tiny model's embedding: the tests ask for the same items many times


def embed(embedder, sides):
    """(n, D) embeddings of sides, each distinct item encoded once in this module."""
    missing = list(dict.fromkeys((s["text"], s["image"]) for s in sides if (s["text"], s["image"]) not in VECTORS))
    if missing:
        vectors = embedder.encode([{"text": t, "image": i} for t, i in missing], batch_size=32)
        VECTORS.update(zip(missing, vectors))
    return torch.stack([VECTORS[(s["text"], s["image"])] for s in sides])


def cosines(embedder, queries, candidates):
    """(n,) cos(query i, candidate i), the tiny model's embeddings."""
    return torch.nn.functional.cosine_similarity(embed(embedder, queries), embed(embedder, candidates), dim=-1)


def test_mined_file_is_mmE5_layout_and_reads_back(toy, mined):
    table = mined["table"]
    assert len(table) == 60 and mined["summary"]["subsets"]["train"]["negatives"] == [K, K]
    assert set(table[0]) == {"qry", "qry_image_path", "pos_text", "pos_image_path", "neg_text", "neg_image_path",
                             "neg_score"}
    source = [json.loads(line) for line in open(toy["train"])]
    for record, original in zip(table, source):  # the rows' own text (no instruction rewrite), paths as in the source
        assert [record[k] for k in ("qry", "qry_image_path", "pos_text", "pos_image_path")] == \
            [original[k] for k in ("qry", "qry_image_path", "pos_text", "pos_image_path")]
        scores = ast.literal_eval(record["neg_score"])
        assert len(scores) == K and scores == sorted(scores, reverse=True)  # hardest first
        positive = (record["pos_text"], record["pos_image_path"])
        pairs = list(zip(ast.literal_eval(record["neg_text"]), ast.literal_eval(record["neg_image_path"])))
        assert positive not in pairs and len(set(pairs)) == K
        assert all(not os.path.isabs(image) for _, image in pairs)  # relative to image_dir
    rows, reports = read_rows(toy["root"], mined["out"], toy["images"], num_hard_negatives=K)
    assert len(rows) == 60 and reports[0].filled_and_cut(K) == (0, 0)
    for i, record in enumerate(table):
        assert rows[i]["query"] == side(toy, record["qry"], record["qry_image_path"])
        assert rows[i]["candidates"][1:] == negatives_of(toy, record)


def test_mined_negatives_are_harder_than_the_random_fill(toy, mined, embedder, tmp_path):
    # the same rows without negatives: data.py fills them at random from the subset's other rows
    bare = tmp_path / "bare.jsonl"
    with open(toy["train"]) as f, open(bare, "w") as g:
        for line in f:
            record = json.loads(line)
            g.write(json.dumps({k: v for k, v in record.items() if not k.startswith("neg_")}) + "\n")
    filled, reports = read_rows(tmp_path, str(bare), toy["images"], num_hard_negatives=K, seed=0)
    assert reports[0].filled_and_cut(K)[0] == 60
    queries = [side(toy, r["qry"], r["qry_image_path"]) for r in mined["table"] for _ in range(K)]
    mined_cos = cosines(embedder, queries, [n for r in mined["table"] for n in negatives_of(toy, r)]).view(60, K)
    random_cos = cosines(embedder, queries, [n for i in range(60) for n in filled[i]["candidates"][1:]]).view(60, K)
    scores = torch.tensor([ast.literal_eval(r["neg_score"]) for r in mined["table"]])
    assert torch.allclose(scores, mined_cos, atol=1e-5)  # neg_score: the embedder's similarity (cos: a plain release)
    assert mined_cos.mean() > random_cos.mean() + 0.01
    assert (mined_cos.mean(dim=1) >= random_cos.mean(dim=1)).float().mean() > 0.9  # row by row, nearly always


def test_mined_negatives_are_each_querys_top_k_of_the_whole_pool(toy, mined, embedder):
    # global retrieval written out: every distinct positive of the subset is a candidate, but the row's own
    # positive and its near-duplicates (cosine to it above 0.999)
    table = mined["table"]
    pool = list(dict.fromkeys((r["pos_text"], r["pos_image_path"]) for r in table))
    unit = lambda sides: torch.nn.functional.normalize(embed(embedder, sides), dim=-1)  # noqa: E731
    pool_vectors = unit([side(toy, *c) for c in pool])
    queries = unit([side(toy, r["qry"], r["qry_image_path"]) for r in table])
    positives = unit([side(toy, r["pos_text"], r["pos_image_path"]) for r in table])
    scores = (queries @ pool_vectors.T).masked_fill(positives @ pool_vectors.T > 0.999, -float("inf"))  # (60, P)
    for i, record in enumerate(table):
        scores[i, pool.index((record["pos_text"], record["pos_image_path"]))] = -float("inf")
        expected = [side(toy, *pool[j]) for j in scores[i].topk(K).indices.tolist()]
        assert negatives_of(toy, record) == expected, record["qry"]


def test_near_duplicates_of_the_positive_are_dropped(toy, mined, embedder):
    positives = [side(toy, r["pos_text"], r["pos_image_path"]) for r in mined["table"] for _ in range(K)]
    before = cosines(embedder, positives, [n for r in mined["table"] for n in negatives_of(toy, r)])
    threshold = before.median().item()  # half the negatives mined at 0.999 are above it
    out = toy["root"] / "strict"
    run_mine(toy, out, f"--duplicate_threshold={threshold}")
    table = pq.read_table(out / "train" / "train.parquet").to_pylist()
    after = cosines(embedder, positives, [n for r in table for n in negatives_of(toy, r)])
    assert after.max() <= threshold + 1e-5 < before.max()


@functools.lru_cache(maxsize=None)
def plain_transformers(path):
    """The tokenizer, image processor and generative model of a checkpoint folder, as transformers loads them."""
    from transformers import Qwen3_5ForConditionalGeneration, Qwen3_5Tokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    processor.size = dict(processor.size, longest_edge=MAX_PIXELS)
    return Qwen3_5Tokenizer.from_pretrained(path), processor, Qwen3_5ForConditionalGeneration.from_pretrained(path).eval()


def independent_judge_score(toy, query, candidate):
    """s = softmax(logit_yes, logit_no)[0] for one pair, with plain transformers: the prompt of judging.JudgePrompt's
    docstring as one string, the image processor's own pixels and transformers' own rotary positions."""
    tokenizer, processor, model = plain_transformers(toy["tiny"])
    texts, pixels, grids = [], [], []
    for item in (query, candidate):
        text = item["text"]
        if item["image"]:
            inputs = processor(images=[Image.open(item["image"]).convert("RGB")], return_tensors="pt")
            pixels.append(inputs["pixel_values"])
            grids.append(inputs["image_grid_thw"])
            tokens = int(inputs["image_grid_thw"].prod()) // 4  # merge 2 x 2
            vision = "<|vision_start|>" + "<|image_pad|>" * tokens + "<|vision_end|>"
            text = text.replace(IMAGE_MARKER, vision, 1) if IMAGE_MARKER in text else vision + text
        texts.append(text)
    prompt = (f"<|im_start|>user\n{judging.JudgePrompt.PROMPT}\nQuery:\n{texts[0]}\nCandidate:\n{texts[1]}<|im_end|>\n"
              "<|im_start|>assistant\n")
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int(),
                       pixel_values=torch.cat(pixels) if pixels else None,
                       image_grid_thw=torch.cat(grids) if grids else None).logits[0, -1].double()
    yes, no = (tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in ("Yes", "No"))
    return torch.stack([logits[yes], logits[no]]).softmax(dim=0)[0].item()


@pytest.fixture(scope="module")
def judged(toy):
    out = toy["root"] / "judged"
    summary = run_mine(toy, out, f"--judge_from={toy['tiny']}", "--judge_chunk_rows=16")
    return {"out": out, "summary": summary, "table": pq.read_table(out / "train" / "train.parquet").to_pylist()}


def test_judge_scores_are_softmax_of_yes_and_no(toy, judged):
    table = judged["table"]
    assert {"pos_judge", "neg_judge"} <= set(table[0])
    scores = [r["pos_judge"] for r in table] + [s for r in table for s in ast.literal_eval(r["neg_judge"])]
    assert all(0.0 <= s <= 1.0 for s in scores) and max(scores) - min(scores) > 1e-3  # the pairs differ
    by_kind = {}  # a row of each kind (images in the query, the positive, both), its positive and first negative
    for record in table:
        by_kind.setdefault((bool(record["qry_image_path"]), bool(record["pos_image_path"])), record)
    assert len(by_kind) == 3
    for record in by_kind.values():
        query = side(toy, record["qry"], record["qry_image_path"])
        positive = side(toy, record["pos_text"], record["pos_image_path"])
        assert record["pos_judge"] == pytest.approx(independent_judge_score(toy, query, positive), abs=1e-5)
        negative = negatives_of(toy, record)[0]
        first = ast.literal_eval(record["neg_judge"])[0]
        assert first == pytest.approx(independent_judge_score(toy, query, negative), abs=1e-5)


def test_judged_negatives_are_the_refined_sampling_of_the_pool(toy, judged):
    chunks = sorted(os.listdir(str(judged["out"]) + ".judge"))
    assert len(chunks) == 4  # 60 rows in chunks of 16
    pooled = []
    for name in chunks:
        with open(os.path.join(str(judged["out"]) + ".judge", name)) as f:
            pooled += json.load(f)["scores"]  # per row: [s(positive), s(pooled candidate)...]
    dropped = 0
    for record, scores in zip(judged["table"], pooled):
        picks = mine.refined_picks(scores[0], scores[1:], K, 0.01)
        assert record["pos_judge"] == scores[0]
        assert ast.literal_eval(record["neg_judge"]) == [scores[1:][p] for p in picks]
        assert all(s <= scores[0] - 0.01 for s in ast.literal_eval(record["neg_judge"])) or len(set(picks)) == 1
        dropped += sum(s > scores[0] - 0.01 for s in scores[1:])
    assert judged["summary"]["subsets"]["train"]["false_negatives"] == dropped > 0


def test_the_answer_starts_where_the_chat_template_says(toy):
    from transformers import Qwen3_5Tokenizer
    tokenizer = Qwen3_5Tokenizer.from_pretrained(toy["tiny"])
    assert judging.answer_start(tokenizer) == "<|im_start|>assistant\n"  # the tiny tokenizer has no template
    # the generation prompt of Qwen3's template (its other branches left out): an empty think block without thinking
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
        "<think>\n\n</think>\n\n{% endif %}{% endif %}")
    assert judging.answer_start(tokenizer) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_rank_zero_waits_for_the_other_ranks_chunks_and_names_a_stall(tmp_path):
    files = {c: str(tmp_path / f"chunk_{c}.json") for c in range(2)}
    (tmp_path / "chunk_0.json").write_text("{}")
    with pytest.raises(UserError, match="1 chunks missing and none came for"):
        judging.wait_for_chunks(files, timeout_minutes=0.002, poll_seconds=0.01)
    (tmp_path / "chunk_1.json").write_text("{}")
    judging.wait_for_chunks(files, timeout_minutes=0.002, poll_seconds=0.01)  # all there: returns at once


def test_refined_sampling_drops_false_negatives_and_cycles():
    assert mine.refined_picks(0.9, [0.1, 0.2, 0.3, 0.4], 3, 0.01) == [0, 1, 2]  # all kept: the hardest three
    assert mine.refined_picks(0.9, [0.95, 0.2, 0.895, 0.4, 0.5], 3, 0.01) == [1, 3, 4]  # 0.95 and 0.895 > 0.89
    assert mine.refined_picks(0.9, [0.95, 0.2, 0.99, 0.4], 5, 0.01) == [1, 3, 1, 3, 1]  # fewer than k: cyclic
    assert mine.refined_picks(0.5, [0.9, 0.7, 0.8], 2, 0.01) == [1, 1]  # all false: the lowest-scored stands in
    assert mine.refined_picks(0.5, [], 2, 0.01) == []


def test_an_interrupted_judge_run_resumes(toy, judged, monkeypatch, capsys):
    out = toy["root"] / "resumed"
    score, calls = judging.Judge.score, []

    def dies_at_the_third_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a kill would
        return score(self, *args, **kwargs)

    monkeypatch.setattr(judging.Judge, "score", dies_at_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        run_mine(toy, out, f"--judge_from={toy['tiny']}", "--judge_chunk_rows=16")
    assert len(os.listdir(str(out) + ".judge")) == 2 and not os.path.exists(out / "train")
    calls.clear()

    def counted(self, *args, **kwargs):
        calls.append(1)
        return score(self, *args, **kwargs)

    monkeypatch.setattr(judging.Judge, "score", counted)
    capsys.readouterr()
    run_mine(toy, out, f"--judge_from={toy['tiny']}", "--judge_chunk_rows=16")
    assert "judge: 2 of 4 chunks already done" in capsys.readouterr().out
    assert len(calls) == 2  # only the two chunks the first run did not finish
    assert pq.read_table(out / "train" / "train.parquet").to_pylist() == judged["table"]  # deterministic, the same



def test_two_gloo_ranks_equal_one_process(toy, judged, tmp_path):
    # each rank embeds and retrieves a strided share and judges every other chunk; rank 0 writes what all found
    out = tmp_path / "ranks"
    code, output = torchrun(2, "-m", "tools.mine", *mine_args(toy, out, f"--judge_from={toy['tiny']}",
                                                                "--judge_chunk_rows=16"), timeout=180)
    assert code == 0, output[-6000:]
    table = pq.read_table(out / "train" / "train.parquet").to_pylist()
    assert len(os.listdir(str(out) + ".judge")) == 4
    for got, want in zip(table, judged["table"], strict=True):
        for column, value in want.items():
            if column in ("neg_score", "neg_judge"):  # float lists: shares of other sizes, other float rounding
                assert ast.literal_eval(got[column]) == pytest.approx(ast.literal_eval(value), abs=1e-5), column
            else:
                assert got[column] == pytest.approx(value, abs=1e-5), column


def test_mistakes_are_one_line_errors(toy, tmp_path):
    with pytest.raises(UserError, match="set --init_from"):
        mine.main([f"--train_data={toy['train']}", f"--out={tmp_path}"])
    with pytest.raises(UserError, match="num_hard_negatives must be at least 1"):
        run_mine(toy, tmp_path / "x", "--num_hard_negatives=0")
    outside = tmp_path / "elsewhere"
    os.makedirs(outside)
    with pytest.raises(UserError, match="outside image_dir"):
        entry = [{"path": toy["train"], "image_dir": toy["images"]}]
        mine.main([f"--init_from={toy['tiny']}", f"--train_data={entry!r}",
                   f"--image_dir={outside}", f"--out={tmp_path / 'y'}", "--num_workers=0", "--threads=1",
                   f"--max_pixels={MAX_PIXELS}", "--pool_size=2", "--num_hard_negatives=1"])
    # from the command line: one line, no traceback
    run = subprocess.run([sys.executable, "-m", "tools.mine", f"--init_from={toy['tiny']}",
                          "--train_data=/no/such/rows.jsonl", f"--out={tmp_path / 'z'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip() == "error: train_data: /no/such/rows.jsonl does not exist"


def test_judged_rows_carry_their_scores_to_each_querys_own_candidates(toy, judged, tiny_checkpoint, tmp_path):
    from data import collate_train
    from model import Preprocessor
    rows, _ = read_rows(tmp_path, judged["out"], toy["images"], K, judged=True)
    table = pq.read_table(os.path.join(judged["out"], "train", "train.parquet")).to_pylist()
    assert rows[0]["judge"] == [table[0]["pos_judge"]] + ast.literal_eval(table[0]["neg_judge"])  # positive first
    preprocessor = Preprocessor.from_pretrained(tiny_checkpoint, max_pixels=MAX_PIXELS)
    dataset = train_dataset(tmp_path, preprocessor, judged["out"], toy["images"], K, judged=True)
    items = [dataset[i] for i in range(6)]
    batch = collate_train(preprocessor, max_items=4)(items)  # several chunks a side: positions are not the rows' order
    own, scores = batch["own_candidates"], batch["judge_scores"]
    assert own.shape == scores.shape == (6, 1 + K) and torch.equal(own[:, 0], batch["targets"])
    candidates = [chunk["input_ids"][r, :int(chunk["attention_mask"][r].sum())]
                  for chunk in batch["candidate"] for r in range(len(chunk["input_ids"]))]
    for i, row in enumerate(batch["rows"].tolist()):
        assert scores[i].tolist() == pytest.approx(rows[row]["judge"])
        for k, side in enumerate(rows[row]["candidates"]):  # each score sits with its own candidate
            assert torch.equal(candidates[own[i, k]], preprocessor(side["text"], side["image"])["input_ids"])
    with pytest.raises(UserError, match=r"60 of 60 rows have no judge scores.*--judge_from"):
        read_rows(tmp_path, toy["train"], toy["images"], K, judged=True)  # the toy's own rows were never judged


def test_unime_v2_training_runs_on_the_judged_rows_and_evaluates(toy, judged, tmp_path):
    out = str(tmp_path / "unime")
    command = [sys.executable, "train.py", "config/shapes_stage1.py", "config/shapes_unime_v2.py",
               f"--init_from={toy['tiny']}",
               f"--train_data={judged['out']}", f"--image_dir={toy['images']}", f"--out_dir={out}", "--max_iters=2",
               "--batch_size=8", f"--num_hard_negatives={K}", "--log_interval=1", "--num_workers=0",
               f"--max_pixels={MAX_PIXELS}", "--checkpoint_interval=2", f"--table_dir={tmp_path / 'tables'}"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    records = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    assert len(records) == 2 and all(r["alignment"] > 0 for r in records)  # eq. (U3) is in the loss
    assert all(r["loss"] == pytest.approx(r["infonce"] + r["alignment"]) for r in records)  # eq. (U4), lambda 1
    import eval as evaluation
    evaluated = evaluation.main(["config/shapes_eval.py", f"--init_from={out}/export", f"--image_dir={toy['images']}",
                                 f"--mmeb_dir={toy['root'] / 'shapes' / 'eval'}", f"--out={tmp_path / 'unime.json'}",
                                 "--datasets=['Shapes-CLS', 'Shapes-T2I']", "--geometry=False", "--num_workers=0",
                                 "--v2_dir="])
    assert 0 <= evaluated["overall"] <= 100 and evaluated["similarity"] == "cos"  # UniME-V2 ranks by cosine


def test_the_docs_state_the_prompt_the_judge_asks():
    page = open(os.path.join(ROOT, "docs", "hard_negatives.md")).read()  # the README's link for UniME-V2
    assert judging.JudgePrompt.PROMPT in page and "docs/hard_negatives.md" in open(os.path.join(ROOT, "README.md")).read()

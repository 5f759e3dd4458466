"""
Tests of the reranker (rerank.py) and what uses it: its scores against log P(yes) - log P(no) computed here with
plain transformers (one image a side, two, none) on each backbone family, batch-invariant with videos; the pairs' collate; eval.py's
rescoring of an embedder's top K against a stub; then on the toy, a reranker trained by train.py, exported, loaded
back three ways, reranking an evaluation and distilled into rows that soft_labels="judge" reads.

    python -m pytest -q tests/test_rerank.py
"""
import ast
import functools
import json
import math
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import eval as evaluation
import rerank
from common import UserError
from model import FAMILIES, Embedder, family_of
from runs.reranker import load_reranker
from shapes.prepare import prepare
from tests.toyrun import run_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "Judge whether the Document meets the requirements of the Query."


def picture(path, seed, size=(64, 64)):
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_reranker(tiny_checkpoint):
    return rerank.Reranker.of(Embedder.from_pretrained(tiny_checkpoint, system_prompt=SYSTEM), tiny_checkpoint).eval()


@functools.lru_cache(maxsize=None)
def plain_transformers(path):
    """The tokenizer, image processor and generative model (with its LM head) of a folder, as transformers loads them."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    family = family_of(path)
    generator = getattr(transformers, family.model_class.replace("Model", "ForConditionalGeneration"))
    return (getattr(transformers, family.tokenizer_class).from_pretrained(path),
            Qwen2VLImageProcessorPil.from_pretrained(path), generator.from_pretrained(path).eval())


def plain_score(path, query, candidate):
    """log P(yes) - log P(no) at the prompt's end, with plain transformers: the prompt of rerank.py's docstring as one
    string, the image processor's own pixels and transformers' own rotary positions (no position_ids given)."""
    tokenizer, processor, model = plain_transformers(path)
    texts, pixels, grids = [], [], []
    for item in (query, candidate):
        vision = ""
        if item.get("image"):
            inputs = processor(images=[Image.open(item["image"]).convert("RGB")], return_tensors="pt")
            pixels.append(inputs["pixel_values"])
            grids.append(inputs["image_grid_thw"])
            vision = "<|vision_start|>" + "<|image_pad|>" * (int(inputs["image_grid_thw"].prod()) // 4) + "<|vision_end|>"
        texts.append(vision + item["text"])
    prompt = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Query>:\n{texts[0]}\n<Document>:\n{texts[1]}"
              "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                       mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int(),
                       pixel_values=torch.cat(pixels) if pixels else None,
                       image_grid_thw=torch.cat(grids) if grids else None).logits[0, -1].double()
    yes, no = (tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in ("yes", "no"))
    return (logits[yes] - logits[no]).item()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scores_are_the_log_odds_plain_transformers_computes(family, tiny_checkpoints, tmp_path):
    path = tiny_checkpoints[family]
    tiny_reranker = rerank.Reranker.of(Embedder.from_pretrained(path, system_prompt=SYSTEM), path).eval()
    red, blue = picture(tmp_path / "red.png", 0), picture(tmp_path / "blue.png", 1, (96, 64))
    pairs = [({"text": "a red circle"}, {"text": "a blue square"}),
             ({"text": "Find the caption of this picture.", "image": red}, {"text": "a red circle"}),
             ({"text": "a red circle"}, {"text": "", "image": blue}),
             ({"text": "The same scene?", "image": red}, {"text": "a scene", "image": blue})]  # two images, one prompt
    scores = tiny_reranker.score(pairs, batch_size=3)  # batched, padded, in length order
    expected = [plain_score(path, *pair) for pair in pairs]
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)
    assert len(set(round(s, 3) for s in expected)) == 4  # the pairs differ: a wrong side or position would show


def test_a_video_and_an_image_in_one_prompt_score_alike_alone_and_batched(tiny_reranker, tmp_path):
    frames = [picture(tmp_path / f"frame{k}.png", 10 + k) for k in range(4)]
    red = picture(tmp_path / "red.png", 0)
    video_pair = ({"text": "<|video_1|> What happens?", "video": frames}, {"text": "a scene", "image": red})
    feature = tiny_reranker.prompt(*video_pair)
    assert feature["pixel_values_videos"] is not None and feature["image_grid_thw"].shape == (1, 3)
    alone = tiny_reranker.score([video_pair])
    batched = tiny_reranker.score([video_pair, ({"text": "short"}, {"text": "text"}),
                                   ({"text": "x"}, {"text": "an image", "image": red})], batch_size=3)
    assert torch.isfinite(alone).all() and batched[0].item() == pytest.approx(alone.item(), abs=1e-4)


def test_collate_pairs_points_each_row_to_its_own_prompts(preprocessor):
    items = []
    for i, lengths in enumerate([(9, 3, 5), (4, 12, 7), (6, 6, 2)]):  # row i's positive, then 2 negatives
        items.append({"pairs": [{"input_ids": torch.full((n,), 100 * i + k), "position_ids": torch.zeros(3, n, dtype=torch.long)}
                                for k, n in enumerate(lengths)], "row": 40 + i, "skipped": []})
    batch = rerank.collate_pairs(preprocessor, max_items=4)(items)
    flat = [row for chunk in batch["candidate"] for row in chunk["input_ids"]]  # every prompt, in the chunks' order
    assert batch["query"] == [] and batch["pairs"].shape == (3, 3) and len(batch["candidate"]) > 1
    for i in range(3):
        for k in range(3):
            assert flat[batch["pairs"][i, k]][0].item() == 100 * i + k
    assert batch["rows"].tolist() == [40, 41, 42]


class Stub:
    """A reranker that scores a pair by a table: rerank.rescore_top's tests."""

    def __init__(self, table):
        self.table, self.asked = table, []

    def score(self, pairs, batch_size, num_workers, label=""):
        self.asked += pairs
        return torch.tensor([self.table[(q, c)] for q, c in pairs], dtype=torch.float64)


def test_rescore_top_reranks_the_embedders_best_and_keeps_the_rest_below():
    # three queries, four candidates (the gold at 0); the embedder's scores, and the reranker's of each pair
    scores = torch.tensor([[0.5, 0.9, 0.1, 0.2],   # gold second: the reranker lifts it
                           [0.1, 0.9, 0.8, 0.7],   # gold last: outside the top 2, a miss after
                           [0.9, 0.2, -math.inf, 0.1]])  # gold first; a missing candidate stays missing
    table = {(q, c): float(q == 0 and c == 0) * 5 + (q == 2 and c == 1) * 9 for q in range(3) for c in range(4)}
    stub = Stub(table)
    reranked, in_top, cost = rerank.rescore_top(stub, lambda q, k: (q, k), scores, 2, block=2)  # rows 0-1, then 2
    assert sorted(stub.asked) == [(0, 0), (0, 1), (1, 1), (1, 2), (2, 0), (2, 1)]  # each row's top 2, once
    assert in_top.sum() == 6 and cost["top"] == 2 and cost["pairs"] == 6
    assert evaluation.precision_at_1(reranked)[0] == 1  # row 0 a hit; row 1 never saw its gold; row 2 lost it to 1
    assert reranked[0, 0] > reranked[0, 1] and reranked[2, 1] > reranked[2, 0] > reranked[2, 3]
    assert reranked[1, 0] < reranked[1, 3] < reranked[1, [1, 2]].min()  # the rest below, in the embedder's order
    assert reranked[2, 2] == -math.inf
    stub.table[(1, 2)] = math.nan
    with pytest.raises(UserError, match="non-finite score for 1 of 4 pairs, e.g. row 1's candidate 2"):
        rerank.rescore_top(stub, lambda q, k: (q, k), scores, 2, block=2)


def test_an_embedders_checkpoint_is_not_a_reranker(tiny_checkpoint, tmp_path):
    folder = tmp_path / "embedder"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "pace.json").write_text(json.dumps({"step": 1, "config": {"objective": "embed"}}))
    with pytest.raises(UserError, match="an embedder's checkpoint"):
        load_reranker(str(folder))


# -----------------------------------------------------------------------------
# on the toy: train, export, load, rerank an evaluation, distil

@pytest.fixture(scope="module")
def toy(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("rerank")
    paths = prepare(str(root / "shapes"), seed=0, num_train=60, num_eval=10)
    return {"root": str(root), "checkpoint": tiny_checkpoint, "train": paths["train"], "images": paths["images"],
            "eval": paths["eval"]}


@pytest.fixture(scope="module")
def trained(toy):
    out = os.path.join(toy["root"], "reranker")
    log = run_train(toy, out, "--objective='rerank'", "--temperature=1.0", "--max_iters=2", "--checkpoint_interval=2",
                    f"--system_prompt={SYSTEM!r}", "--skip_bad_rows=False")
    return {"out": out, "log": log}


@pytest.mark.slow
def test_a_trained_reranker_exports_and_loads_back_the_same_scores(toy, trained, tmp_path):
    log, export = trained["log"], os.path.join(trained["out"], "export")
    assert [r["step"] for r in log] == [1, 2] and "pos_score" in log[0] and "query_norm" not in log[0]
    assert all(math.isfinite(r["loss"]) for r in log)
    files = set(os.listdir(export))
    assert {"model.safetensors", "embedding_spec.json", "README.md", "pace.json"} <= files
    assert not {"chat_template.jinja", "modules.json"} & files  # no embedding template, no sentence-transformers
    card = open(os.path.join(export, "README.md")).read()
    assert "multimodal reranker" in card and SYSTEM in card and "load_reranker" in card
    red = picture(tmp_path / "red.png", 0)
    pairs = [({"text": "a red circle"}, {"text": "a blue square"}), ({"text": "which?", "image": red}, {"text": "red"})]
    from_export, info = load_reranker(export)
    from_step, _ = load_reranker(os.path.join(trained["out"], "step_000002"))
    assert info["config"]["objective"] == "rerank"
    assert from_export.score(pairs).tolist() == pytest.approx(from_step.score(pairs).tolist(), abs=1e-4)  # LoRA merged
    untrained = rerank.Reranker.of(Embedder.from_pretrained(toy["checkpoint"], system_prompt=SYSTEM), toy["checkpoint"])
    assert (from_export.score(pairs) - untrained.score(pairs)).abs().max() > 1e-3  # the steps changed it
    assert from_export.score(pairs[:1]).item() == pytest.approx(plain_score(export, *pairs[0]), abs=1e-4)
    namespace = {}  # the card's plain-transformers code, run as a user would copy it
    exec(card.split("```python\n")[1].split("```")[0], namespace)  # noqa: S102
    texts = [("a red circle?", "a blue square."), ("Which shape is it?", "red")]
    expected = from_export.score([({"text": q}, {"text": d}) for q, d in texts]).tolist()
    assert [namespace["score"](q, d) for q, d in texts] == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_eval_reranks_the_embedders_top_and_reports_before_and_after(toy, trained, tmp_path, monkeypatch):
    export, out = os.path.join(trained["out"], "export"), str(tmp_path / "eval.json")
    args = [os.path.join(ROOT, "config", "shapes_eval.py"), f"--init_from={toy['checkpoint']}",
            f"--mmeb_dir={toy['eval']}", f"--image_dir={toy['images']}", "--v2_dir=", "--datasets=['Shapes-CLS']",
            f"--rerank_from={export}", "--rerank_top=3", f"--out={out}", "--max_pixels=4096", "--geometry=False",
            "--num_workers=0"]
    output = evaluation.main(args)
    result = output["datasets"]["Shapes-CLS"]
    after = result["reranked"]
    assert after["top"] == 3 and after["pairs"] == 3 * result["num_queries"]
    # P@1 after, recomputed: the reranker's best of the embedder's top 3 is the gold, strictly
    from readers.evaluation import read_eval_dataset
    rows, _ = read_eval_dataset(os.path.join(toy["eval"], "Shapes-CLS"), toy["images"], False, "paper", False)
    embedder = load_reranker(export)[0]
    hits = 0
    base = Embedder.from_pretrained(toy["checkpoint"], max_pixels=4096).eval()
    for row in rows:
        vectors = base.encode([row["query"]] + row["candidates"])
        sims = torch.nn.functional.cosine_similarity(vectors[:1], vectors[1:])
        top = sims.topk(3).indices.tolist()
        got = embedder.score([(row["query"], row["candidates"][k]) for k in top])
        best = got.argmax().item()
        hits += top[best] == 0 and (got < got[best]).sum() == 2
    assert after["precision_at_1"] == pytest.approx(100.0 * hits / len(rows))
    assert output["reranked"]["mean_precision_at_1_after"] == pytest.approx(after["precision_at_1"])
    assert output["reranked"]["mean_precision_at_1_before"] == pytest.approx(result["precision_at_1"])

    def never(*args, **kwargs):
        raise AssertionError("a kept dataset was reranked again")
    monkeypatch.setattr(rerank.Reranker, "score", never)  # a rerun reads the finished dataset back
    assert evaluation.main(args)["datasets"]["Shapes-CLS"]["reranked"] == after
    with pytest.raises(AssertionError, match="reranked again"):  # another top K is another result
        evaluation.main([a.replace("--rerank_top=3", "--rerank_top=2") for a in args])


@pytest.mark.slow
def test_distill_writes_the_rerankers_scores_where_soft_labels_judge_reads_them(toy, trained, tmp_path):
    from readers import training
    from tools import distill
    export, out = os.path.join(trained["out"], "export"), str(tmp_path / "scored")
    distill.main([f"--rerank_from={export}", f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}",
                  f"--table_dir={tmp_path / 'tables'}", f"--out={out}", "--num_hard_negatives=2", "--chunk_rows=25",
                  "--num_workers=0", "--max_pixels=4096", "--threads=1"])
    assert len(os.listdir(out + ".scores")) == 3  # 60 rows in chunks of 25, each kept for a rerun
    records = pq.read_table(os.path.join(out, "train", "train.parquet")).to_pylist()
    assert len(records) == 60
    reranker = load_reranker(export, max_pixels=4096)[0]
    side = lambda text, image: {"text": text, "image": os.path.join(toy["images"], image) if image else None}  # noqa: E731
    for record in records[:3]:
        query = side(record["qry"], record["qry_image_path"])
        candidates = [side(record["pos_text"], record["pos_image_path"])] + [
            side(t, i) for t, i in zip(ast.literal_eval(record["neg_text"]), ast.literal_eval(record["neg_image_path"]))]
        expected = reranker.score([(query, c) for c in candidates]).tolist()
        assert [record["pos_judge"]] + ast.literal_eval(record["neg_judge"]) == pytest.approx(expected, abs=1e-5)
    table = training.checked_table([out], toy["images"], str(tmp_path / "tables"), 2, judged=True)
    assert table.row(0)["judge"] == pytest.approx([records[0]["pos_judge"]] + ast.literal_eval(records[0]["neg_judge"]))


def test_gradcache_gives_the_plain_steps_gradients_for_a_reranker(tiny_checkpoint, tmp_path):
    """train_step.forward_backward on a batch of pairs (rerank.collate_pairs): one graph over one chunk, and GradCache
    over chunks of 2 prompts, give the same loss (eq. R2) and the same gradients."""
    import train_step
    reranker = rerank.Reranker.of(Embedder.from_pretrained(tiny_checkpoint, system_prompt=SYSTEM), tiny_checkpoint)
    reranker.model.language_model.requires_grad_(True)
    red = picture(tmp_path / "red.png", 0)
    rows = [({"text": "a red circle"}, [{"text": "red circle"}, {"text": "blue square"}, {"text": "", "image": red}]),
            ({"text": "which picture?", "image": red}, [{"text": "this one"}, {"text": "no"}, {"text": "a dog"}])]
    items = [{"pairs": [reranker.prompt(query, c) for c in candidates], "row": i, "skipped": []}
             for i, (query, candidates) in enumerate(rows)]
    results = []
    for chunk in (0, 2):
        batch = rerank.collate_pairs(reranker.preprocessor, max_items=chunk or None)(items)
        assert len(batch["candidate"]) == (3 if chunk else 1)
        terms = train_step.forward_backward(reranker, batch, {"temperature": 1.0}, grad_cache_chunk=chunk)
        grads = [p.grad.clone() for p in reranker.parameters() if p.grad is not None]
        reranker.zero_grad(set_to_none=True)
        results.append((terms.loss.item(), grads))
    (plain_loss, plain), (cached_loss, cached) = results
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5) and len(plain) == len(cached) > 10
    assert max((a - b).abs().max().item() for a, b in zip(plain, cached)) < 1e-5
    assert max(g.abs().max().item() for g in plain) > 1e-4  # a gradient flowed


def test_the_prompts_ids_are_the_whole_strings_where_qwens_split_joins_a_stop_and_a_newline(tiny_checkpoint, tmp_path):
    """Qwen's pre-tokenizer keeps "?" or "." and the newline after it in one piece, and a real vocabulary merges them:
    the query's last text is tokenised with the template's newline, so the ids are the whole prompt string's. The
    tiny vocabulary gets those two merges here (it has none), so that a split at the wrong place shows."""
    from model import Preprocessor
    folder = tmp_path / "merges"
    shutil.copytree(tiny_checkpoint, folder)
    definition = json.loads((folder / "tokenizer.json").read_text())
    vocab, first_new = definition["model"]["vocab"], 1 + max(t["id"] for t in definition["added_tokens"])
    for k, stop in enumerate("?."):
        vocab[stop + "Ċ"] = first_new + k  # after the added tokens' ids
        definition["model"]["merges"].append([stop, "Ċ"])
    (folder / "tokenizer.json").write_text(json.dumps(definition))
    preprocessor = Preprocessor.from_pretrained(str(folder), system_prompt=SYSTEM)
    prompt = rerank.PairPrompt(preprocessor, *rerank.template(SYSTEM))
    head, middle, tail = rerank.template(SYSTEM)
    for query, candidate in [("What happens?", "a red circle."), ("Find the caption.", "no?"), ("a b", "c")]:
        whole = preprocessor.tokenizer(head + query + middle + candidate + tail, add_special_tokens=False)["input_ids"]
        assert prompt({"text": query}, {"text": candidate})["input_ids"].tolist() == whole, query
    assert first_new in prompt({"text": "What happens?"}, {"text": "x"})["input_ids"].tolist()  # the merge is used

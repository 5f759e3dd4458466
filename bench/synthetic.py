"""
bench/synthetic.py: what bench.py measures on, built apart from the measuring: where there is no real data or
checkpoint, random Qwen3.5 models in the released shapes, a length mix shaped like MMEB-train and JPEG files; the two
stages' models; a one-rank torchrun environment; the toy data loaded; the batches under the cuts it compares
(bench/startup.py builds the start-up figures' downloads).

    rows = mix_rows(random.Random(0), 32, num_negatives=5, max_pixels=1605632)   # lengths and image sizes
    item = mix_item(rows, preprocessor, seed=0, i=0)                             # row 0 as a TrainDataset item
    embedder = random_embedder("qwen3.5-0.8b", preprocessor, torch.device("cuda"))
    batch = collate(preprocessor, items, 32, CUTS["sorted, equal chunks"])      # collate_train under the simple rule
    python -m bench.bench --shape=qwen3.5-0.8b                                   # what measures on them
"""
import contextlib
import copy
import functools
import io
import json
import math
import os
import random
import socket
import sys

import numpy as np
import torch
from PIL import Image

import common
import data
import lora
from media import VIDEO_MARKER, smart_resize
from model import Embedder
from readers import training
from readers.evaluation import find_eval_datasets, read_eval_dataset

# Qwen3.5-0.8B-Base and Qwen3.5-2B-Base as released (model type qwen3_5), read off public copies of the release
# config.json files (third-party code and model cards; at least two agree on each value), not the files themselves.
SHAPES = {
    "qwen3.5-0.8b": dict(text=dict(hidden_size=1024, intermediate_size=3584), vision=dict(
        depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024)),
    "qwen3.5-2b": dict(text=dict(hidden_size=2048, intermediate_size=6144), vision=dict(
        depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048))}
SHARED_TEXT = dict(  # both sizes: 24 layers, 3 Gated DeltaNet : 1 full attention, tied 248,320-token embedding
    vocab_size=248320, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
    max_position_embeddings=262144, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                         mrope_interleaved=True))
SHARED_VISION = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304)
MIN_PIXELS = 65536  # the Qwen3-VL / Qwen3.5 release image processors' shortest_edge

# A synthetic length mix shaped like MMEB-train (the paper trains on MMEB-style data): per task family its share of rows, and for the query and
# for every candidate (positive and negatives alike) a text length range in tokens and an image kind. 'full' images:
# log-uniform areas from 224^2 to max_pixels (photos, charts, documents); 'crop' images (grounding candidates) from
# 56^2 to 224^2, which the resize raises to MIN_PIXELS.
MMEB_MIX = [  # (task family, share, (query tokens, query image), (candidate tokens, candidate image))
    ("classification", 0.25, ((10, 30), "full"), ((1, 6), None)),  # ImageNet-1K, N24News, VOC2007, SUN397 ...
    ("vqa", 0.25, ((15, 50), "full"), ((1, 10), None)),  # OK-VQA, DocVQA, ChartQA, InfographicsVQA ...
    ("text to image", 0.15, ((15, 45), None), ((5, 8), "full")),  # MSCOCO_t2i, VisualNews_t2i, CIRR ...
    ("image to text", 0.15, ((10, 15), "full"), ((10, 60), None)),  # MSCOCO_i2t, VisualNews_i2t
    ("documents", 0.10, ((10, 40), None), ((150, 1500), None)),  # WebQA, VisDial-like long texts
    ("grounding", 0.10, ((10, 20), "full"), ((8, 12), "crop")),  # MSCOCO grounding
]
TEMPLATE_TOKENS = 20  # the embedding prompt around the content (model.py), in Qwen's tokenizer
WORDS = "the a red green blue small large image shows photo of on in at left right question answer caption".split()


def mix_rows(rng, num_rows, num_negatives, max_pixels):
    """Rows of MMEB_MIX: {"task", "query", "candidates": [positive, negatives]}; a side is
    (text tokens, (height, width) or None)."""
    areas = {"full": (224 * 224, max_pixels), "crop": (56 * 56, 224 * 224)}
    log_uniform = lambda low, high: math.exp(rng.uniform(math.log(low), math.log(high)))  # noqa: E731

    def side(spec):
        (low, high), image = spec
        size = None
        if image:
            area, aspect = log_uniform(*areas[image]), log_uniform(0.5, 2.0)
            size = (max(16, round(math.sqrt(area * aspect))), max(16, round(math.sqrt(area / aspect))))
        return min(high, int(log_uniform(low, high + 1))), size

    def row(task, share, query, candidate):  # the candidates are drawn first, then the query
        return {"task": task, "candidates": [side(candidate) for _ in range(1 + num_negatives)], "query": side(query)}

    return [row(*rng.choices(MMEB_MIX, weights=[mix[1] for mix in MMEB_MIX])[0]) for _ in range(num_rows)]


def side_tokens(side, max_pixels):
    """Sequence length of a synthetic side in Qwen's tokenizer: template, text, and the image's merged patches
    between <|vision_start|> and <|vision_end|> (smart_resize, factor 32)."""
    text_tokens, size = side
    if size is None:
        return TEMPLATE_TOKENS + text_tokens
    height, width = smart_resize(size[0], size[1], 32, MIN_PIXELS, max_pixels)
    return TEMPLATE_TOKENS + text_tokens + height * width // 32**2 + 2


def side_item(rng, side, jpegs=()):
    """A synthetic side as an Embedder item: words (about a token each in the tiny tokenizer) and, if it has one,
    an image: one of the JPEG files `jpegs`, else a plain in-memory image of its size."""
    text_tokens, size = side
    image = (rng.choice(jpegs) if jpegs else Image.new("RGB", (size[1], size[0]),
                                                       tuple(rng.randrange(256) for _ in range(3)))) if size else None
    return {"text": " ".join(rng.choice(WORDS) for _ in range(max(1, text_tokens))), "image": image}


def mix_item(rows, preprocessor, seed, i, prompt=None):
    """Synthetic row i as a TrainDataset item (model inputs), the same for a seed wherever it is made; with prompt
    (a reranker's rerank.PairPrompt), the same sides as a PairDataset item: the query with each candidate."""
    rng, row = random.Random(f"{seed}/{i}"), rows[i]
    sides = [side_item(rng, side) for side in [row["query"]] + row["candidates"]]  # drawn in this order either way
    if prompt is not None:
        return {"pairs": [prompt(sides[0], side) for side in sides[1:]], "row": i, "skipped": []}
    return {"query": preprocessor(**sides[0]), "candidates": [preprocessor(**side) for side in sides[1:]], "row": i,
            "skipped": []}


def mix_items(preprocessor, count, num_negatives, max_pixels, seed, num_workers, prompt=None):
    """`count` rows of the mix as TrainDataset items (with prompt, PairDataset items), made in num_workers workers."""
    rows = mix_rows(random.Random(seed), count, num_negatives, max_pixels)
    return list(torch.utils.data.DataLoader(range(count), batch_size=None, num_workers=num_workers,
                                            collate_fn=functools.partial(mix_item, rows, preprocessor, seed,
                                                                         prompt=prompt)))


def video_items(preprocessor, count, num_negatives, seed, frames=8, size=(224, 224)):
    """count rows as TrainDataset items shaped like LLaVA-Hound's caption retrieval (VLM2Vec-V2's video source): a
    video of `frames` in-memory frames of `size` under its prompt -> captions of 20 to 40 words."""
    rng = random.Random(f"{seed}/video")
    colour = lambda: tuple(rng.randrange(256) for _ in range(3))  # noqa: E731
    caption = lambda: preprocessor(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 40))))  # noqa: E731
    return [{"query": preprocessor(f"{VIDEO_MARKER}\nDescribe the video in detail.",
                                   video=[Image.new("RGB", size, colour()) for _ in range(frames)]),
             "candidates": [caption() for _ in range(1 + num_negatives)], "row": i, "skipped": []} for i in range(count)]


def mix_train_rows(rng, num_rows, num_negatives, max_pixels, jpegs=()):
    """Rows of the mix as data.filled gives them: {"query": side, "candidates": [positive, negatives]}, each side
    an Embedder item (side_item: a JPEG of `jpegs` or an in-memory image)."""
    side = lambda spec: side_item(rng, spec, jpegs)  # noqa: E731
    return [{"query": side(r["query"]), "candidates": [side(c) for c in r["candidates"]]}
            for r in mix_rows(rng, num_rows, num_negatives, max_pixels)]


def jpeg_dataset(folder, preprocessor, num_rows, num_negatives, max_pixels, seed):
    """Rows of the mix (mix_train_rows) whose images are 48 JPEG files written into folder, as train.py reads them:
    written in the plain layout, converted into a prepared table, read by data.TrainDataset.
    -> (the dataset, the share of items with an image)"""
    rng = random.Random(seed)
    rows = mix_train_rows(rng, num_rows, num_negatives, max_pixels, write_jpegs(folder, rng, 48))
    path = lambda side: os.path.relpath(side["image"], folder) if side["image"] else ""  # noqa: E731
    with open(os.path.join(folder, "rows.jsonl"), "w") as f:
        for row in rows:
            positive, negatives = row["candidates"][0], row["candidates"][1:]
            f.write(json.dumps({"query": row["query"]["text"], "query_image": path(row["query"]),
                                "positive": positive["text"], "positive_image": path(positive),
                                "negatives": [n["text"] for n in negatives],
                                "negative_images": [path(n) for n in negatives]}) + "\n")
    with contextlib.redirect_stdout(io.StringIO()):
        table = data.TrainTable(training.prepared_table(os.path.join(folder, "rows.jsonl"), folder,
                                                       os.path.join(folder, "tables"), instructions="dataset"))
    share = float(np.mean([s["image"] is not None for r in rows for s in [r["query"]] + r["candidates"]]))
    return data.TrainDataset(table, preprocessor, num_negatives, seed), share


def write_jpegs(folder, rng, count):
    """JPEGs of a few hundred pixels a side (256 to 768): smooth colour fields with noise, quality 90. -> paths"""
    os.makedirs(folder, exist_ok=True)
    for k in range(count):
        height, width = rng.randint(256, 768), rng.randint(256, 768)
        generator = np.random.default_rng(k)
        field = Image.fromarray(generator.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((width, height),
                                                                                                Image.BICUBIC)
        pixels = np.asarray(field, dtype=np.float32) + generator.normal(0, 12, (height, width, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(os.path.join(folder, f"{k:03d}.jpg"), quality=90)
    return [os.path.join(folder, f"{k:03d}.jpg") for k in range(count)]


# -----------------------------------------------------------------------------
# the models measured, and the process group they run in

def random_embedder(shape, preprocessor, device):
    """A randomly initialised Qwen3_5Model in a released shape (a key of SHAPES), built directly on the device
    (float32 master weights), with the tiny checkpoint's tokenizer: its ids are valid rows of the embedding."""
    from transformers import Qwen3_5Config, Qwen3_5Model
    token = preprocessor.tokenizer.convert_tokens_to_ids
    config = Qwen3_5Config(text_config=dict(SHARED_TEXT, **SHAPES[shape]["text"]),
                           vision_config=dict(SHARED_VISION, **SHAPES[shape]["vision"]),
                           image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
                           vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
                           tie_word_embeddings=True)
    with torch.device(device):
        model = Qwen3_5Model._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return Embedder(model, preprocessor)


def stage_models(embedder, lora_rank, activation_checkpointing):
    """Stage I: LoRA adapters (alpha = 2 * rank) on the language model, the only trainable parameters; Stage II: a
    copy with the adapters merged in and the whole language model trainable. Both in training mode.
    -> (Stage I, Stage II)"""
    if activation_checkpointing:
        embedder.enable_activation_checkpointing()
    lora.inject_lora(embedder.model, lora_rank, 2 * lora_rank)
    merged = copy.deepcopy(embedder)
    lora.merge_lora(merged.model)
    merged.requires_grad_(False)
    merged.model.language_model.requires_grad_(True)  # the vision tower stays frozen
    return embedder.train(), merged.train()


def one_rank_torchrun():
    """The environment of a one-rank torchrun job on a free local port, for a process started without torchrun,
    so that configurator.compute_init joins a process group (NCCL on CUDA, gloo on CPU)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")


# -----------------------------------------------------------------------------
# the toy data (data/shapes), and the lengths the padding is counted on

def toy_data(folder, checkpoint, num_negatives, seed):
    """The toy benchmark written into folder, and the tiny checkpoint at the toy config's sizes
    (config/shapes_stage1.py). -> (Embedder on the CPU, prepare's paths, the training rows as a TrainDataset)"""
    from shapes.prepare import prepare
    toy = prepare(os.path.join(folder, "shapes"), seed=seed, num_train=400)  # 10 batches of 32 for the padding
    embedder = Embedder.from_pretrained(checkpoint, max_length=512, max_pixels=128 * 128)
    with contextlib.redirect_stdout(io.StringIO()):
        table = data.TrainTable(training.prepared_table(toy["train"], toy["images"], os.path.join(folder, "tables")))
    return embedder, toy, data.TrainDataset(table, embedder.preprocessor, num_negatives, seed)


def eval_items(toy, count, num_negatives, max_pixels, seed):
    """Items to encode: with the toy data's paths, a seeded sample of `count` of the distinct (text, image) items of
    each evaluation dataset, counted as eval.distinct_items counts them; else the sides of count // (2 + K) rows
    of the mix. -> (items, references / distinct items on the toy data, else None)"""
    if not toy:
        rows = mix_train_rows(random.Random(seed + 1), count // (2 + num_negatives), num_negatives, max_pixels)
        return [side for r in rows for side in [r["query"]] + r["candidates"]], None
    items, references = [], 0
    for name in find_eval_datasets(toy["eval"])[0]:
        rows, _ = read_eval_dataset(os.path.join(toy["eval"], name), toy["images"])
        distinct = {(s["text"] or "", s["image"]): s for r in rows for s in [r["query"]] + r["candidates"]}
        items += list(distinct.values())
        references += sum(1 + len(r["candidates"]) for r in rows)  # a query and its candidates, each row
    return random.Random(seed).sample(items, min(count, len(items))), references / len(items)


def side_lengths(rows, length):
    """A batch's rows -> [query lengths, candidate lengths]: the positives, then the negatives, in collate_train's
    order. length: a side -> its tokens."""
    return [[length(r["query"]) for r in rows],
            [length(r["candidates"][0]) for r in rows] + [length(c) for r in rows for c in r["candidates"][1:]]]


def padding_batches(toy_dataset, num_negatives, max_pixels, seed):
    """Batches of 32 rows (the paper's batch a GPU) as side_lengths: 10 of the toy data as its sampler draws them
    (when toy_dataset is given), then 100 of the mix. -> {"toy": batches, "mix": batches}"""
    batches = {}
    if toy_dataset:
        sampler = iter(data.ShardedBatchSampler(len(toy_dataset), 32, seed=seed))
        batches["toy"] = [side_lengths([toy_dataset[i] for i in next(sampler)], lambda f: len(f["input_ids"]))
                          for _ in range(10)]
    mix = mix_rows(random.Random(seed), 100 * 32, num_negatives, max_pixels)
    length = functools.partial(side_tokens, max_pixels=max_pixels)
    batches["mix"] = [side_lengths(mix[i:i + 32], length) for i in range(0, len(mix), 32)]
    return batches


# -----------------------------------------------------------------------------
# batches: the two cuts

def equal_chunks(lengths, max_items, sort=True):
    """The simple rule: ceil(n / max_items) chunks of near-equal size (one chunk with max_items None), of the
    items sorted longest first, or in the batch's own order. -> list of index lists, as data.split_by_length"""
    n = len(lengths)
    order = sorted(range(n), key=lambda i: -lengths[i]) if sort else list(range(n))
    count = -(-n // max_items) if max_items else 1
    bounds = [-(-k * n // count) for k in range(count + 1)]  # ceil(k n / count): sizes differ by one at most
    return [order[a:b] for a, b in zip(bounds, bounds[1:])]


CUTS = {"batch order": functools.partial(equal_chunks, sort=False), "sorted, equal chunks": equal_chunks,
        "least padding": data.split_by_length}  # name -> cut(lengths, max_items)


def collate(preprocessor, items, max_items, cut=data.split_by_length):
    """data.collate_train's batch of these items under `cut` (CPU tensors, as train.py's DataLoader gives
    them): the same collation as training, only the cut differs."""
    return data.collate_train(preprocessor, max_items, cut)(items)


# -----------------------------------------------------------------------------
# a download in mmE5's layout, for the start-up figures


if __name__ == "__main__":  # a library: it says what it is and what runs it
    common.library_help(__doc__, sys.argv[1:])

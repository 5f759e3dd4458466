"""
bench/synthetic.py: what bench.py measures on where there is no real data or checkpoint: random Qwen3.5 models
in the released shapes, a length mix shaped like MMEB-train, and JPEG files.

    rows = mix_rows(random.Random(0), 32, num_negatives=5, max_pixels=1605632)   # lengths and image sizes
    item = mix_item(rows, preprocessor, seed=0, i=0)                             # row 0 as a TrainDataset item
    embedder = random_embedder("qwen3.5-0.8b", preprocessor, torch.device("cuda"))
"""
import math
import os
import random

import numpy as np
import torch
from PIL import Image

from model import Embedder, smart_resize

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

# A synthetic length mix shaped like MMEB-train (PACE.md): per task family its share of rows, and for the query and
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


def mix_item(rows, preprocessor, seed, i):
    """Synthetic row i as a TrainDataset item (model inputs), the same for a seed wherever it is made."""
    rng, row = random.Random(f"{seed}/{i}"), rows[i]
    feature = lambda side: preprocessor(**side_item(rng, side))  # noqa: E731
    return {"query": feature(row["query"]), "candidates": [feature(c) for c in row["candidates"]], "row": i,
            "skipped": []}


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

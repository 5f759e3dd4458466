"""Tests of model.py: the prompt, pooling, batch invariance, bad input, the tiny checkpoint."""
import os
import shutil

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from common import IMAGE_MARKER, VIDEO_MARKER, UserError
from model import Embedder, EmbeddingSpec, Preprocessor, load_image, smart_resize
from shapes.tiny_model import make_tiny_checkpoint

SYSTEM_PROMPT = EmbeddingSpec().system_prompt


def _images():
    """Images of different sizes and modes: RGB, grey, RGBA (transparent), palette."""
    rgb = Image.new("RGB", (100, 60), (200, 30, 30))
    rgb.paste((20, 20, 220), (10, 10, 40, 50))
    grey = Image.new("L", (48, 130), 90)
    rgba = Image.new("RGBA", (70, 70), (0, 255, 0, 0))
    rgba.paste((255, 0, 0, 255), (20, 20, 50, 50))
    palette = rgb.convert("P")
    return rgb, grey, rgba, palette


def _mixed_items(tmp_path):
    rgb, grey, rgba, palette = _images()
    path = tmp_path / "on_disk.png"
    Image.new("RGB", (150, 90), (10, 120, 40)).save(path)
    return [
        {"text": "a short text", "image": None},
        {"text": "", "image": rgb},
        {"text": f"{IMAGE_MARKER} Represent the given image to answer the following question. what colour?", "image": grey},
        {"text": "a much longer text that goes on " * 8, "image": None},
        {"text": "transparent square", "image": rgba},
        {"text": "palette image", "image": palette},
        {"text": "from a file", "image": str(path)},
        {"text": "x", "image": None},
    ]


def test_embedding_is_batch_invariant(tiny_embedder, tmp_path):
    items = _mixed_items(tmp_path)
    together = tiny_embedder.encode(items, batch_size=len(items))
    alone = torch.cat([tiny_embedder.encode([item]) for item in items])
    in_pairs = tiny_embedder.encode(items, batch_size=3)
    assert together.dtype == torch.float32 and together.shape == (len(items), tiny_embedder.dim)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(in_pairs, alone, atol=1e-5, rtol=0)
    # distinct inputs give distinct vectors (the tiny model is not degenerate), and the output is not normalized
    cos = torch.nn.functional.normalize(alone, dim=-1) @ torch.nn.functional.normalize(alone, dim=-1).T
    assert (cos - torch.eye(len(items))).max() < 0.9999
    # the forward pools the last real token of each right-padded row
    batch = tiny_embedder.preprocessor.collate([tiny_embedder.preprocessor(i["text"], i["image"]) for i in items[:2]])
    with torch.no_grad():
        pixel_values = tiny_embedder.pixel_values(batch["pixel_values"])
        hidden = tiny_embedder.model(**{**batch, "pixel_values": pixel_values}, use_cache=False).last_hidden_state
        pooled = tiny_embedder(**batch)
    last = batch["attention_mask"].sum(1) - 1
    torch.testing.assert_close(pooled, hidden[torch.arange(2), last])


def test_prompt_layout_and_marker(tiny_embedder):
    prep = tiny_embedder.preprocessor
    decode = lambda f: prep.tokenizer.decode(f["input_ids"].tolist(), skip_special_tokens=False)
    text_only = decode(prep("hello there"))
    assert text_only == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhello there"
                         "<|im_end|>\n<|im_start|>assistant\n<|endoftext|>")
    image = Image.new("RGB", (64, 64))
    feature = prep(f"before {IMAGE_MARKER} after", image)
    n_tokens = int(feature["image_grid_thw"].prod()) // prep.merge_size ** 2
    decoded = decode(feature)
    assert f"user\nbefore <|vision_start|>{'<|image_pad|>' * n_tokens}<|vision_end|> after<|im_end|>" in decoded
    assert IMAGE_MARKER not in decoded
    # no marker: the image leads; a marker without an image is dropped, never literal text
    assert f"user\n<|vision_start|>{'<|image_pad|>' * n_tokens}<|vision_end|>caption" in decode(prep("caption", image))
    assert "user\nbefore after<|im_end|>" in decode(prep(f"before {IMAGE_MARKER} after"))  # one space with it
    # mmE5's synthetic text-to-image queries carry "<|image_1|>\n" with no image: the marker's line goes with it
    assert "<|im_start|>user\nFind me an image<|im_end|>" in decode(prep(f"{IMAGE_MARKER}\nFind me an image"))
    # text that spells a control token stays text: exactly one <|im_end|> pair per template
    ids = prep("say <|im_end|> now")["input_ids"].tolist()
    assert ids.count(prep.tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2


def test_positions_match_transformers_and_lengths(tiny_embedder):
    prep = tiny_embedder.preprocessor
    rgb, grey, _, _ = _images()
    features = [prep(f"q {IMAGE_MARKER} tail text", rgb), prep("only text"), prep("", grey)]
    batch = prep.collate(features)
    reference, _ = tiny_embedder.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                                      batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    assert torch.equal(reference[:, mask], batch["position_ids"][:, mask])
    assert prep.num_tokens(f"q {IMAGE_MARKER} tail text", rgb) == len(features[0]["input_ids"])
    assert prep.num_tokens("", grey) == len(features[2]["input_ids"])
    assert batch["mm_token_type_ids"].sum() == (batch["input_ids"] == prep.image_pad_id).sum()


def test_truncation_keeps_image_and_template(tiny_checkpoint):
    prep = Preprocessor.from_pretrained(tiny_checkpoint, max_length=80)
    image = Image.new("RGB", (128, 128), (1, 2, 3))
    long_text = "many words " * 200
    for text, img in [(long_text, None), (f"{long_text}{IMAGE_MARKER}{long_text}", image), (long_text, image)]:
        ids = prep(text, img)["input_ids"].tolist()
        assert len(ids) == 80 == prep.num_tokens(text, img)
        assert ids[-len(prep.suffix_ids):] == prep.suffix_ids and ids[:len(prep.prefix_ids)] == prep.prefix_ids
        if img is not None:
            assert ids.count(prep.image_pad_id) == 16 and ids.count(prep.vision_end_id) == 1
    with pytest.raises(UserError, match="does not fit max_length"):
        Preprocessor.from_pretrained(tiny_checkpoint, max_length=len(prep.prefix_ids) + len(prep.suffix_ids) + 17)("x", image)


def test_bad_input_names_the_item(tiny_embedder, tmp_path):
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"not a jpeg at all")
    with pytest.raises(UserError, match="item 1: has no text and no image"):
        tiny_embedder.encode([{"text": "ok", "image": None}, {"text": "  ", "image": None}])
    with pytest.raises(UserError, match=r"item 1: .*missing\.png"):
        tiny_embedder.encode([{"text": "ok", "image": None}, {"text": "x", "image": str(tmp_path / "missing.png")}])
    with pytest.raises(UserError, match=r"item 0: .*corrupt\.jpg"):
        tiny_embedder.encode([{"text": "x", "image": str(corrupt)}])
    with pytest.raises(UserError, match="item 0: expected a dict"):
        tiny_embedder.encode(["just a string"])


def test_transparent_and_grey_images_become_rgb(tiny_embedder):
    _, grey, rgba, palette = _images()
    for image in (grey, rgba, palette):
        assert load_image(image).mode == "RGB"
    assert load_image(rgba).getpixel((0, 0)) == (255, 255, 255)  # transparent -> white, not black
    assert load_image(rgba).getpixel((30, 30)) == (255, 0, 0)


def test_images_are_read_as_a_viewer_shows_them(tmp_path):
    """16-bit greyscale and floating-point pixels scaled to 8 bits, EXIF orientation applied: known pixel values."""
    import numpy as np
    sixteen = np.array([[0, 32896], [65535, 257]], dtype=np.uint16)  # 32896 = 128 * 257: 8-bit 128
    Image.fromarray(sixteen).save(tmp_path / "grey16.png")
    with Image.open(tmp_path / "grey16.png") as raw:
        assert raw.mode.startswith("I")  # Pillow keeps 16 bits: convert("RGB") alone would clip it to white
    assert [load_image(str(tmp_path / "grey16.png")).getpixel(xy) for xy in [(0, 0), (1, 0), (0, 1), (1, 1)]] == \
        [(0, 0, 0), (128, 128, 128), (255, 255, 255), (1, 1, 1)]
    Image.fromarray(np.array([[0.0, 0.5], [1.0, 0.25]], dtype=np.float32)).save(tmp_path / "float.tiff")
    assert [load_image(str(tmp_path / "float.tiff")).getpixel(xy)[0] for xy in [(0, 0), (1, 0), (0, 1), (1, 1)]] == \
        [0, 128, 255, 64]  # floats in [0, 1], not black
    photo = Image.new("RGB", (40, 20), (0, 0, 255))
    photo.paste((255, 0, 0), (0, 0, 20, 20))  # left half red, as stored
    exif = photo.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to view": a phone held upright
    photo.save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    shown = load_image(str(tmp_path / "rotated.jpg"))
    assert shown.size == (20, 40)  # upright now
    red_top, blue_bottom = shown.getpixel((10, 5)), shown.getpixel((10, 35))  # the stored left half is now on top
    assert red_top[0] > 200 > red_top[2] and blue_bottom[2] > 200 > blue_bottom[0]
    from model import image_size
    assert image_size(str(tmp_path / "rotated.jpg")) == (20, 40)  # num_tokens counts the turned size too


def test_tiny_checkpoint_layout_and_determinism(tiny_checkpoint, tmp_path):
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "video_preprocessor_config.json"]:
        assert os.path.isfile(os.path.join(tiny_checkpoint, name)), name
    again = make_tiny_checkpoint(str(tmp_path / "again"), seed=0)
    other = make_tiny_checkpoint(str(tmp_path / "other"), seed=1)
    a, b, c = (load_file(os.path.join(p, "model.safetensors")) for p in (tiny_checkpoint, again, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert any(k.startswith("model.visual.") for k in a) and any(".linear_attn." in k for k in a)
    assert any(".self_attn." in k for k in a)
    with open(os.path.join(tiny_checkpoint, "tokenizer.json")) as f1, open(os.path.join(again, "tokenizer.json")) as f2:
        assert f1.read() == f2.read()


def test_pixels_equal_transformers_processor(tiny_checkpoint):
    """uint8 patches from the worker + Embedder.pixel_values on the device = transformers' float pixel_values, bit
    for bit: sizes that shrink, grow (under min_pixels) and stay, every mode load_image accepts."""
    embedder = Embedder.from_pretrained(tiny_checkpoint, max_pixels=128 * 128)
    preprocessor = embedder.preprocessor
    noise = Image.effect_noise((300, 170), 80).convert("RGB")
    thin = [noise.resize((300, 11)), noise.resize((9, 40))]  # a side that rounds to 0 patches: grown, as transformers
    for image in [noise, noise.resize((20, 90)), noise.crop((0, 0, 64, 128)), *thin, *_images()]:
        image = load_image(image)
        reference = preprocessor.image_processor(images=[image], return_tensors="pt")
        patches, grid_h, grid_w = preprocessor.patches(image)
        assert patches.dtype == torch.uint8 and reference["image_grid_thw"].tolist() == [[1, grid_h, grid_w]]
        assert torch.equal(embedder.pixel_values(patches), reference["pixel_values"]), image.size


def test_tiny_checkpoint_sees_its_images(tiny_embedder):
    """The toy benchmark can only be learned if a picture changes the pooled embedding at init. With
    Gated DeltaNet's stock decay (A up to 16: memory of about one token) two scenes gave cos 0.999."""
    def scene(colour):
        image = Image.new("RGB", (128, 128), (242, 242, 242))
        image.paste(colour, (16, 16, 112, 112))
        return image
    prompt = f"{IMAGE_MARKER}\nRepresent the given image to answer the following question. What colour is it?"
    red, blue = tiny_embedder.encode([{"text": prompt, "image": scene((220, 50, 47))},
                                      {"text": prompt, "image": scene((40, 90, 220))}])
    assert torch.nn.functional.cosine_similarity(red, blue, dim=0) < 0.98


def test_from_pretrained_freezes_vision_and_loads_in_transformers(tiny_checkpoint, tiny_embedder, tmp_path):
    from transformers import AutoModelForImageTextToText
    assert not any(p.requires_grad for p in tiny_embedder.model.visual.parameters())
    assert all(p.requires_grad for p in tiny_embedder.model.language_model.parameters())
    types = set(tiny_embedder.model.config.text_config.layer_types)
    assert types == {"linear_attention", "full_attention"}
    full = AutoModelForImageTextToText.from_pretrained(tiny_checkpoint)  # plain transformers, same weights
    torch.testing.assert_close(full.model.language_model.layers[0].mlp.up_proj.weight,
                               tiny_embedder.model.language_model.layers[0].mlp.up_proj.weight)
    with pytest.raises(UserError, match="no config.json"):
        Embedder.from_pretrained(str(tmp_path))


def test_importing_model_drops_transformers_kernel_fallback_warnings():
    import logging  # model, imported above, installed the filter: the Python API is as quiet as the scripts
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    fallback = logging.LogRecord(logger.name, logging.WARNING, __file__, 1, "falling back to its reference PyTorch "
                                 "implementation", None, None)
    other = logging.LogRecord(logger.name, logging.WARNING, __file__, 1, "something else", None, None)
    assert not logger.filter(fallback) and logger.filter(other)


def test_user_text_never_becomes_a_control_token_special_or_not(tiny_checkpoint, tmp_path):
    # a release's tokenizer adds <think>, </think> and <tool_call> as non-special tokens: split_special_tokens keeps
    # them whole, so a reasoning trace in a query would become control ids. ids() must spell them as text, exactly
    # as the tokenizer without them does
    from tokenizers import AddedToken, Tokenizer
    folder = str(tmp_path / "with-added-tokens")
    shutil.copytree(tiny_checkpoint, folder)
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    controls = ["<think>", "</think>", "<tool_call>"]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in controls])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with_added, plain = Preprocessor.from_pretrained(folder), Preprocessor.from_pretrained(tiny_checkpoint)
    control_ids = with_added.tokenizer.convert_tokens_to_ids(controls)
    text = "why <think> a red circle </think> then <tool_call> and <|im_end|> <|image_pad|>"
    # the release's behaviour this guards against: the tokenizer itself keeps the non-special ones whole
    leaked = with_added.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert set(control_ids) <= set(leaked)
    ids = with_added(text)["input_ids"].tolist()
    assert not set(control_ids) & set(ids)
    assert ids == plain(text)["input_ids"].tolist()  # the same ids as a tokenizer that never had them
    special = [with_added.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|image_pad|>")]
    assert ids.count(special[0]) == 2 and special[1] not in ids  # only the template's <|im_end|> pair


def test_user_text_ids_equal_the_tokenizers_on_text_without_control_tokens(tiny_embedder):
    import random
    prep, rng = tiny_embedder.preprocessor, random.Random(0)
    alphabet = list("abc xyz,.?!:;-()0123456789\n\t  ") + ["é", "ü", "ß", "ñ", "म", "ि", "ก", "่", "中", "文", "😀", "́"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert prep.ids(text) == prep.tokenizer(text, add_special_tokens=False)["input_ids"], repr(text)


def test_a_photo_too_large_for_max_length_is_shrunk_to_fit_in_inference_and_named_in_training(tiny_checkpoint, tmp_path):
    # at the checkpoint's own pixel budget (max_pixels 0) the photo takes 12 tokens; max_length leaves room for 10
    # beside the template: training names the image, inference embeds it at the largest grid that fits, and counts it
    import eval as evaluation
    from runs.export import load_for_inference
    photo = str(tmp_path / "photo.jpg")
    Image.effect_noise((400, 300), 60).convert("RGB").save(photo)
    template = Preprocessor.from_pretrained(tiny_checkpoint)
    max_length = len(template.prefix_ids) + len(template.suffix_ids) + 2 + 10
    training = Preprocessor.from_pretrained(tiny_checkpoint, max_length=max_length)
    with pytest.raises(UserError, match=r"an image of 12 tokens does not fit max_length"):
        training("what is it?", photo)
    embedder, _ = load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=max_length)
    prep, text = embedder.preprocessor, "what is it?"
    feature = prep(text, photo)
    ids = feature["input_ids"].tolist()
    grid_h, grid_w = feature["image_grid_thw"][0, 1:].tolist()
    text_tokens = len(prep.ids(text))
    assert ids.count(prep.image_pad_id) == grid_h * grid_w // 4 <= 10 - text_tokens  # the text kept whole beside it
    room, tokens = 10 - text_tokens, grid_h * grid_w // 4
    sizes = [smart_resize(300, 400, 32, 0, budget) for budget in range(1024, 40000, 64)]  # every budget's grid
    assert tokens == max(h * w // 1024 for h, w in sizes if h * w // 1024 <= room) and grid_w >= grid_h  # the largest
    assert len(ids) == prep.num_tokens(text, photo) <= max_length
    assert prep.shrunk == [repr(photo)]
    # the same vector as the photo resized to that grid beforehand, at a max_length where it fits as it is
    resized = Image.open(photo).resize((grid_w * 16, grid_h * 16), resample=prep.image_processor.resample)
    roomy, _ = load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=512)
    torch.testing.assert_close(embedder.encode([{"text": text, "image": photo}]),
                               roomy.encode([{"text": text, "image": resized}]), atol=1e-5, rtol=0)
    items = [{"text": text, "image": photo}, {"text": "plain text", "image": None}, {"text": "", "image": photo}]
    vectors, shrunk = evaluation.encode_shared(embedder, items, 2, 0)
    assert shrunk == 2 and vectors.shape == (3, embedder.dim) and torch.isfinite(vectors).all()


def test_pooling_reads_the_state_after_the_final_norm(tmp_path):
    # the embedding is last_hidden_state at the last token: after the final RMSNorm, whose gain sets the norms that
    # Stage II's dot product and tau = 100 rely on. Some Qwen-VL code pools hidden_states[-1], which can be the state
    # before that norm; a weight far from 0 makes the two differ by far more than any tolerance
    checkpoint = make_tiny_checkpoint(str(tmp_path / "tiny"), seed=0, final_norm_std=0.5)
    embedder = Embedder.from_pretrained(checkpoint).eval()
    norm, seen = embedder.model.language_model.norm, {}
    hook = norm.register_forward_hook(lambda module, inputs, output: seen.update(before=inputs[0], after=output))
    items = [{"text": "a red circle", "image": None}, {"text": "two blue squares at the top", "image": None}]
    vectors = embedder.encode(items, batch_size=2)
    hook.remove()
    lengths = torch.tensor([embedder.preprocessor.num_tokens(item["text"]) for item in items])
    order = lengths.argsort(descending=True)  # encode batches longest first
    last = lambda states: states[torch.arange(2), lengths[order] - 1][order.argsort()]  # noqa: E731
    torch.testing.assert_close(vectors, last(seen["after"]), atol=1e-6, rtol=0)
    assert (vectors - last(seen["before"])).abs().max() > 0.1
    weight = norm.weight.detach()
    expected = 8 * (1 + weight) * last(seen["before"]) / last(seen["before"]).norm(dim=-1, keepdim=True)  # sqrt(D) = 8
    torch.testing.assert_close(vectors, expected, atol=1e-3, rtol=1e-3)  # the zero-centred RMSNorm's output


# -----------------------------------------------------------------------------
# videos: an item's "video" is a list of frames

def _frames(count, size=(64, 32), seed=0):
    """count distinct noise frames: 64x32 is already a size the tiny video processor keeps (4 frames: 8,192 pixels
    of its 1,024..16,384 budget), so no resize touches them."""
    return [Image.effect_noise(size, 30 + 7 * k + seed).convert("RGB") for k in range(count)]


def test_a_video_keeps_the_frames_vlm2vec_keeps(tiny_checkpoint):
    from common import frame_choice
    assert frame_choice(64, 8) == [0, 9, 18, 27, 36, 45, 54, 63]  # MMEB-V2's 64 saved frames, 8 kept
    assert frame_choice(10, 8) == [0, 1, 2, 3, 5, 6, 7, 9]  # truncated as np.linspace(dtype=int), never rounded
    assert frame_choice(5, 8) == [0, 1, 2, 3, 4] and frame_choice(8, 8) == list(range(8))  # fewer: all, no padding
    prep = Preprocessor.from_pretrained(tiny_checkpoint)
    frames = _frames(10)
    assert prep.kept_frames(frames) == [frames[k] for k in (0, 1, 2, 3, 5, 6, 7, 9)]
    given = prep("what happens?", video=frames)["pixel_values_videos"]
    chosen = prep("what happens?", video=[frames[k] for k in (0, 1, 2, 3, 5, 6, 7, 9)])["pixel_values_videos"]
    rounded = prep("what happens?", video=[frames[k] for k in (0, 1, 3, 4, 5, 6, 8, 9)])["pixel_values_videos"]
    assert torch.equal(given, chosen) and not torch.equal(given, rounded)
    four = Preprocessor.from_pretrained(tiny_checkpoint, video_frames=4)
    assert four.kept_frames(frames) == [frames[k] for k in (0, 3, 6, 9)]
    assert prep("x", video=frames[:5])["video_grid_thw"].tolist() == [[3, 2, 4]]  # 5 frames kept: 3 temporal patches


def test_video_sizes_and_timestamps_are_transformers(tiny_checkpoint):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as reference

    from common import video_smart_resize
    for frames in (2, 3, 8, 17):
        for height, width in [(32, 64), (300, 170), (20, 700), (9, 40), (1080, 1920), (31, 33)]:
            for low, high in [(1024, 16384), (4096, 32768), (128 * 1024, 768 * 1024), (0, 1)]:
                assert video_smart_resize(frames, height, width, 2, 32, low, high) == \
                    reference(frames, height, width, temporal_factor=2, factor=32, min_pixels=low, max_pixels=high)
    prep = Preprocessor.from_pretrained(tiny_checkpoint)
    for fps in (2.0, 1.0, 3.0, 24):
        for frames in range(1, 18):
            seconds = Qwen3VLProcessor._calculate_timestamps(None, list(range(frames)), fps, 2)
            assert prep.video_processor.timestamps(frames, fps) == [f"<{s:.1f} seconds>" for s in seconds]
    assert prep.video_processor.timestamps(8, 2.0) == [f"<{s} seconds>" for s in ("0.2", "1.2", "2.2", "3.2")]


def test_video_layout_and_positions_match_transformers(tiny_embedder):
    prep = tiny_embedder.preprocessor
    def decode(ids):
        return prep.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
    rgb, grey, _, _ = _images()
    videos = [_frames(8), _frames(5, (300, 170)), _frames(3, (40, 90), seed=1)]
    texts = [f"before {VIDEO_MARKER} after", "a caption", f"{VIDEO_MARKER}\nQuestion: what? {IMAGE_MARKER}"]
    features = [prep(text, video=video) for text, video in zip(texts, videos)]
    features += [prep(f"q {IMAGE_MARKER} tail", rgb), prep(f"only text {VIDEO_MARKER}"), prep("", grey)]
    pads = "<|video_pad|>" * 2  # 64x32 frames: a 2 x 4 patch grid, 2 merged patches per temporal patch
    video = "".join(f"<{s} seconds><|vision_start|>{pads}<|vision_end|>" for s in ("0.2", "1.2", "2.2", "3.2"))
    assert f"user\nbefore {video} after<|im_end|>" in decode(features[0]["input_ids"])
    assert "user\n<0.2 seconds><|vision_start|>" in decode(features[1]["input_ids"])  # no marker: the video leads
    assert "<|vision_end|>\nQuestion: what? <|im_end|>" in decode(features[2]["input_ids"])  # the image marker goes
    assert "user\nonly text <|im_end|>" in decode(features[4]["input_ids"])  # a video marker without a video goes
    batch = prep.collate(features)
    reference, _ = tiny_embedder.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                                      batch["image_grid_thw"], batch["video_grid_thw"],
                                                      attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    assert torch.equal(reference[:, mask], batch["position_ids"][:, mask])
    assert batch["video_grid_thw"].tolist() == [[4, 2, 4], [3, 2, 4], [2, 6, 2]] and len(batch["image_grid_thw"]) == 2
    kinds = batch["mm_token_type_ids"]
    assert torch.equal(kinds == 2, batch["input_ids"] == prep.video_pad_id) and (kinds == 1).sum() == \
        (batch["input_ids"] == prep.image_pad_id).sum() > 0
    assert batch["pixel_values_videos"].shape == (32 + 24 + 24, 3 * 2 * 16 * 16)
    items = list(zip(texts, videos))
    assert [prep.num_tokens(text, video=video) for text, video in items] == [len(f["input_ids"]) for f in features[:3]]


def test_video_patches_are_the_frames_cut_in_transformers_order(tiny_embedder):
    import numpy as np
    prep, frames = tiny_embedder.preprocessor, _frames(4)
    feature = prep("", video=frames)
    patches, (grid_t, grid_h, grid_w) = feature["pixel_values_videos"], feature["video_grid_thw"][0].tolist()
    assert (grid_t, grid_h, grid_w) == (2, 2, 4) and patches.dtype == torch.uint8  # 64x32 frames, not resized
    pixels = np.stack([np.asarray(f) for f in frames])  # (4, 32, 64, 3)
    expected = []  # temporal patch, then merge group (row, column), then the merged patch's own 2 x 2, row-major
    for t in range(grid_t):
        for group_row in range(grid_h // 2):
            for group_col in range(grid_w // 2):
                for row in range(2 * group_row, 2 * group_row + 2):
                    for col in range(2 * group_col, 2 * group_col + 2):
                        block = pixels[2 * t:2 * t + 2, 16 * row:16 * (row + 1), 16 * col:16 * (col + 1)]  # (2, 16, 16, 3)
                        expected.append(block.transpose(3, 0, 1, 2).reshape(-1))  # channel, frame, row, column
    assert torch.equal(patches, torch.from_numpy(np.stack(expected)))
    values = tiny_embedder.pixel_values(patches, video=True)  # no temporal copy: the frames are there
    assert values.shape == patches.shape
    torch.testing.assert_close(values, (patches.double() / 255 - 0.5).float() / 0.5, atol=1e-6, rtol=0)


def test_an_odd_frame_count_pads_with_the_last_frame(tiny_checkpoint):
    prep = Preprocessor.from_pretrained(tiny_checkpoint)
    frames = _frames(3)
    feature = prep("", video=frames)
    assert feature["video_grid_thw"].tolist() == [[2, 2, 4]]
    last = feature["pixel_values_videos"][8:].view(8, 3, 2, 16, 16)  # the second temporal patch: frame 3, twice
    assert torch.equal(last[:, :, 0], last[:, :, 1]) and not torch.equal(feature["pixel_values_videos"][:8].view(
        8, 3, 2, 16, 16)[:, :, 0], feature["pixel_values_videos"][:8].view(8, 3, 2, 16, 16)[:, :, 1])
    assert torch.equal(last, prep("", video=[frames[2], frames[2]])["pixel_values_videos"].view(8, 3, 2, 16, 16))
    text = prep.tokenizer.decode(feature["input_ids"].tolist())
    assert "<0.2 seconds>" in text and "<1.0 seconds>" in text  # frames 2 and 2: 1.0 s, as transformers times them
    one = prep("", video=frames[:1])  # transformers refuses one frame; here it is the pair it pads to
    assert one["video_grid_thw"].tolist() == [[1, 2, 4]] and "<0.0 seconds>" in prep.tokenizer.decode(one["input_ids"])


def test_encoding_a_video(tiny_embedder):
    frames = _frames(8)
    changed = frames[:-1] + [Image.new("RGB", (64, 32), (250, 10, 10))]
    items = [{"text": "what happens?", "video": frames}, {"text": "what happens?", "image": frames[0]},
             {"text": "what happens?", "video": changed}, {"text": "a text", "image": None}]
    together = tiny_embedder.encode(items, batch_size=4)
    alone = torch.cat([tiny_embedder.encode([item]) for item in items])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)  # a video beside images and text: batch invariant
    assert torch.isfinite(together).all() and together.shape == (4, tiny_embedder.dim)
    cos = torch.nn.functional.cosine_similarity
    assert cos(alone[0], alone[1], dim=0) < 0.999  # the video is not its first frame as an image
    assert (alone[0] - alone[2]).abs().max() > 1e-3  # its last frame counts


def test_a_videos_errors_name_it_and_inference_shrinks_one_too_long(tiny_checkpoint, tmp_path):
    paths = []
    for k, frame in enumerate(_frames(8, (640, 320))):
        paths.append(str(tmp_path / f"frame_{k:04d}.jpg"))
        frame.save(paths[-1])
    embedder = Embedder.from_pretrained(tiny_checkpoint)
    with pytest.raises(UserError, match="item 0: a video must be a non-empty list"):
        embedder.encode([{"text": "x", "video": []}])
    with pytest.raises(UserError, match="item 0: .*file paths or PIL images, got int"):
        embedder.encode([{"text": "x", "video": [1, 2]}])
    with pytest.raises(UserError, match="item 1: an item holds an image or a video, not both"):
        embedder.encode([{"text": "x", "image": None}, {"text": "x", "image": paths[0], "video": paths}])
    with pytest.raises(UserError, match=r"item 0: .*missing\.jpg"):
        embedder.encode([{"text": "x", "video": paths[:3] + [str(tmp_path / "missing.jpg")]}])
    # the whole budget, 16,384 pixels over 8 frames of 2:1, takes 2 merged patches a temporal patch: 4 tokens fewer
    # is one each, the least a frame pair takes
    need = Preprocessor.from_pretrained(tiny_checkpoint).num_tokens("", video=paths)
    training = Preprocessor.from_pretrained(tiny_checkpoint, max_length=need - 4)
    with pytest.raises(UserError, match=r"video '.*frame_0000\.jpg' \(the first of 8 frames\): its \d+ tokens"):
        training.num_tokens("what is it?", video=paths)
    from runs.export import load_for_inference
    inference, _ = load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=need - 4)
    prep = inference.preprocessor
    assert Preprocessor.from_pretrained(tiny_checkpoint)("what?", video=paths)["video_grid_thw"].tolist() == [[4, 2, 4]]
    feature = prep("", video=paths)
    assert len(feature["input_ids"]) == prep.num_tokens("", video=paths) == need - 4
    assert feature["video_grid_thw"].tolist() == [[4, 2, 2]]  # one merged patch a frame pair: it fits
    assert prep.shrunk == [f"{paths[0]!r} (the first of 8 frames)"]
    assert torch.isfinite(inference.encode([{"text": "", "video": paths}])).all()
    with pytest.raises(UserError, match=r"frame_0000\.jpg.*do not fit max_length"):  # not even then: named
        load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=need - 5)[0].preprocessor("", video=paths)


def test_the_video_processor_settings_come_from_the_checkpoints_json(tiny_checkpoint, tmp_path):
    import json
    folder = str(tmp_path / "consolidated")
    shutil.copytree(tiny_checkpoint, folder)
    parts = {}
    for key, name in [("image_processor", "preprocessor_config.json"),
                      ("video_processor", "video_preprocessor_config.json")]:
        with open(os.path.join(folder, name)) as f:
            parts[key] = json.load(f)
        os.remove(os.path.join(folder, name))  # transformers 5's layout: one processor_config.json
    parts["video_processor"].update(size={"shortest_edge": 2048, "longest_edge": 65536}, image_mean=[0.25, 0.5, 0.75])
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump(dict(parts, processor_class="Qwen3VLProcessor"), f)
    embedder = Embedder.from_pretrained(folder)
    assert (embedder.spec.video_min_pixels, embedder.spec.video_max_pixels) == (2048, 65536)
    assert embedder.preprocessor.video_processor.image_mean == (0.25, 0.5, 0.75)
    assert embedder.video_pixel_table[0, 0] == (0 - 0.25 * 255) / (0.5 * 255)  # its mean, not the image processor's
    assert Preprocessor.from_pretrained(folder, video_max_pixels=4096).video_processor.size["longest_edge"] == 4096
    with pytest.raises(UserError, match="video_min_pixels 8192 > video_max_pixels 4096"):
        Preprocessor.from_pretrained(folder, video_min_pixels=8192, video_max_pixels=4096)
    parts["video_processor"]["cap_pixels_per_frame"] = True
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump(parts, f)
    with pytest.raises(UserError, match=r"processor_config\.json: .*cap_pixels_per_frame"):
        Preprocessor.from_pretrained(folder)


def joining_space_and_bracket(checkpoint, folder):
    """A copy of checkpoint whose tokenizer merges " <" into one token, as Qwen's does (the tiny one has no such
    merge): its last merge gives its id up to it."""
    import json
    shutil.copytree(checkpoint, folder)
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    model = tokenizer["model"]
    first, second = model["merges"].pop()
    model["vocab"]["Ġ<"] = model["vocab"].pop(first + second)
    model["merges"].append(["Ġ", "<"])
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    return folder


def test_the_text_before_a_video_is_tokenised_with_its_first_timestamp(tiny_checkpoint, tmp_path):
    # transformers' processor tokenises "before <0.2 seconds>" as one text: a tokenizer that merges " <" (Qwen's
    # does) gives one token there, which the text and the timestamp tokenised apart would not
    folder = joining_space_and_bracket(tiny_checkpoint, str(tmp_path / "merging"))
    prep, frames = Preprocessor.from_pretrained(folder), _frames(4)
    joined = prep.tokenizer.convert_tokens_to_ids("Ġ<")
    assert prep.ids(" <") == [joined] and prep.ids(" ") + prep.ids("<") != [joined]
    text = f"before {VIDEO_MARKER} after"
    feature = prep(text, video=frames)
    ids = feature["input_ids"].tolist()
    start = len(prep.prefix_ids)
    assert ids[start:start + len(prep.ids("before <0.2 seconds>"))] == prep.ids("before <0.2 seconds>")
    assert len(ids) == prep.num_tokens(text, video=frames)
    model = Embedder.from_pretrained(tiny_checkpoint).model  # positions: the joint run is one text run as well
    batch = prep.collate([feature])
    reference, _ = model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"], None, batch["video_grid_thw"])
    assert torch.equal(reference, batch["position_ids"])
    # a text before the video cut short by max_length keeps the ids it was cut to, the timestamp's after them
    short = Preprocessor.from_pretrained(folder, max_length=prep.num_tokens(text, video=frames) - 3)
    cut = short("many words " * 50 + f"word {VIDEO_MARKER}", video=frames)["input_ids"].tolist()
    assert len(cut) == short.max_length and cut.count(prep.video_pad_id) == 4

"""Tests of model.py: the prompt, pooling, batch invariance, bad input, the tiny checkpoint."""
import os
import shutil

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from common import IMAGE_MARKER, UserError
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

"""Tests of model.py: the prompt, pooling, batch invariance, bad input, the tiny checkpoints. The core ones take
family_embedder (tests/conftest.py) and run on every backbone family of model.FAMILIES.

    python -m pytest -q tests/test_model.py
"""
import os
import re
import shutil

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from common import UserError
from media import IMAGE_MARKER, VIDEO_MARKER, smart_resize
from model import FAMILIES, Embedder, EmbeddingSpec, Preprocessor
from shapes.tiny_model import NORM_OFFSET, make_tiny_checkpoint
from tests.test_media import _frames, _images

SYSTEM_PROMPT = EmbeddingSpec().system_prompt


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


def test_embedding_is_batch_invariant(family_embedder, tmp_path):
    tiny_embedder, items = family_embedder, _mixed_items(tmp_path)
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


def test_prompt_layout_and_marker(family_embedder):
    prep = family_embedder.preprocessor
    decode = lambda f: prep.tokenizer.decode(f["input_ids"].tolist(), skip_special_tokens=False)
    text_only = decode(prep("hello there"))
    assert text_only == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhello there"
                         "<|im_end|>\n<|im_start|>assistant\n<|endoftext|>")
    image = Image.new("RGB", (64, 64))
    feature = prep(f"before {IMAGE_MARKER} after", image)
    n_tokens = int(feature["image_grid_thw"].prod()) // prep.vision["image"].merge_size ** 2
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


def test_positions_match_transformers_and_lengths(family_embedder):
    tiny_embedder, prep = family_embedder, family_embedder.preprocessor
    rgb, grey, _, _ = _images()
    features = [prep(f"q {IMAGE_MARKER} tail text", rgb), prep("only text"), prep("", grey)]
    batch = prep.collate(features)
    reference, _ = tiny_embedder.model.get_rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                                      batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    assert torch.equal(reference[:, mask], batch["position_ids"][:, mask])
    assert prep.num_tokens(f"q {IMAGE_MARKER} tail text", rgb) == len(features[0]["input_ids"])
    assert prep.num_tokens("", grey) == len(features[2]["input_ids"])
    assert batch["mm_token_type_ids"].sum() == (batch["input_ids"] == prep.pad_ids["image"]).sum()


def test_truncation_keeps_image_and_template(tiny_checkpoint):
    prep = Preprocessor.from_pretrained(tiny_checkpoint, max_length=80)
    image = Image.new("RGB", (128, 128), (1, 2, 3))
    long_text = "many words " * 200
    for text, img in [(long_text, None), (f"{long_text}{IMAGE_MARKER}{long_text}", image), (long_text, image)]:
        ids = prep(text, img)["input_ids"].tolist()
        assert len(ids) == 80 == prep.num_tokens(text, img)
        assert ids[-len(prep.suffix_ids):] == prep.suffix_ids and ids[:len(prep.prefix_ids)] == prep.prefix_ids
        if img is not None:
            assert ids.count(prep.pad_ids["image"]) == 16 and ids.count(prep.vision_end_id) == 1
    with pytest.raises(UserError, match=r"image \(in memory\): its 18 tokens .* do not fit max_length=39"):
        Preprocessor.from_pretrained(tiny_checkpoint, max_length=len(prep.prefix_ids) + len(prep.suffix_ids) + 17)("x", image)


def test_an_empty_item_is_the_prompt_with_empty_content(tiny_embedder):
    # as VLM2Vec embeds an empty text (an MMEB-V2 option cut to ''): the prompt around nothing, never an error
    prep = tiny_embedder.preprocessor
    assert prep("")["input_ids"].tolist() == prep.prefix_ids + prep.suffix_ids == prep(None)["input_ids"].tolist()
    empty, blank, text = tiny_embedder.encode([{"text": "", "image": None}, {"text": "  ", "image": None},
                                               {"text": "ok", "image": None}])
    assert torch.isfinite(empty).all() and (empty - text).abs().max() > 1e-3 and (empty - blank).abs().max() > 0


def test_bad_input_names_the_item(tiny_embedder, tmp_path):
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"not a jpeg at all")
    with pytest.raises(UserError, match=r"item 1: .*missing\.png"):
        tiny_embedder.encode([{"text": "ok", "image": None}, {"text": "x", "image": str(tmp_path / "missing.png")}])
    with pytest.raises(UserError, match=r"item 0: .*corrupt\.jpg"):
        tiny_embedder.encode([{"text": "x", "image": str(corrupt)}])
    with pytest.raises(UserError, match="item 0: expected a dict"):
        tiny_embedder.encode(["just a string"])






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
    # at the tiny checkpoint's own pixel budget (128 x 128) the photo takes 12 tokens; max_length leaves room for 10
    # beside the template: training names the image, inference embeds it at the largest grid that fits, and counts it
    import eval as evaluation
    from runs.export import load_for_inference
    photo = str(tmp_path / "photo.jpg")
    Image.effect_noise((400, 300), 60).convert("RGB").save(photo)
    template, budget = Preprocessor.from_pretrained(tiny_checkpoint), 128 * 128
    max_length = len(template.prefix_ids) + len(template.suffix_ids) + 2 + 10
    training = Preprocessor.from_pretrained(tiny_checkpoint, max_length=max_length, max_pixels=budget)
    with pytest.raises(UserError, match=r"image '.*photo\.jpg': its 14 tokens \(1 x 12 merged patches\) do not fit max_length"):
        training("what is it?", photo)
    embedder, _ = load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=max_length, max_pixels=budget)
    prep, text = embedder.preprocessor, "what is it?"
    feature = prep(text, photo)
    ids = feature["input_ids"].tolist()
    grid_h, grid_w = feature["image_grid_thw"][0, 1:].tolist()
    text_tokens = len(prep.ids(text))
    assert ids.count(prep.pad_ids["image"]) == grid_h * grid_w // 4 <= 10 - text_tokens  # the text kept whole beside it
    room, tokens = 10 - text_tokens, grid_h * grid_w // 4
    sizes = [smart_resize(300, 400, 32, 0, budget) for budget in range(1024, 40000, 64)]  # every budget's grid
    assert tokens == max(h * w // 1024 for h, w in sizes if h * w // 1024 <= room) and grid_w >= grid_h  # the largest
    assert len(ids) == prep.num_tokens(text, photo) <= max_length
    assert prep.shrunk == [f"image {photo!r}"]
    # the same vector as the photo resized to that grid beforehand, at a max_length where it fits as it is
    resized = Image.open(photo).resize((grid_w * 16, grid_h * 16), resample=prep.vision["image"].resample)
    roomy, _ = load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=512, max_pixels=budget)
    torch.testing.assert_close(embedder.encode([{"text": text, "image": photo}]),
                               roomy.encode([{"text": text, "image": resized}]), atol=1e-5, rtol=0)
    items = [{"text": text, "image": photo}, {"text": "plain text", "image": None}, {"text": "", "image": photo}]
    vectors, shrunk = evaluation.encode_shared(embedder, items, 2, 0)
    assert shrunk == 2 and vectors.shape == (3, embedder.dim) and torch.isfinite(vectors).all()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pooling_reads_the_state_after_the_final_norm(tmp_path, family):
    # the embedding is last_hidden_state at the last token: after the final RMSNorm, whose gain sets the norms that
    # Stage II's dot product and tau = 100 rely on. Some Qwen-VL code pools hidden_states[-1], which can be the state
    # before that norm; a gain far from 1 makes the two differ by far more than any tolerance
    checkpoint = make_tiny_checkpoint(str(tmp_path / "tiny"), seed=0, final_norm_std=0.5, family=family)
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
    gain = NORM_OFFSET.get(family, 0.0) + weight  # Qwen3.5's zero-centred norm: 1 + w; Qwen3-VL's: w
    expected = 8 * gain * last(seen["before"]) / last(seen["before"]).norm(dim=-1, keepdim=True)  # sqrt(D) = 8
    torch.testing.assert_close(vectors, expected, atol=1e-3, rtol=1e-3)  # the RMSNorm's output


# -----------------------------------------------------------------------------
# videos: an item's "video" is a list of frames







def test_video_layout_and_positions_match_transformers(family_embedder):
    tiny_embedder, prep = family_embedder, family_embedder.preprocessor
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
    assert torch.equal(kinds == 2, batch["input_ids"] == prep.pad_ids["video"]) and (kinds == 1).sum() == \
        (batch["input_ids"] == prep.pad_ids["image"]).sum() > 0
    assert batch["pixel_values_videos"].shape == (32 + 24 + 24, 3 * 2 * 16 * 16)
    items = list(zip(texts, videos))
    assert [prep.num_tokens(text, video=video) for text, video in items] == [len(f["input_ids"]) for f in features[:3]]






def test_encoding_a_video(family_embedder):
    tiny_embedder = family_embedder
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
    with pytest.raises(UserError, match="item 0: a video must be a folder of frames or a non-empty list"):
        embedder.encode([{"text": "x", "video": []}])
    # a folder of frames, as a training row names a video, is its frames in their natural order
    torch.testing.assert_close(embedder.encode([{"text": "x", "video": str(tmp_path)}]),
                               embedder.encode([{"text": "x", "video": paths}]), atol=0, rtol=0)
    with pytest.raises(UserError, match=rf"item 0: video folder '{re.escape(str(tmp_path / 'nowhere'))}' does not exist"):
        embedder.encode([{"text": "x", "video": str(tmp_path / "nowhere")}])
    os.makedirs(tmp_path / "empty")
    with pytest.raises(UserError, match=r"item 0: video folder .*empty' holds no .jpg/.jpeg/.png frames"):
        embedder.encode([{"text": "x", "video": str(tmp_path / "empty")}])
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
    assert prep.shrunk == [f"video {paths[0]!r} (the first of 8 frames)"]
    assert torch.isfinite(inference.encode([{"text": "", "video": paths}])).all()
    with pytest.raises(UserError, match=r"frame_0000\.jpg.*do not fit max_length"):  # not even then: named
        load_for_inference(tiny_checkpoint, "float32", "cpu", max_length=need - 5)[0].preprocessor("", video=paths)




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
    assert len(cut) == short.max_length and cut.count(prep.pad_ids["video"]) == 4

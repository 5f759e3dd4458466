"""Tests of media.py: images read as a viewer shows them, resized, cut and valued as transformers' processors do
(an image's and a video's frames on one path), a video's frames kept and timed, a checkpoint's processor settings.

    python -m pytest -q tests/test_media.py
"""
import os
import shutil

import pytest
import torch
from PIL import Image

from common import UserError
from media import frame_choice, image_size, load_image, smart_resize
from model import Embedder, Preprocessor


def _images():
    """Images of different sizes and modes: RGB, grey, RGBA (transparent), palette."""
    rgb = Image.new("RGB", (100, 60), (200, 30, 30))
    rgb.paste((20, 20, 220), (10, 10, 40, 50))
    grey = Image.new("L", (48, 130), 90)
    rgba = Image.new("RGBA", (70, 70), (0, 255, 0, 0))
    rgba.paste((255, 0, 0, 255), (20, 20, 50, 50))
    palette = rgb.convert("P")
    return rgb, grey, rgba, palette


def test_image_sizes_are_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference
    for height, width in [(32, 64), (300, 170), (20, 700), (9, 40), (1080, 1920), (31, 33), (11, 300)]:
        for low, high in [(1024, 16384), (4096, 32768), (56 * 56, 28 * 28 * 1280), (0, 1605632)]:
            assert smart_resize(height, width, 32, low, high) == reference(height, width, 32, low, high), (height, width)
    with pytest.raises(ValueError, match="aspect ratio 2x500 is more than 200"):
        smart_resize(2, 500, 32, 1024, 16384)


def test_transparent_and_grey_images_become_rgb():
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
    assert image_size(str(tmp_path / "rotated.jpg")) == (20, 40)  # num_tokens counts the turned size too


def test_pixels_equal_transformers_processor(tiny_checkpoint):
    """uint8 patches from the worker + Embedder.pixel_values on the device = transformers' float pixel_values, bit
    for bit: sizes that shrink, grow (under min_pixels) and stay, every mode load_image accepts."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    transformers_processor = Qwen2VLImageProcessorPil.from_pretrained(tiny_checkpoint)  # 1,024 to 16,384 pixels
    embedder = Embedder.from_pretrained(tiny_checkpoint, max_pixels=128 * 128)
    preprocessor = embedder.preprocessor
    noise = Image.effect_noise((300, 170), 80).convert("RGB")
    thin = [noise.resize((300, 11)), noise.resize((9, 40))]  # a side that rounds to 0 patches: grown, as transformers
    for image in [noise, noise.resize((20, 90)), noise.crop((0, 0, 64, 128)), *thin, *_images()]:
        image = load_image(image)
        reference = transformers_processor(images=[image], return_tensors="pt")
        vision = preprocessor.vision["image"]
        grid = vision.grid(1, image.height, image.width)
        patches = vision.patches([image], grid)
        assert patches.dtype == torch.uint8 and reference["image_grid_thw"].tolist() == [list(grid)]
        assert torch.equal(embedder.pixel_values(patches), reference["pixel_values"]), image.size


def _frames(count, size=(64, 32), seed=0):
    """count distinct noise frames: 64x32 is already a size the tiny video processor keeps (4 frames: 8,192 pixels
    of its 1,024..16,384 budget), so no resize touches them."""
    return [Image.effect_noise(size, 30 + 7 * k + seed).convert("RGB") for k in range(count)]


def test_a_video_keeps_the_frames_vlm2vec_keeps(tiny_checkpoint):
    assert frame_choice(64, 8) == [0, 9, 18, 27, 36, 45, 54, 63]  # MMEB-V2's 64 saved frames, 8 kept
    assert frame_choice(10, 8) == [0, 1, 2, 3, 5, 6, 7, 9]  # truncated as np.linspace(dtype=int), never rounded
    assert frame_choice(5, 8) == [0, 1, 2, 3, 4] and frame_choice(8, 8) == list(range(8))  # fewer: all, no padding
    prep = Preprocessor.from_pretrained(tiny_checkpoint)
    frames = _frames(10)
    assert prep.visual(video=frames) == ("video", [frames[k] for k in (0, 1, 2, 3, 5, 6, 7, 9)])
    given = prep("what happens?", video=frames)["pixel_values_videos"]
    chosen = prep("what happens?", video=[frames[k] for k in (0, 1, 2, 3, 5, 6, 7, 9)])["pixel_values_videos"]
    rounded = prep("what happens?", video=[frames[k] for k in (0, 1, 3, 4, 5, 6, 8, 9)])["pixel_values_videos"]
    assert torch.equal(given, chosen) and not torch.equal(given, rounded)
    four = Preprocessor.from_pretrained(tiny_checkpoint, video_frames=4)
    assert four.visual(video=frames)[1] == [frames[k] for k in (0, 3, 6, 9)]
    assert prep("x", video=frames[:5])["video_grid_thw"].tolist() == [[3, 2, 4]]  # 5 frames kept: 3 temporal patches


def test_video_sizes_and_timestamps_are_transformers(tiny_checkpoint):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as reference

    for frames in (2, 3, 8, 17):
        for height, width in [(32, 64), (300, 170), (20, 700), (9, 40), (1080, 1920), (31, 33)]:
            for low, high in [(1024, 16384), (4096, 32768), (128 * 1024, 768 * 1024), (0, 1)]:
                assert smart_resize(height, width, 32, low, high, frames, 2) == \
                    reference(frames, height, width, temporal_factor=2, factor=32, min_pixels=low, max_pixels=high)
    prep = Preprocessor.from_pretrained(tiny_checkpoint)
    for fps in (2.0, 1.0, 3.0, 24):
        for frames in range(1, 18):
            seconds = Qwen3VLProcessor._calculate_timestamps(None, list(range(frames)), fps, 2)
            assert prep.vision["video"].timestamps(frames, fps) == [f"<{s:.1f} seconds>" for s in seconds]
    assert prep.vision["video"].timestamps(8, 2.0) == [f"<{s} seconds>" for s in ("0.2", "1.2", "2.2", "3.2")]


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
    assert embedder.preprocessor.vision["video"].image_mean == (0.25, 0.5, 0.75)
    assert embedder.video_pixel_table[0, 0] == (0 - 0.25 * 255) / (0.5 * 255)  # its mean, not the image processor's
    assert Preprocessor.from_pretrained(folder, video_max_pixels=4096).vision["video"].size["longest_edge"] == 4096
    with pytest.raises(UserError, match="video_min_pixels 8192 > video_max_pixels 4096"):
        Preprocessor.from_pretrained(folder, video_min_pixels=8192, video_max_pixels=4096)
    parts["video_processor"]["cap_pixels_per_frame"] = True
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump(parts, f)
    with pytest.raises(UserError, match=r"processor_config\.json: .*cap_pixels_per_frame"):
        Preprocessor.from_pretrained(folder)

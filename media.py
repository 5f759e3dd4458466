"""
media.py: images and videos as Qwen's processors see them, one path for both: a file read as a viewer shows it; a
visual (an image: one frame; a video: its frames, in order) resized to a grid of patches under a pixel budget, cut
into uint8 patches in the processor's order; the pixel value of each byte.

    vision = Vision.from_pretrained("models/Qwen3.5-0.8B-Base", "video")   # the checkpoint's video processor settings
    grid = vision.grid(8, 480, 640)          # (temporal patches, rows, cols) of patches of 8 frames of 480 x 640
    patches = vision.patches(frames, grid)   # (t * rows * cols, 3 * temporal * patch * patch) uint8

A video's settings are read from the checkpoint's JSON (transformers' video processor needs torchvision), an
image's from transformers' PIL image processor. Like common.py, this file imports nothing of the project: its errors
are ValueErrors naming the file, which model.py raises as the user's.
"""
import dataclasses
import json
import math
import os
import re

import numpy as np
import torch
from PIL import Image, ImageOps

IMAGE_MARKER = "<|image_1|>"  # in an item's text (MMEB's and mmE5's rows): where the item's image goes
VIDEO_MARKER = "<|video_1|>"  # in an item's text: where the item's video (a list of frames) goes


# -----------------------------------------------------------------------------
# files

def load_image(image):
    """A path or PIL image -> an RGB PIL image as a viewer shows it: EXIF orientation applied, 16-bit and
    floating-point pixels scaled to 8 bits, transparent pixels laid on white (not black)."""
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as opened:
                opened.load()
                image = ImageOps.exif_transpose(opened)  # a copy, rotated as the camera was held
        except Exception as error:  # missing, unreadable, truncated, not an image, over Pillow's pixel limit
            raise ValueError(f"cannot read image {os.fspath(image)!r}: {error}") from None
    elif isinstance(image, Image.Image) and image.getexif().get(0x0112, 1) != 1:  # 0x0112: EXIF orientation
        image = ImageOps.exif_transpose(image)
    if not isinstance(image, Image.Image):
        raise ValueError(f"an image must be a file path or a PIL image, got {type(image).__name__}")
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        image = Image.fromarray(eight_bit(np.asarray(image)))
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def eight_bit(pixels):
    """(H, W) greyscale of more than 8 bits -> uint8: integers span 0..65535, floats 0..1 if all lie in it, else 0..255."""
    values = np.nan_to_num(pixels.astype(np.float64))
    if np.issubdtype(pixels.dtype, np.integer):
        values = values * (255 / 65535)
    elif values.size and values.min() >= 0 and values.max() <= 1:
        values = values * 255
    return np.clip(np.round(values), 0, 255).astype(np.uint8)


def image_size(image):
    """(width, height) of a PIL image or an image file as shown (EXIF turns), reading only the file's header."""
    if isinstance(image, Image.Image):
        return image.size
    try:
        with Image.open(image) as opened:
            width, height = opened.size
            if opened.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # shown turned by 90 degrees
                width, height = height, width
            return width, height
    except Exception as error:
        raise ValueError(f"cannot read image {os.fspath(image)!r}: {error}") from None


def visual_name(frames, kind="image"):
    """How an error names an image ("image 'a.jpg'", or "image (in memory)") or a video's frames (its first, how many)."""
    file = repr(os.fspath(frames[0])) if isinstance(frames[0], (str, os.PathLike)) else "(in memory)"
    return f"video {file} (the first of {len(frames)} frames)" if kind == "video" else f"image {file}"


def frames_of(video):
    """A video as an item holds it -> the list of its frames (paths or PIL images): a list of frames, or a folder of
    them as training rows name one (frame_files' order). A ValueError if it is neither."""
    if isinstance(video, (str, os.PathLike)):  # a folder of frames, as a training row's ..._video
        frames = frame_files(video)
        if not frames:
            raise ValueError(f"video folder {os.fspath(video)!r} " + ("does not exist" if frames is None else
                             "holds no .jpg/.jpeg/.png frames"))
        return frames
    if not isinstance(video, (list, tuple)) or not video:
        kind = "an empty list" if isinstance(video, (list, tuple)) else type(video).__name__
        raise ValueError(f"a video must be a folder of frames or a non-empty list of frames (file paths or PIL "
                         f"images), got {kind}")
    for frame in video:
        if not isinstance(frame, (str, os.PathLike, Image.Image)):
            raise ValueError(f"a video's frames must be file paths or PIL images, got {type(frame).__name__}")
    return list(video)


def natural_key(name):
    """VLM2Vec's load_frames order: digit runs compared as numbers, the rest case-blind (frame_2 before frame_10)."""
    return [int(part) if k % 2 else part.lower() for k, part in enumerate(re.split(r"(\d+)", name))]


def frame_files(folder):
    """A video folder's .jpg/.jpeg/.png frames in natural_key order (hidden ones never); None: there is no folder."""
    try:
        names = [n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")) and n[:1] != "."]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [os.path.join(folder, name) for name in sorted(names, key=natural_key)]


def frame_choice(count, budget):
    """The frames of `count` a video keeps: all if at most `budget` (never padded), else `budget` spread evenly, as
    VLM2Vec's np.linspace(..., dtype=int): 64 frames, 8 kept -> 0, 9, 18, ..., 63."""
    if count <= budget:
        return list(range(count))
    return np.linspace(0, count - 1, budget, dtype=int).tolist()


# -----------------------------------------------------------------------------
# sizes

def largest(fits, low, high):
    """The largest integer in [low, high] for which fits holds (fits(low) does, and fits holds up to a point), by bisection."""
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def smart_resize(height, width, factor, min_pixels, max_pixels, frames=None, temporal=1):
    """(h, w) in pixels Qwen's processors resize a visual to: sides multiples of `factor` (patch * merge), the aspect
    ratio kept, its pixels in [min_pixels, max_pixels]: an image's h * w (Qwen2-VL's image processor); a video's
    t * h * w, t rounded to the temporal patch, a side under `factor` first scaled up (Qwen3-VL's video processor)."""
    if frames is not None:
        frames = max(frames, temporal)
        if min(height, width) < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {height}x{width} is more than 200")
    count = frames or 1
    h, w = round(height / factor) * factor, round(width / factor) * factor  # a side may round to 0: then grown
    t = round(count / temporal) * temporal
    if t * h * w > max_pixels:
        beta = math.sqrt(count * height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (count * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


# -----------------------------------------------------------------------------
# a processor's settings, and what it does with a visual's frames

@dataclasses.dataclass(frozen=True)
class Vision:
    """A checkpoint's image or video processor settings, and what it does with a visual: the grid, the timestamps, the
    uint8 patches, each byte's pixel value. size: the pixel budget (an image's h * w, a video's t * h * w). The
    defaults are Qwen3VLVideoProcessor's, for what a video processor's JSON leaves out."""
    kind: str = "video"  # 'image' or 'video'
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    size: dict = dataclasses.field(default_factory=lambda: {"shortest_edge": 128 * 1024, "longest_edge": 768 * 1024})
    resample: int = 3  # PIL's BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)

    @classmethod
    def from_pretrained(cls, path, kind):
        """The settings in a local folder: an image's through transformers' PIL image processor (its defaults and
        legacy keys); a video's from the JSON transformers reads (processor_config.json's "video_processor", else
        video_preprocessor_config.json, else preprocessor_config.json; none: the defaults)."""
        if kind == "image":
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
            processor = Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True)
            known = [field.name for field in dataclasses.fields(cls) if field.name != "kind"]
            return cls("image", **{k: tuple(v) if isinstance(v, list) else v
                                   for k, v in ((k, getattr(processor, k)) for k in known)})
        for name in ("processor_config.json", "video_preprocessor_config.json", "preprocessor_config.json"):
            file = os.path.join(path, name)
            try:
                with open(file) as f:
                    settings = json.load(f)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as error:
                raise ValueError(f"{file}: not a processor config ({error})") from None
            settings = settings.get("video_processor") if name == "processor_config.json" else settings
            if settings is None:
                continue
            size = settings.get("size", cls().size)
            if settings.get("do_resize") is False or settings.get("cap_pixels_per_frame"):
                raise ValueError(f"{file}: a video processor with do_resize false or cap_pixels_per_frame true is not "
                                "supported (model.Preprocessor resizes as Qwen3VLVideoProcessor does by default)")
            if not isinstance(size, dict) or not {"shortest_edge", "longest_edge"} <= set(size):
                raise ValueError(f"{file}: a video processor's size names shortest_edge and longest_edge, not {size!r}")
            known = {field.name for field in dataclasses.fields(cls)} - {"size", "kind"}
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k in known},
                       size={"shortest_edge": size["shortest_edge"], "longest_edge": size["longest_edge"]})
        return cls()

    def with_budget(self, min_pixels, max_pixels):
        return dataclasses.replace(self, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})

    def grid(self, num_frames, height, width, room=None):
        """(grid_t, grid_h, grid_w) in patches of num_frames frames of this size, resized within size's budget (an image:
        grid_t 1). room: at most that many merged patches (tokens) in all: the largest size that fits, smart_resize
        under the largest budget, without a minimum, that gives it (one merged patch a frame at least)."""
        factor, video = self.patch_size * self.merge_size, self.kind == "video"
        temporal = self.temporal_patch_size if video else 1
        grid_t = -(-num_frames // temporal)

        def sized(low, high):  # (h, w) in pixels
            return smart_resize(height, width, factor, low, high, num_frames if video else None, temporal)
        h, w = sized(self.size["shortest_edge"], self.size["longest_edge"])
        most = None if room is None else room // grid_t  # tokens a temporal patch may take
        if most is not None and (h // factor) * (w // factor) > most > 0:  # h, w grow with the budget
            fits = lambda budget: math.prod(x // factor for x in sized(0, budget)) <= most  # noqa: E731
            h, w = sized(0, largest(fits, 1, 4 * most * (num_frames + temporal) * factor**2))  # fits(1): 1 a frame
        return grid_t, h // self.patch_size, w // self.patch_size

    def timestamps(self, num_frames, fps):
        """The text before each temporal patch of num_frames frames at fps, timed as transformers' Qwen3-VL processor:
        each patch at the mean of its first and last frame's seconds, the last frame repeated to fill it. 8 frames,
        2 fps: "<0.2 seconds>", "<1.2 seconds>", ... (0.25, 1.25: halves to even). An image has none."""
        if self.kind == "image":
            return []
        temporal = self.temporal_patch_size
        indices = list(range(num_frames)) + [num_frames - 1] * (-num_frames % temporal)
        seconds = [(indices[k] / fps + indices[k + temporal - 1] / fps) / 2 for k in range(0, len(indices), temporal)]
        return [f"<{s:.1f} seconds>" for s in seconds]

    def patches(self, frames, grid):
        """RGB PIL frames -> (grid_t * grid_h * grid_w, 3 * temporal * patch * patch) uint8 patches in the processor's
        order: temporal patch, merge group, merged patch, then (channel, frame, row, column). Frames are resized with
        PIL (transformers resizes a video's with torchvision: tests/test_peers.py measures the difference), a video's
        padded to whole temporal patches with its last; an image's temporal copies are made on the device."""
        temporal = self.temporal_patch_size if self.kind == "video" else 1
        patch, merge = self.patch_size, self.merge_size
        grid_t, grid_h, grid_w = grid
        size = (grid_w * patch, grid_h * patch)
        frames = [f if f.size == size else f.resize(size, resample=self.resample) for f in frames]
        frames += frames[-1:] * (grid_t * temporal - len(frames))  # an odd count: the last frame twice
        x = torch.from_numpy(np.stack([np.asarray(f) for f in frames])).permute(0, 3, 1, 2)  # (T, 3, h, w) uint8
        x = x.reshape(grid_t, temporal, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (grid_t, grid_h/m, grid_w/m, m, m, 3, temporal, patch, patch)
        return x.reshape(grid_t * grid_h * grid_w, 3 * temporal * patch * patch)

    def pixel_table(self):
        """(3, 256) float32: each channel's byte value rescaled and normalised bit for bit as the processor does it: an
        image's in numpy (a float64 rescale, then float32), a video's in torch, fused as (x - m / r) / (s / r)."""
        mean, std = (np.array(v, dtype=np.float32)[:, None] for v in (self.image_mean, self.image_std))
        if self.kind == "image":
            values = np.tile(np.arange(256, dtype=np.float64), (3, 1))  # (3, 256)
            values = (values * self.rescale_factor if self.do_rescale else values).astype(np.float32)
            return torch.from_numpy((values - mean) / std if self.do_normalize else values)
        values, mean, std = torch.arange(256, dtype=torch.float32).expand(3, -1), torch.from_numpy(mean), torch.from_numpy(std)
        if self.do_rescale and self.do_normalize:
            return (values - mean * (1.0 / self.rescale_factor)) / (std * (1.0 / self.rescale_factor))
        if self.do_normalize:
            return (values - mean) / std
        return values * self.rescale_factor if self.do_rescale else values.clone()

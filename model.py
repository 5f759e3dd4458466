"""
model.py: the PACE embedder, a Qwen3.5 vision-language backbone turned into an embedding model.

    from model import Embedder
    embedder = Embedder.from_pretrained("/models/Qwen3.5-0.8B-Base")   # a local folder, nothing downloaded
    # (runs.export.load_embedder loads a training step folder as well)
    vectors = embedder.encode([{"text": "a red circle", "image": None},
                               {"text": "", "image": "cat.jpg"},
                               {"text": "<|video_1|> What happens?", "video": ["f1.jpg", "f2.jpg", "f3.jpg"]}])
    # (3, D) float32; a video is its frames, in order (spec.video_frames of them are kept, spread evenly)
    embedder.spec                                                       # what the vectors mean

Every query, positive and negative is encoded alone under one prompt (paper, Appendix A.2):

    <|im_start|>system
    Represent the user's input.<|im_end|>
    <|im_start|>user
    {the image (or video) through vision placeholders, then the text}<|im_end|>
    <|im_start|>assistant
    <|endoftext|>

and its embedding is the final-layer hidden state at that last <|endoftext|> (last-token pooling), float32
and not normalised: Stage I's cosine (eq. 1) normalises inside the loss, Stage II's dot product (eq. 2) uses
the norm as signal.

- EmbeddingSpec: what a vector means (the prompt, the pooling, the similarity, the text and pixel budgets, the
  backbone), owned by the Embedder and stored beside its weights (SPEC_FILE); checkpoints, exports, the model
  card, the resume check, eval's cache and every loader derive from it (tests/test_spec.py).
- Preprocessor: one item's text and image or video -> token ids, 3-D rotary positions and uint8 patches;
  collate() pads a batch. Picklable, so DataLoader workers run it. A video is laid out as transformers' Qwen3-VL
  processor lays it out: per temporal patch (two frames) "<t seconds>" as text, then its vision placeholders.
- Embedder: nn.Module around transformers' Qwen3_5Model (the frozen vision tower and the language model; no
  LM head); forward(batch) -> (B, D); encode(items) for inference. It turns the patches into pixel values.

The prompt is built here, not by a chat template, and transformers' processor classes are not used (they need
torchvision): the tokenizer and the PIL image processor are loaded directly, the video processor's settings read from
its JSON (VideoProcessor).
"""
import dataclasses
import json
import logging
import math
import os

import numpy as np
import torch
import torch.nn as nn
from common import (IMAGE_MARKER, VIDEO_MARKER, Progress, UserError, VideoProcessor, check_video,  # noqa: F401
                    frame_choice, image_name, image_size, largest, load_image, video_name)

SPEC_FILE = "embedding_spec.json"  # beside the weights of every step folder and export: the EmbeddingSpec


# transformers says "falling back to its reference PyTorch implementation" twice a process at the first forward:
# train_step.kernel_report says it once, in its own words, and a notebook stays quiet
logging.getLogger("transformers.integrations.hub_kernels").addFilter(
    lambda record: "falling back to its reference PyTorch implementation" not in record.getMessage())


# -----------------------------------------------------------------------------
# what a vector means

@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
    """What defines an embedding: two vectors are comparable only if every field agrees. The field names are
    train.py's config keys where it has them; backbone is the lineage (the release the weights descend from)."""
    system_prompt: str = "Represent the user's input."  # the system turn of the prompt (Appendix A.2)
    pooling: str = "last_token"  # the final-layer hidden state at the prompt's last <|endoftext|>
    similarity: str = "cos"  # how two vectors compare: 'cos' (eq. 1, Stage I) or 'dot' (eq. 2, Stage II)
    max_length: int = 8192  # tokens an item may take; text is cut, never the image or the template
    min_pixels: int = 0  # an image's pixel budget, as the image processor resizes (0: the checkpoint's own)
    max_pixels: int = 0
    video_frames: int = 8  # frames a video keeps, spread evenly (common.frame_choice): VLM2Vec-V2's MMEB-V2 budget
    video_min_pixels: int = 0  # a video's pixel budget over all its frames, t * h * w, as the video processor resizes
    video_max_pixels: int = 0  # (0: the checkpoint's own)
    # the rate the kept frames' timestamps assume: their true times are unknown (the caller chose them), and 2 a second
    # is how Qwen3-VL's video processor samples a video, so they step as in training (transformers assumes 24)
    video_fps: float = 2.0
    backbone: str = ""  # the Hugging Face release folder the weights descend from (absolute path)

    POOLINGS = ("last_token",)
    SIMILARITIES = ("cos", "dot")

    def __post_init__(self):
        if self.pooling not in self.POOLINGS:
            raise UserError(f"pooling must be one of {', '.join(map(repr, self.POOLINGS))}, got {self.pooling!r}")
        if self.similarity not in self.SIMILARITIES:
            raise UserError(f"similarity must be one of {', '.join(map(repr, self.SIMILARITIES))}, "
                            f"got {self.similarity!r}")
        if not (isinstance(self.video_frames, int) and self.video_frames >= 1 and self.video_fps > 0):
            raise UserError(f"video_frames must be 1 or more and video_fps above 0, got {self.video_frames!r} and "
                            f"{self.video_fps!r}")

    @classmethod
    def fields(cls):
        return [field.name for field in dataclasses.fields(cls)]

    def replace(self, **changes):
        """A copy with some fields changed; a change of None, '' or 0 keeps the field as it is."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v not in (None, "", 0)})

    def to_dict(self):
        return dataclasses.asdict(self)

    def save(self, folder):
        with open(os.path.join(folder, SPEC_FILE), "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, folder):
        """The spec stored in folder (SPEC_FILE), or None where there is none (a release)."""
        path = os.path.join(folder, SPEC_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with open(path) as f:
                stored = json.load(f)
            unknown = set(stored) - set(cls.fields())
            if unknown:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            return cls(**stored)
        except (OSError, ValueError, TypeError) as error:
            raise UserError(f"{path}: not an embedding spec ({error})") from None


# -----------------------------------------------------------------------------
# images

def smart_resize(height, width, factor, min_pixels, max_pixels):
    """The size Qwen's image processor resizes to: sides multiples of `factor` (patch * merge), aspect
    ratio kept, pixel count within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise UserError(f"image aspect ratio {height}x{width} is more than 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor  # a side may round to 0: then grown
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


# -----------------------------------------------------------------------------
# one item -> model inputs; a list of items -> a padded batch

class Preprocessor:
    """Builds the embedding prompt of one item and its model inputs, as spec says (its system prompt, max_length, a
    video's frames and fps; image_processor.size and video_processor.size hold the pixel budgets). Runs in DataLoader
    workers."""

    fit_images = False  # eval, search, mining: an image or video too large for max_length is shrunk to fit (*_grid)

    def __init__(self, tokenizer, image_processor, spec=EmbeddingSpec(), video_processor=None):
        from tokenizers import Tokenizer
        self.tokenizer, self.image_processor, self.spec = tokenizer, image_processor, spec
        self.video_processor = video_processor or VideoProcessor(  # without one: Qwen3VLVideoProcessor's defaults
            image_processor.patch_size, image_processor.temporal_patch_size, image_processor.merge_size)
        definition = json.loads(tokenizer.backend_tokenizer.to_str())
        self.plain = Tokenizer.from_str(json.dumps(dict(definition, added_tokens=[])))  # for user text: ids()
        self.max_length = max_length = spec.max_length
        token = tokenizer.convert_tokens_to_ids
        self.image_pad_id, self.video_pad_id = token("<|image_pad|>"), token("<|video_pad|>")
        self.vision_start_id, self.vision_end_id = token("<|vision_start|>"), token("<|vision_end|>")
        self.pad_id = token("<|endoftext|>")
        self.shrunk = []  # with fit_images: the images and videos num_tokens found too large, each time it met one
        self.patch_size, self.merge_size = image_processor.patch_size, image_processor.merge_size
        # The fixed parts of the template, with their special tokens parsed.
        self.prefix_ids = self.ids(f"<|im_start|>system\n{spec.system_prompt}<|im_end|>\n<|im_start|>user\n", True)
        self.suffix_ids = self.ids("<|im_end|>\n<|im_start|>assistant\n<|endoftext|>", True)
        if self.suffix_ids[-1] != self.pad_id or tokenizer.unk_token_id in (self.image_pad_id, self.video_pad_id):
            raise UserError("tokenizer lacks the Qwen special tokens (<|endoftext|>, <|image_pad|>, ...)")
        if max_length < len(self.prefix_ids) + len(self.suffix_ids) + 1:
            raise UserError(f"max_length={max_length} cannot hold the prompt template")

    @classmethod
    def from_pretrained(cls, path, spec=None, **changes):
        """The tokenizer, image processor and video processor settings of a local folder, under spec (default:
        EmbeddingSpec()) with changes (max_length=..., max_pixels=...; 0 or None keeps a field). The spec's pixel
        budgets, 0 for the folder's own, become the processors'; the returned Preprocessor's spec holds them in
        numbers."""
        from transformers import Qwen3_5Tokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        # Qwen3_5Tokenizer, not AutoTokenizer: releases name Qwen2Tokenizer, whose word split before transformers
        # 5.18 ignores combining marks (Hindi, Thai, accents), which changes the tokens and so the embeddings
        tokenizer = Qwen3_5Tokenizer.from_pretrained(path, local_files_only=True)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True)
        video_processor = VideoProcessor.from_pretrained(path)  # its JSON: transformers' class needs torchvision
        spec, budgets = (spec or EmbeddingSpec()).replace(**changes), {}
        for kind, processor in (("", image_processor), ("video_", video_processor)):
            low = budgets[f"{kind}min_pixels"] = getattr(spec, f"{kind}min_pixels") or processor.size["shortest_edge"]
            high = budgets[f"{kind}max_pixels"] = getattr(spec, f"{kind}max_pixels") or processor.size["longest_edge"]
            if low > high:
                raise UserError(f"{kind}min_pixels {low} > {kind}max_pixels {high}")
        image_processor.size = dict(image_processor.size, shortest_edge=budgets["min_pixels"],
                                    longest_edge=budgets["max_pixels"])
        video_processor = dataclasses.replace(video_processor, size={"shortest_edge": budgets["video_min_pixels"],
                                                                     "longest_edge": budgets["video_max_pixels"]})
        return cls(tokenizer, image_processor, dataclasses.replace(spec, **budgets), video_processor)

    def ids(self, text, special=False):
        """Token ids of text. special: the template's own text, its control tokens parsed. Else user text, which
        never injects one: every added token, special or not, stays text ("<|im_end|>", and "<think>" or
        "<tool_call>", which a release marks non-special, so split_special_tokens would keep them whole)."""
        if special:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.plain.encode(text, add_special_tokens=False).ids

    def image_grid(self, height, width, text=None):
        """(grid_h, grid_w) in patches of an image of this size after resizing. With fit_images and the item's text,
        an image too large for max_length beside that text (or half the room, for a long one) takes the largest
        grid that fits: smart_resize under the largest pixel budget that leaves it within the room."""
        size, factor = self.image_processor.size, self.patch_size * self.merge_size
        h, w = smart_resize(height, width, factor, size["shortest_edge"], size["longest_edge"])
        if self.fit_images and text is not None:
            room = self.max_length - len(self.prefix_ids) - len(self.suffix_ids) - 2  # image tokens beside the template
            room -= min(sum(map(len, self.text_ids(text, IMAGE_MARKER))), room // 2)
            if (h // factor) * (w // factor) > room > 0:  # the largest budget whose grid fits: h, w grow with it
                fits = lambda b: math.prod(x // factor for x in smart_resize(height, width, factor, 0, b)) <= room  # noqa: E731
                budget = largest(fits, factor**2, 4 * room * factor**2)  # fits(factor**2): one merged patch
                h, w = smart_resize(height, width, factor, 0, budget)
        return h // self.patch_size, w // self.patch_size

    def video_grid(self, num_frames, height, width, text=None):
        """(grid_t, grid_h, grid_w) of a video of num_frames kept frames of this size (VideoProcessor.grid). With
        fit_images and the item's text, one too large for max_length is shrunk as image_grid shrinks an image: to
        the largest frames whose tokens fit beside the timestamps and that text (or half the room, for a long one)."""
        if not (self.fit_images and text is not None):
            return self.video_processor.grid(num_frames, height, width)
        room = self.max_length - len(self.prefix_ids) - len(self.suffix_ids) - self.stamp_tokens(num_frames)
        room -= min(sum(map(len, self.text_ids(text, VIDEO_MARKER))), room // 2)
        temporal = self.video_processor.temporal_patch_size
        return self.video_processor.grid(num_frames, height, width, most=room // -(-num_frames // temporal))

    def split_text(self, text, marker=None):
        """An item's text -> (the text before its image or video, the text after it): marker is IMAGE_MARKER or
        VIDEO_MARKER, whichever the item has (None: neither); without it in the text, the image or video leads. The
        other markers are dropped with the newline or space after them (never fed as literal text: mmE5's rows carry
        "<|image_1|>\n" in some queries that have no image)."""
        for other in [m for m in (IMAGE_MARKER, VIDEO_MARKER) if m != marker]:
            head, found, tail = text.partition(other)
            tail = tail.replace(other, "")
            text = head + (tail[1:] if found and tail[:1] in ("\n", " ") else tail)
        before, found, after = text.partition(marker) if marker else ("", "", text)
        return (before, after.replace(marker, "")) if found else ("", text)  # one image or video per item

    def text_ids(self, text, marker=None, visual_tokens=0):
        """Token ids of the text before and after the item's image or video (split_text), which takes visual_tokens.
        Truncated from the end of the text itself, so the image or video and the closing template always survive."""
        before, after = self.split_text(text, marker)
        before_ids, after_ids = self.ids(before) if before else [], self.ids(after) if after else []
        budget = self.max_length - len(self.prefix_ids) - len(self.suffix_ids) - visual_tokens
        if budget < 0:  # an image: video_tokens checks a video first, naming it
            raise UserError(f"an image of {visual_tokens - 2} tokens does not fit max_length={self.max_length}; "
                            "lower max_pixels or raise max_length")
        return before_ids[:budget], after_ids[:max(0, budget - len(before_ids))]

    def stamp_tokens(self, num_frames):
        """Tokens a video of num_frames kept frames takes besides its <|video_pad|>s: its timestamps, vision starts
        and ends."""
        stamps = self.video_processor.timestamps(num_frames, self.spec.video_fps)
        return sum(len(self.ids(stamp)) + 2 for stamp in stamps)

    def video_tokens(self, text, frames, grid):
        """A video item's tokens without the template -> (ids, pieces for mrope_positions), laid out as transformers'
        Qwen3-VL processor lays a video out: per temporal patch its timestamp as plain text, <|vision_start|>, a
        <|video_pad|> per merged patch, <|vision_end|>; where the text has <|video_1|>, else before the text. A video
        that cannot fit max_length is a UserError naming its first frame (frames: the kept ones)."""
        stamps = self.video_processor.timestamps(len(frames), self.spec.video_fps)
        stamp_ids = [self.ids(stamp) for stamp in stamps]
        merge = self.video_processor.merge_size
        grid_t, rows, cols = grid[0], grid[1] // merge, grid[2] // merge
        tokens = grid_t * rows * cols + sum(len(ids) + 2 for ids in stamp_ids)
        if len(self.prefix_ids) + tokens + len(self.suffix_ids) > self.max_length:
            raise UserError(f"video {video_name(frames)}: its {tokens} tokens ({grid_t} x {rows * cols} merged "
                            f"patches, the timestamps) do not fit max_length={self.max_length}; lower "
                            "video_max_pixels or video_frames, or raise max_length")
        before, after = self.text_ids(text, VIDEO_MARKER, tokens)
        head, whole = before + stamp_ids[0], self.split_text(text, VIDEO_MARKER)[0]
        if before and len(before) == len(self.ids(whole)):  # transformers tokenises the text before a video with its
            joint = self.ids(whole + stamps[0])  # first timestamp, whose "<" joins a space or colon before it
            head = joint if len(joint) <= len(head) else head
        ids, pieces = [], []
        for k in range(grid_t):  # a grid piece per temporal patch, as get_rope_index splits a video
            run = (head if k == 0 else [self.vision_end_id] + stamp_ids[k]) + [self.vision_start_id]
            ids, pieces = ids + run + [self.video_pad_id] * (rows * cols), pieces + [len(run), (rows, cols)]
        return ids + [self.vision_end_id] + after, pieces + [len(after) + 1]

    def kept_frames(self, video):
        """An item's video (a list of frame paths or PIL images) -> the frames it keeps (spec.video_frames of them)."""
        frames = check_video(video)
        return [frames[k] for k in frame_choice(len(frames), self.spec.video_frames)]

    def num_tokens(self, text, image=None, video=None):
        """Exact sequence length of an item, reading only its image's header or its video's first kept frame's (the
        others are resized to its size): for length-sorted batching."""
        text, num_image_tokens = text or "", 0
        if video is not None:
            frames = self.kept_frames(video)
            width, height = image_size(frames[0])
            try:
                grid = self.video_grid(len(frames), height, width, text)
                if self.fit_images and grid != self.video_grid(len(frames), height, width):
                    self.shrunk.append(video_name(frames))  # counted here, in the process that batches the items
            except ValueError as error:
                raise UserError(f"video {video_name(frames)}: {error}") from None
            return len(self.prefix_ids) + len(self.video_tokens(text, frames, grid)[0]) + len(self.suffix_ids)
        if image is not None:
            width, height = image_size(image)
            try:
                grid_h, grid_w = self.image_grid(height, width, text)
                if self.fit_images and (grid_h, grid_w) != self.image_grid(height, width):
                    self.shrunk.append(image_name(image))  # counted here, in the process that batches the items
            except ValueError as error:
                raise UserError(f"image {image_name(image)}: {error}") from None
            num_image_tokens = grid_h * grid_w // self.merge_size**2
        extra = num_image_tokens + 2 if image is not None else 0
        before, after = self.text_ids(text, IMAGE_MARKER if image is not None else None, extra)
        return len(self.prefix_ids) + len(before) + extra + len(after) + len(self.suffix_ids)

    def __call__(self, text, image=None, video=None):
        """One item -> {"input_ids": (L,), "position_ids": (3, L)} plus, with an image, {"pixel_values": (P, 3 * patch
        * patch) uint8 patches, "image_grid_thw": (1, 3)}, with a video {"pixel_values_videos": (P, 3 * temporal *
        patch * patch) uint8 patches, "video_grid_thw": (1, 3)}."""
        if not (text or "").strip() and image is None and video is None:
            raise UserError("an item needs text, an image or a video; this one has none")
        ids, pieces, patches, grid = self.item_tokens(text, image, video)
        names = ("pixel_values", "image_grid_thw") if video is None else ("pixel_values_videos", "video_grid_thw")
        feature = {} if patches is None else dict(zip(names, (patches, grid)))
        feature["input_ids"] = torch.tensor(self.prefix_ids + ids + self.suffix_ids, dtype=torch.long)
        feature["position_ids"] = mrope_positions([len(self.prefix_ids)] + pieces + [len(self.suffix_ids)])  # (3, L)
        return feature

    def item_tokens(self, text, image=None, video=None):
        """An item's tokens without the template: -> (ids, pieces for mrope_positions, uint8 patches of its image or
        video or None, its grid_thw (1, 3) or None), the image's placeholders where its text has <|image_1|> (a
        video's where it has <|video_1|>)."""
        if image is not None and video is not None:
            raise UserError("an item holds an image or a video, not both")
        if video is not None:
            kept = self.kept_frames(video)
            frames = [load_image(frame) for frame in kept]  # its errors name the file
            try:
                grid = self.video_grid(len(frames), frames[0].height, frames[0].width, text or "")
            except ValueError as error:  # e.g. an aspect ratio over 200
                raise UserError(f"video {video_name(kept)}: {error}") from None
            ids, pieces = self.video_tokens(text or "", kept, grid)
            return ids, pieces, self.video_processor.patches(frames, grid), torch.tensor([grid])
        if image is None:
            before, after = self.text_ids(text or "")
            return before + after, [len(before) + len(after)], None, None
        loaded = load_image(image)  # its errors name the file
        try:
            patches, grid_h, grid_w = self.patches(loaded, text or "")
        except ValueError as error:  # e.g. an aspect ratio over 200
            raise UserError(f"image {image_name(image)}: {error}") from None
        count = grid_h * grid_w // self.merge_size**2
        before, after = self.text_ids(text or "", IMAGE_MARKER, count + 2)
        ids = before + [self.vision_start_id] + [self.image_pad_id] * count + [self.vision_end_id] + after
        pieces = [len(before) + 1, (grid_h // self.merge_size, grid_w // self.merge_size), len(after) + 1]
        return ids, pieces, patches, torch.tensor([[1, grid_h, grid_w]])

    def patches(self, image, text=None):
        """An RGB PIL image -> ((P, 3 * patch * patch) uint8 patches, grid_h, grid_w), P = grid_h * grid_w.
        Resized as transformers' Qwen2-VL processor resizes (smart_resize, its resampling) and cut into patches
        in its order, merge groups together, but left as bytes and without the temporal copy: 8x fewer bytes
        through the DataLoader and to the device. Embedder.pixel_values finishes the job there."""
        patch, merge = self.patch_size, self.merge_size
        grid_h, grid_w = self.image_grid(image.height, image.width, text)
        h, w = grid_h * patch, grid_w * patch
        if (w, h) != image.size:
            image = image.resize((w, h), resample=self.image_processor.resample)
        x = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)  # (3, h, w) uint8
        x = x.reshape(3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        x = x.permute(1, 4, 2, 5, 0, 3, 6)  # (grid_h/m, grid_w/m, m, m, 3, patch, patch)
        return x.reshape(grid_h * grid_w, 3 * patch * patch), grid_h, grid_w

    def collate(self, features):
        """Right-padded batch of preprocessed items. Pooling reads position length-1 of each row."""
        batch_size, length = len(features), max(len(f["input_ids"]) for f in features)
        input_ids = torch.full((batch_size, length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros(batch_size, length, dtype=torch.long)
        position_ids = torch.zeros(3, batch_size, length, dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            input_ids[row, :n] = feature["input_ids"]
            attention_mask[row, :n] = 1
            position_ids[:, row, :n] = feature["position_ids"]
        joined = {key: [f[key] for f in features if key in f] for key in
                  ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}
        kinds = (input_ids == self.image_pad_id).int() + 2 * (input_ids == self.video_pad_id).int()
        return {
            "input_ids": input_ids,  # (B, L)
            "attention_mask": attention_mask,  # (B, L)
            "position_ids": position_ids,  # (3, B, L): temporal, height, width (M-RoPE)
            "mm_token_type_ids": kinds * attention_mask.int(),  # (B, L): 1 at image, 2 at video placeholders
            # the items' uint8 patches, (P, 3 * patch * patch) and (P', 3 * temporal * patch * patch), and grids
            # (images, 3) and (videos, 3), one item's after another's (None where no item has one)
            **{key: torch.cat(parts) if parts else None for key, parts in joined.items()},
        }


def mrope_positions(pieces):
    """3-D rotary positions (temporal, height, width) -> (3, L) of text runs (ints: their lengths) and images ((rows,
    cols) of merged patches), as Qwen3.5 defines them: text counts up on all three axes; an image's merged grid spans
    rows and columns from the position where it starts; text after it resumes at start + max(rows, cols). A video is
    a grid per temporal patch, its timestamp and vision tokens text runs between them (get_rope_index's split)."""
    parts, start = [], 0
    for piece in pieces:
        if isinstance(piece, int):
            parts.append(torch.arange(start, start + piece).expand(3, -1))
            start += piece
        else:
            rows, cols = piece
            height, width = torch.arange(rows).repeat_interleave(cols), torch.arange(cols).repeat(rows)
            parts.append(torch.stack([torch.zeros_like(height), height, width]) + start)
            start += max(rows, cols)
    return torch.cat(parts, dim=1)


# -----------------------------------------------------------------------------
# the embedder

class Embedder(nn.Module):
    """Qwen3.5 backbone + last-token pooling. Holds transformers' Qwen3_5Model as `self.model`
    (`model.visual`: frozen vision tower and merger; `model.language_model`: the trained part)."""

    def __init__(self, model, preprocessor):
        super().__init__()
        self.model, self.preprocessor = model, preprocessor
        self.model.config.use_cache = False
        self.model.visual.requires_grad_(False)  # frozen in both stages (paper, Appendix A.1)
        # (3, 256) float32, on the model's device: each channel's byte value rescaled and normalised with the
        # very numpy operations of transformers' processor (float64 rescale, then float32), so a lookup turns
        # the uint8 patches into exactly its pixel values
        processor = preprocessor.image_processor
        values = np.tile(np.arange(256, dtype=np.float64), (3, 1))  # (3, 256)
        values = (values * processor.rescale_factor if processor.do_rescale else values).astype(np.float32)
        if processor.do_normalize:
            mean, std = (np.array(v, dtype=np.float32)[:, None] for v in (processor.image_mean, processor.image_std))
            values = (values - mean) / std
        self.register_buffer("pixel_table", torch.from_numpy(values), persistent=False)
        # and the video processor's, computed as it computes them (VideoProcessor.pixel_table)
        self.register_buffer("video_pixel_table", preprocessor.video_processor.pixel_table(), persistent=False)

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, spec=None, **changes):
        """Load a local Hugging Face Qwen3.5 folder: a release (its spec EmbeddingSpec(), the folder its backbone)
        or an export/ of this project (the spec stored beside its weights). spec replaces that spec; changes
        (max_length=..., max_pixels=..., similarity=...) change single fields, 0, None or '' keeping them."""
        from transformers import AutoConfig, Qwen3_5Model
        path = os.fspath(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)")
        spec = spec or EmbeddingSpec.load(path) or EmbeddingSpec(backbone=os.path.abspath(path))
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != "qwen3_5":
            raise UserError(f"{path}: model_type {config.model_type!r}; this project needs a Qwen3.5 'qwen3_5' checkpoint")
        model = Qwen3_5Model.from_pretrained(path, config=config, dtype=dtype, local_files_only=True,
                                             attn_implementation="sdpa")
        return cls(model, Preprocessor.from_pretrained(path, spec, **changes))

    @property
    def spec(self):
        """The EmbeddingSpec the vectors are made under (the Preprocessor builds the prompt from it)."""
        return self.preprocessor.spec

    @property
    def dim(self):
        return self.model.config.text_config.hidden_size

    def pixel_values(self, patches, video=False):
        """(P, 3 * patch * patch) uint8 patches -> (P, 3 * temporal * patch * patch) float32 pixel_values, bit
        for bit those of transformers' processor: a table lookup per byte, then each patch repeated over the
        temporal patch (a still image is `temporal` identical frames). video: (P, 3 * temporal * patch * patch)
        uint8 patches of a video, which hold their frames: the video processor's values, of the same shape."""
        x = patches.view(patches.shape[0], 3, -1).long()  # (P, 3, patch * patch), a video's (P, 3, temporal * ...)
        table = self.video_pixel_table if video else self.pixel_table
        x = table[torch.arange(3, device=x.device)[None, :, None], x]
        temporal = 1 if video else self.preprocessor.image_processor.temporal_patch_size
        return x[:, :, None, :].expand(-1, -1, temporal, -1).reshape(x.shape[0], -1)

    def forward(self, input_ids, attention_mask, position_ids, mm_token_type_ids=None, pixel_values=None,
                image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None):
        """A collated batch, on any device -> (B, D) float32 embeddings: the final hidden states, pooled (pool: the
        last token's). pixel_values (pixel_values_videos) may be the Preprocessor's uint8 patches or transformers'
        float pixel values."""
        device = self.pixel_table.device
        move = lambda x: None if x is None else x.to(device, non_blocking=True)  # noqa: E731
        input_ids, attention_mask, pixel_values = move(input_ids), move(attention_mask), move(pixel_values)
        if pixel_values is not None and pixel_values.dtype == torch.uint8:
            pixel_values = self.pixel_values(pixel_values)
        pixel_values_videos = move(pixel_values_videos)
        if pixel_values_videos is not None and pixel_values_videos.dtype == torch.uint8:
            pixel_values_videos = self.pixel_values(pixel_values_videos, video=True)
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=move(position_ids),
                            mm_token_type_ids=move(mm_token_type_ids), pixel_values=pixel_values,
                            image_grid_thw=move(image_grid_thw), pixel_values_videos=pixel_values_videos,
                            video_grid_thw=move(video_grid_thw), use_cache=False).last_hidden_state  # (B, L, D)
        return self.pool(hidden, attention_mask).float()

    def pool(self, hidden, attention_mask):
        """(B, L, D) final hidden states -> (B, D), as the spec's pooling says; a new pooling is a branch here."""
        if self.spec.pooling == "last_token":  # right padding: each row's last real token, the <|endoftext|>
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), attention_mask.sum(dim=1) - 1]
        raise UserError(f"pooling {self.spec.pooling!r}: in EmbeddingSpec.POOLINGS, but no branch in Embedder.pool")

    @torch.no_grad()
    def encode(self, items, batch_size=16, num_workers=0, progress=""):
        """items: list of {"text": str, "image": path | PIL image | None} or {"text": str, "video": [frame paths or
        PIL images]} -> (N, D) float32, in input order.
        Batches of items of about one length (item_batches); num_workers > 0 decodes images in worker
        processes. progress: a label to print items done, items/s and time left under ('' prints nothing)."""
        was_training = self.training
        self.eval()
        out = torch.empty(len(items), self.dim)
        meter = Progress(len(items), progress) if progress else None
        for indices, batch in item_batches(items, self.preprocessor, batch_size, num_workers):
            out[indices] = self(**batch).cpu()
            if meter:
                meter.update(len(indices))
        self.train(was_training)
        return out

    def enable_activation_checkpointing(self):
        """Recompute each decoder layer of the language model in backward (non-reentrant): less memory for
        about a third more compute. activation_checkpointing_enable from transformers 5.23, the older
        gradient_checkpointing_enable before it."""
        language_model = self.model.language_model
        if hasattr(language_model, "activation_checkpointing_enable"):
            language_model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            language_model.gradient_checkpointing_enable({"use_reentrant": False})


# -----------------------------------------------------------------------------
# batches of items, for Embedder.encode

def prepared(index, item, function):
    """function(text, image, video) of one item ({"text", "image"} or {"text", "video"}), a UserError naming the
    item if it is malformed or function fails on it."""
    if not isinstance(item, dict) or not ({"text", "image", "video"} & set(item)):
        raise UserError(f"item {index}: expected a dict with 'text' and/or 'image' or 'video', got {item!r:.80}")
    text, image, video = item.get("text") or "", item.get("image"), item.get("video")
    try:
        if not text.strip() and image is None and video is None:
            raise UserError("has no text and no image or video")
        return function(text, image, video)
    except ValueError as error:
        raise UserError(f"item {index}: {error}") from None


class Items(torch.utils.data.Dataset):
    """items[i] preprocessed (in a worker when num_workers > 0), for item_batches."""

    def __init__(self, items, preprocessor):
        self.items, self.preprocessor = items, preprocessor

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return prepared(i, self.items[i], self.preprocessor)


def item_batches(items, preprocessor, batch_size, num_workers=0):
    """Items ({"text", "image" or "video"} dicts) -> (indices, collated batch) pairs by length_batches, preprocessed in
    num_workers DataLoader workers (0: in this process). An error names the item's index."""
    lengths = [prepared(i, item, preprocessor.num_tokens) for i, item in enumerate(items)]
    return length_batches(Items(items, preprocessor), lengths, batch_size, num_workers, preprocessor.collate)


def length_batches(dataset, lengths, batch_size, num_workers, collate_fn):
    """(indices, collate_fn of their dataset entries) pairs, batch_size entries of about one length each (lengths,
    sorted longest first, so an out-of-memory error shows at once), built in num_workers DataLoader workers."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate_fn)
    return zip(batches, loader)

"""
model.py: the PACE embedder, a Qwen3.5 vision-language backbone turned into an embedding model.

    from model import Embedder
    embedder = Embedder.from_pretrained("/models/Qwen3.5-0.8B-Base")   # a local folder, nothing downloaded
    # (checkpoint.load_embedder loads a trained export/ or step folder as well)
    vectors = embedder.encode([{"text": "a red circle", "image": None},
                               {"text": "", "image": "cat.jpg"}])       # (2, D) float32

Every query, positive and negative is encoded alone under one prompt (paper, Appendix A.2):

    <|im_start|>system
    Represent the user's input.<|im_end|>
    <|im_start|>user
    {the image through vision placeholders, then the text}<|im_end|>
    <|im_start|>assistant
    <|endoftext|>

and its embedding is the final-layer hidden state at that last <|endoftext|> (last-token pooling), float32
and not normalised: Stage I's cosine (eq. 1) normalises inside the loss, Stage II's dot product (eq. 2) uses
the norm as signal.

- Preprocessor: one item's text and image -> token ids, 3-D rotary positions and uint8 image patches;
  collate() pads a batch. Picklable, so DataLoader workers run it.
- Embedder: nn.Module around transformers' Qwen3_5Model (the frozen vision tower and the language model; no
  LM head); forward(batch) -> (B, D); encode(items) for inference. It turns the patches into pixel values.
- step_flops, peak_flops: the model's useful FLOPs of a training step and a GPU's peak, for MFU;
  kernel_report: which Gated DeltaNet and conv1d code transformers runs (one line; its own two warnings are
  dropped when this module is imported).

The prompt is built here, not by the checkpoint's chat template, and transformers' processor class is not
used: it needs the video processor, which needs torchvision. The tokenizer and the PIL image processor are
loaded directly.
"""
import importlib
import logging
import math
import os

import numpy as np
import torch
import torch.nn as nn
from PIL import Image, ImageOps

import batching
from common import Progress, UserError
from mmeb import IMAGE_MARKER

SYSTEM_PROMPT = "Represent the user's input."


# -----------------------------------------------------------------------------
# images

def load_image(image):
    """A path or PIL image -> an RGB PIL image as a viewer shows it: EXIF orientation applied, 16-bit and
    floating-point pixels scaled to 8 bits, transparent pixels laid on white (not black)."""
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as opened:
                opened.load()
                image = ImageOps.exif_transpose(opened)  # a copy, rotated as the camera was held
        except Exception as error:  # missing, unreadable, truncated, not an image, over Pillow's pixel limit
            raise UserError(f"cannot read image {os.fspath(image)!r}: {error}") from None
    elif isinstance(image, Image.Image) and image.getexif().get(0x0112, 1) != 1:  # 0x0112: EXIF orientation
        image = ImageOps.exif_transpose(image)
    if not isinstance(image, Image.Image):
        raise UserError(f"an image must be a file path or a PIL image, got {type(image).__name__}")
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
    """(H, W) greyscale of more than 8 bits -> uint8: integers span 0..65535 (16-bit PNG, TIFF), floats 0..1
    when all lie within it (else they are read as 0..255, as Pillow would)."""
    values = np.nan_to_num(pixels.astype(np.float64))
    if np.issubdtype(pixels.dtype, np.integer):
        values = values * (255 / 65535)
    elif values.size and values.min() >= 0 and values.max() <= 1:
        values = values * 255
    return np.clip(np.round(values), 0, 255).astype(np.uint8)


def image_size(image):
    """(width, height) of a PIL image or an image file, reading only the file's header."""
    if isinstance(image, Image.Image):
        return image.size
    try:
        with Image.open(image) as opened:
            width, height = opened.size
            if opened.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # shown turned by 90 degrees
                width, height = height, width
            return width, height
    except Exception as error:
        raise UserError(f"cannot read image {os.fspath(image)!r}: {error}") from None


def image_name(image):
    """How an error names an image: its path, quoted, or '(in memory)'."""
    return repr(os.fspath(image)) if isinstance(image, (str, os.PathLike)) else "(in memory)"


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
    """Builds the embedding prompt of one item and its model inputs. Runs in DataLoader workers."""

    def __init__(self, tokenizer, image_processor, max_length=8192):
        self.tokenizer, self.image_processor, self.max_length = tokenizer, image_processor, max_length
        token = tokenizer.convert_tokens_to_ids
        self.image_pad_id = token("<|image_pad|>")
        self.vision_start_id, self.vision_end_id = token("<|vision_start|>"), token("<|vision_end|>")
        self.pad_id = token("<|endoftext|>")
        self.patch_size, self.merge_size = image_processor.patch_size, image_processor.merge_size
        # The fixed parts of the template, with their special tokens parsed.
        self.prefix_ids = self.ids(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n", True)
        self.suffix_ids = self.ids("<|im_end|>\n<|im_start|>assistant\n<|endoftext|>", True)
        if self.suffix_ids[-1] != self.pad_id or self.image_pad_id == tokenizer.unk_token_id:
            raise UserError("tokenizer lacks the Qwen special tokens (<|endoftext|>, <|image_pad|>, ...)")
        if max_length < len(self.prefix_ids) + len(self.suffix_ids) + 1:
            raise UserError(f"max_length={max_length} cannot hold the prompt template")

    @classmethod
    def from_pretrained(cls, path, max_length=8192, min_pixels=None, max_pixels=None):
        from transformers import Qwen3_5Tokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        # Qwen3_5Tokenizer, not AutoTokenizer: releases name Qwen2Tokenizer, whose word split before transformers
        # 5.18 ignores combining marks (Hindi, Thai, accents), which changes the tokens and so the embeddings
        tokenizer = Qwen3_5Tokenizer.from_pretrained(path, local_files_only=True)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True)
        size = dict(image_processor.size)
        size["shortest_edge"] = min_pixels or size["shortest_edge"]
        size["longest_edge"] = max_pixels or size["longest_edge"]
        if size["shortest_edge"] > size["longest_edge"]:
            raise UserError(f"min_pixels {size['shortest_edge']} > max_pixels {size['longest_edge']}")
        image_processor.size = size
        return cls(tokenizer, image_processor, max_length)

    def ids(self, text, special=False):
        # User text never injects control tokens: a literal "<|im_end|>" in data stays text.
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]

    def image_grid(self, height, width):
        """(grid_h, grid_w) in patches of an image of this size after resizing."""
        size = self.image_processor.size
        h, w = smart_resize(height, width, self.patch_size * self.merge_size, size["shortest_edge"], size["longest_edge"])
        return h // self.patch_size, w // self.patch_size

    def text_ids(self, text, has_image, num_image_tokens):
        """Token ids of the text before and after the image. Without a marker the image leads; without an image
        the marker and the newline or space after it are dropped (never fed as literal text: mmE5's rows carry
        "<|image_1|>\n" in some queries that have no image). Truncated from the end of the text itself, so the
        image placeholders and the closing template always survive."""
        before, marker, after = text.partition(IMAGE_MARKER)
        if not marker:
            before, after = "", text
        after = after.replace(IMAGE_MARKER, "")  # one image per item
        if not has_image:
            before, after = "", before + (after[1:] if marker and after[:1] in ("\n", " ") else after)
        before_ids, after_ids = self.ids(before) if before else [], self.ids(after) if after else []
        fixed = len(self.prefix_ids) + len(self.suffix_ids) + (num_image_tokens + 2 if has_image else 0)
        budget = self.max_length - fixed
        if budget < 0:
            raise UserError(f"an image of {num_image_tokens} tokens does not fit max_length={self.max_length}; "
                            "lower max_pixels or raise max_length")
        return before_ids[:budget], after_ids[:max(0, budget - len(before_ids))]

    def num_tokens(self, text, image=None):
        """Exact sequence length of an item, reading only the image header: for length-sorted batching."""
        num_image_tokens = 0
        if image is not None:
            width, height = image_size(image)
            try:
                grid_h, grid_w = self.image_grid(height, width)
            except ValueError as error:
                raise UserError(f"image {image_name(image)}: {error}") from None
            num_image_tokens = grid_h * grid_w // self.merge_size**2
        before, after = self.text_ids(text or "", image is not None, num_image_tokens)
        extra = num_image_tokens + 2 if image is not None else 0
        return len(self.prefix_ids) + len(before) + extra + len(after) + len(self.suffix_ids)

    def __call__(self, text, image=None):
        """One item -> {"input_ids": (L,), "position_ids": (3, L)} plus, with an image,
        {"pixel_values": (P, 3 * patch * patch) uint8 patches, "image_grid_thw": (1, 3)}."""
        if not (text or "").strip() and image is None:
            raise UserError("an item needs text or an image; this one has neither")
        ids, pieces, patches, grid = self.item_tokens(text, image)
        feature = {} if patches is None else {"pixel_values": patches, "image_grid_thw": grid}
        feature["input_ids"] = torch.tensor(self.prefix_ids + ids + self.suffix_ids, dtype=torch.long)
        feature["position_ids"] = mrope_positions([len(self.prefix_ids)] + pieces + [len(self.suffix_ids)])  # (3, L)
        return feature

    def item_tokens(self, text, image=None):
        """An item's tokens without the template: -> (ids, pieces for mrope_positions, uint8 patches (P, 3 * patch *
        patch) or None, image_grid_thw (1, 3) or None), the image's placeholders where its text has <|image_1|>."""
        if image is None:
            before, after = self.text_ids(text or "", False, 0)
            return before + after, [len(before) + len(after)], None, None
        loaded = load_image(image)  # its errors name the file
        try:
            patches, grid_h, grid_w = self.patches(loaded)
        except ValueError as error:  # e.g. an aspect ratio over 200
            raise UserError(f"image {image_name(image)}: {error}") from None
        count = grid_h * grid_w // self.merge_size**2
        before, after = self.text_ids(text or "", True, count)
        ids = before + [self.vision_start_id] + [self.image_pad_id] * count + [self.vision_end_id] + after
        pieces = [len(before) + 1, (grid_h // self.merge_size, grid_w // self.merge_size), len(after) + 1]
        return ids, pieces, patches, torch.tensor([[1, grid_h, grid_w]])

    def patches(self, image):
        """An RGB PIL image -> ((P, 3 * patch * patch) uint8 patches, grid_h, grid_w), P = grid_h * grid_w.
        Resized as transformers' Qwen2-VL processor resizes (smart_resize, its resampling) and cut into patches
        in its order, merge groups together, but left as bytes and without the temporal copy: 8x fewer bytes
        through the DataLoader and to the device. Embedder.pixel_values finishes the job there."""
        patch, merge = self.patch_size, self.merge_size
        grid_h, grid_w = self.image_grid(image.height, image.width)
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
        with_image = [f for f in features if "pixel_values" in f]
        return {
            "input_ids": input_ids,  # (B, L)
            "attention_mask": attention_mask,  # (B, L)
            "position_ids": position_ids,  # (3, B, L): temporal, height, width (M-RoPE)
            "mm_token_type_ids": (input_ids == self.image_pad_id).int() * attention_mask.int(),  # (B, L)
            "pixel_values": torch.cat([f["pixel_values"] for f in with_image]) if with_image else None,
            "image_grid_thw": torch.cat([f["image_grid_thw"] for f in with_image]) if with_image else None,
        }


def mrope_positions(pieces):
    """3-D rotary positions (temporal, height, width) -> (3, L) of text runs (ints: their lengths) and images ((rows,
    cols) of merged patches), as Qwen3.5 defines them: text counts up on all three axes; an image's merged grid spans
    rows and columns from the position where it starts; text after it resumes at start + max(rows, cols)."""
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

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, max_length=8192, min_pixels=None, max_pixels=None):
        """Load a local Hugging Face Qwen3.5 folder (a release, or an export/ of this project)."""
        from transformers import AutoConfig, Qwen3_5Model
        path = os.fspath(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != "qwen3_5":
            raise UserError(f"{path}: model_type {config.model_type!r}; this project needs a Qwen3.5 'qwen3_5' checkpoint")
        model = Qwen3_5Model.from_pretrained(path, config=config, dtype=dtype, local_files_only=True,
                                             attn_implementation="sdpa")
        return cls(model, Preprocessor.from_pretrained(path, max_length, min_pixels, max_pixels))

    @property
    def dim(self):
        return self.model.config.text_config.hidden_size

    def pixel_values(self, patches):
        """(P, 3 * patch * patch) uint8 patches -> (P, 3 * temporal * patch * patch) float32 pixel_values, bit
        for bit those of transformers' processor: a table lookup per byte, then each patch repeated over the
        temporal patch (a still image is `temporal` identical frames)."""
        x = patches.view(patches.shape[0], 3, -1).long()  # (P, 3, patch * patch)
        x = self.pixel_table[torch.arange(3, device=x.device)[None, :, None], x]  # (P, 3, patch * patch)
        temporal = self.preprocessor.image_processor.temporal_patch_size
        return x[:, :, None, :].expand(-1, -1, temporal, -1).reshape(x.shape[0], -1)

    def forward(self, input_ids, attention_mask, position_ids, mm_token_type_ids=None, pixel_values=None,
                image_grid_thw=None):
        """A collated batch, on any device -> (B, D) float32 embeddings: the hidden state at each row's last
        token. pixel_values may be the Preprocessor's uint8 patches or transformers' float pixel values."""
        device = self.pixel_table.device
        move = lambda x: None if x is None else x.to(device, non_blocking=True)  # noqa: E731
        input_ids, attention_mask, pixel_values = move(input_ids), move(attention_mask), move(pixel_values)
        if pixel_values is not None and pixel_values.dtype == torch.uint8:
            pixel_values = self.pixel_values(pixel_values)
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=move(position_ids),
                            mm_token_type_ids=move(mm_token_type_ids), pixel_values=pixel_values,
                            image_grid_thw=move(image_grid_thw), use_cache=False).last_hidden_state  # (B, L, D)
        last = attention_mask.sum(dim=1) - 1  # (B,) right padding: the pooled <|endoftext|>
        return hidden[torch.arange(hidden.shape[0], device=device), last].float()

    @torch.no_grad()
    def encode(self, items, batch_size=16, num_workers=0, progress=""):
        """items: list of {"text": str, "image": path | PIL image | None} -> (N, D) float32, in input order.
        Batches of items of about one length (batching.item_batches); num_workers > 0 decodes images in worker
        processes. progress: a label to print items done, items/s and time left under ('' prints nothing)."""
        was_training = self.training
        self.eval()
        out = torch.empty(len(items), self.dim)
        meter = Progress(len(items), progress) if progress else None
        for indices, batch in batching.item_batches(items, self.preprocessor, batch_size, num_workers):
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
# what the model costs, and which kernels run it

# dense bf16 peak FLOP/s per GPU, matched against torch.cuda.get_device_name() in order (the first match wins)
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
                   ("H20", 148e12), ("A100", 312e12), ("A800", 312e12), ("B200", 2250e12), ("L40S", 362e12))


def peak_flops(device):
    """The dense bf16 peak of this device, for MFU; None on a CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for gpu, flops in PEAK_BF16_FLOPS if gpu in name), None)


def step_flops(embedder, chunks, full_finetune):
    """Useful FLOPs of one training step over these collated chunks (real tokens only, no recomputation): the
    language model's matmuls at 2N a token forward and 4N (full) or 2N (LoRA: activation gradients only) backward,
    N without the token embedding (a lookup); the causal attention scores of the full-attention layers (2 T^2 d
    forward, twice that backward); the frozen vision tower's forward. Gated DeltaNet's state updates (a few % at
    these sizes) are not counted. For the MFU figure."""
    text, vision = embedder.model.config.text_config, embedder.model.config.vision_config
    language = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                   if p.dim() >= 2 and "embed_tokens" not in n)
    tower = {n: p.numel() for n, p in embedder.model.visual.named_parameters() if p.dim() >= 2 and "pos_embed" not in n}
    per_patch = sum(v for n, v in tower.items() if "merger" not in n)
    per_patch += sum(v for n, v in tower.items() if "merger" in n) / vision.spatial_merge_size ** 2
    attention_width = text.num_attention_heads * text.head_dim
    full_layers = sum(kind == "full_attention" for kind in text.layer_types)
    flops = 0.0
    for chunk in chunks:
        lengths = chunk["attention_mask"].sum(dim=1).double()  # (B,)
        flops += (6 if full_finetune else 4) * language * lengths.sum().item()
        flops += 6 * full_layers * attention_width * (lengths ** 2).sum().item()
        if chunk["image_grid_thw"] is not None:
            patches = chunk["image_grid_thw"].prod(dim=1).double()  # (images,)
            flops += 2 * per_patch * patches.sum().item() + 4 * vision.depth * vision.hidden_size * (patches ** 2).sum().item()
    return flops


class HideKernelFallbackWarning(logging.Filter):
    """Drops transformers' 'falling back to its reference PyTorch implementation' lines (two per process, at the
    first forward): kernel_report says it once, in its own words. Installed when this module is imported, so the
    Python API (load_embedder in a notebook) is as quiet as the scripts."""

    def filter(self, record):
        return "falling back to its reference PyTorch implementation" not in record.getMessage()


logging.getLogger("transformers.integrations.hub_kernels").addFilter(HideKernelFallbackWarning())


def kernel_report(device):
    """One line: which Gated DeltaNet and causal-conv1d code transformers' qwen3_5 runs. It binds them once, when
    its modeling file is imported: the function from flash-linear-attention (fla) and causal_conv1d if those import,
    else its reference PyTorch code; the same import look-up here gives the same answer. On a CPU the reference code
    is the only one there is; on a GPU it is right but slow: pip install -r requirements-gpu.txt."""
    from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401 - binds the kernels on import

    def bound(module, names):
        try:
            module = importlib.import_module(module)
            return all(getattr(module, name, None) is not None for name in names)
        except Exception:  # noqa: BLE001 - transformers treats every import failure as "not installed"
            return False
    fla = bound("fla.ops.gated_delta_rule", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
    conv = bound("causal_conv1d", ["causal_conv1d_fn", "causal_conv1d_update"])
    where = "as expected on a CPU" if device.type == "cpu" else "slow on a GPU: pip install -r requirements-gpu.txt"
    return (f"kernels: Gated DeltaNet {'flash-linear-attention' if fla else 'PyTorch reference'}, causal conv1d "
            f"{'causal_conv1d' if conv else 'PyTorch reference (F.conv1d)'}"
            + ("" if fla and conv else f" ({where})"))

"""
model.py: the PACE embedder, a Qwen3.5 vision-language backbone turned into an embedding model.

    from model import Embedder
    embedder = Embedder.from_pretrained("/path/to/Qwen3.5-0.8B-Base")    # a local folder, offline
    vectors = embedder.encode([{"text": "a red circle", "image": None},
                               {"text": "", "image": "cat.jpg"}])          # (2, D) float32

Every query, positive and negative is encoded alone under one prompt (paper, Appendix A.2):

    <|im_start|>system
    Represent the user's input.<|im_end|>
    <|im_start|>user
    {images through vision placeholders, then the text}<|im_end|>
    <|im_start|>assistant
    <|endoftext|>

and its embedding is the final-layer hidden state at that last <|endoftext|> (last-token pooling),
float32 and not normalized: Stage I's cosine (eq. 1) normalizes inside the loss, Stage II's dot
product (eq. 2) uses the norm as signal.

Three pieces:
- Preprocessor: text and image -> token ids, 3-D rotary positions and pixel patches for ONE item, and
  collate() for a right-padded batch. Picklable, so DataLoader workers run it (data.py).
- Embedder: nn.Module around transformers' Qwen3_5Model (the vision tower, frozen, plus the language
  model; no LM head, no generation cache); forward(batch) -> (B, D); encode(items) for inference.
- make_tiny_checkpoint(): a tiny random Qwen3.5 in the exact layout of a real release, so tests and
  the toy benchmark load through the same path as real weights.

The prompt is built here, not by the checkpoint's chat template, and the processor class of
transformers is not used: it needs the video processor, which needs torchvision. The tokenizer and
the PIL image processor are loaded directly.
"""

import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
from PIL import Image

SYSTEM_PROMPT = "Represent the user's input."
IMAGE_MARKER = "<|image_1|>"  # in MMEB / mmE5 text: where the item's image goes


# -----------------------------------------------------------------------------
# images

def load_image(image):
    """A path or PIL image -> an RGB PIL image. Transparent pixels are laid on white, not black."""
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as opened:
                opened.load()
                image = opened.copy()
        except Exception as error:  # missing, unreadable, truncated, not an image
            raise ValueError(f"cannot read image {os.fspath(image)!r}: {error}") from None
    if not isinstance(image, Image.Image):
        raise ValueError(f"an image must be a file path or a PIL image, got {type(image).__name__}")
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """The size Qwen's image processor resizes to: sides multiples of `factor` (patch * merge),
    aspect ratio kept, pixel count within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image aspect ratio {height}x{width} is more than 200")
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
        self.merge_size = image_processor.merge_size
        self.factor = image_processor.patch_size * image_processor.merge_size
        self.byte_values = self._byte_values(image_processor)  # (3, 256) float32, see model_pixels
        # The fixed parts of the template, with their special tokens parsed.
        self.prefix_ids = self._ids(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n", True)
        self.suffix_ids = self._ids("<|im_end|>\n<|im_start|>assistant\n<|endoftext|>", True)
        if self.suffix_ids[-1] != self.pad_id or self.image_pad_id == tokenizer.unk_token_id:
            raise ValueError("tokenizer lacks the Qwen special tokens (<|endoftext|>, <|image_pad|>, ...)")
        if max_length < len(self.prefix_ids) + len(self.suffix_ids) + 1:
            raise ValueError(f"max_length={max_length} cannot hold the prompt template")

    @classmethod
    def from_pretrained(cls, path, max_length=8192, min_pixels=None, max_pixels=None):
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True)
        size = dict(image_processor.size)
        size["shortest_edge"] = min_pixels or size["shortest_edge"]
        size["longest_edge"] = max_pixels or size["longest_edge"]
        if size["shortest_edge"] > size["longest_edge"]:
            raise ValueError(f"min_pixels {size['shortest_edge']} > max_pixels {size['longest_edge']}")
        image_processor.size = size
        return cls(tokenizer, image_processor, max_length)

    @property
    def min_pixels(self):
        return self.image_processor.size["shortest_edge"]

    @property
    def max_pixels(self):
        return self.image_processor.size["longest_edge"]

    def _ids(self, text, special=False):
        # User text never injects control tokens: a literal "<|im_end|>" in data stays text.
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]

    def image_grid(self, height, width):
        """(grid_h, grid_w) in patches of an image of this size after resizing."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        patch = self.image_processor.patch_size
        return h // patch, w // patch

    def _split_text(self, text, has_image):
        """Text before and after the image. Without a marker the image leads; without an image the
        marker is dropped (never fed as literal text)."""
        before, marker, after = text.partition(IMAGE_MARKER)
        if not marker:
            before, after = "", text
        after = after.replace(IMAGE_MARKER, "")  # only one image per item
        if not has_image:
            return "", before + after
        return before, after

    def _text_ids(self, text, has_image, num_image_tokens):
        """Token ids of the text before and after the image, truncated from the end of the text
        itself so the image placeholders and the closing template always survive."""
        before, after = self._split_text(text, has_image)
        before_ids, after_ids = self._ids(before) if before else [], self._ids(after) if after else []
        fixed = len(self.prefix_ids) + len(self.suffix_ids) + (num_image_tokens + 2 if has_image else 0)
        budget = self.max_length - fixed
        if budget < 0:
            raise ValueError(f"an image of {num_image_tokens} tokens does not fit max_length={self.max_length}; "
                             "lower max_pixels or raise max_length")
        after_ids = after_ids[:max(0, budget - len(before_ids))]
        return before_ids[:budget], after_ids

    def num_tokens(self, text, image=None):
        """Exact sequence length of an item, reading only the image header: for length-sorted batching."""
        num_image_tokens = 0
        if image is not None:
            width, height = _image_size(image)
            grid_h, grid_w = self.image_grid(height, width)
            num_image_tokens = grid_h * grid_w // self.merge_size**2
        before, after = self._text_ids(text or "", image is not None, num_image_tokens)
        extra = num_image_tokens + 2 if image is not None else 0
        return len(self.prefix_ids) + len(before) + extra + len(after) + len(self.suffix_ids)

    def __call__(self, text, image=None):
        """One item -> {"input_ids": (L,), "position_ids": (3, L)} plus, with an image,
        {"pixel_values": (P, 3 * patch * patch) uint8 (see patches()), "image_grid_thw": (1, 3)}."""
        text = text or ""
        if not text.strip() and image is None:
            raise ValueError("an item needs text or an image; this one has neither")
        feature = {}
        num_image_tokens = grid_h = grid_w = 0
        if image is not None:
            feature["pixel_values"], grid_h, grid_w = self.patches(load_image(image))  # (P, 3 * patch * patch) uint8
            feature["image_grid_thw"] = torch.tensor([[1, grid_h, grid_w]])  # (1, 3)
            num_image_tokens = grid_h * grid_w // self.merge_size**2
        before, after = self._text_ids(text, image is not None, num_image_tokens)
        head = self.prefix_ids + before
        tail = after + self.suffix_ids
        if image is None:
            ids = head + tail
            positions = torch.arange(len(ids)).expand(3, -1)
        else:
            head = head + [self.vision_start_id]
            tail = [self.vision_end_id] + tail
            ids = head + [self.image_pad_id] * num_image_tokens + tail
            positions = _mrope_positions(len(head), grid_h // self.merge_size, grid_w // self.merge_size, len(tail))
        feature["input_ids"] = torch.tensor(ids, dtype=torch.long)
        feature["position_ids"] = positions.contiguous()
        return feature

    def patches(self, image):
        """An RGB PIL image -> ((P, 3 * patch * patch) uint8 patches, grid_h, grid_w), P = grid_h * grid_w.
        Resized as transformers' Qwen2-VL processor resizes (smart_resize, its resampling) and cut into
        patches in its order, merge groups together, but left as bytes and without the temporal copy:
        8x fewer bytes through the DataLoader and to the device. model_pixels() finishes the job there."""
        patch, merge = self.image_processor.patch_size, self.merge_size
        grid_h, grid_w = self.image_grid(image.height, image.width)
        h, w = grid_h * patch, grid_w * patch
        if (w, h) != image.size:
            image = image.resize((w, h), resample=self.image_processor.resample)
        x = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)  # (3, h, w) uint8
        x = x.reshape(3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        x = x.permute(1, 4, 2, 5, 0, 3, 6)  # (grid_h/m, grid_w/m, m, m, 3, patch, patch)
        return x.reshape(grid_h * grid_w, 3 * patch * patch), grid_h, grid_w

    @staticmethod
    def _byte_values(image_processor):
        """(3, 256) float32: each channel's byte value rescaled and normalised with the very numpy operations
        of transformers' processor (float64 rescale, then float32), so the lookup is exact."""
        values = np.tile(np.arange(256, dtype=np.float64), (3, 1))  # (3, 256)
        if image_processor.do_rescale:
            values = values * image_processor.rescale_factor
        values = values.astype(np.float32)
        if image_processor.do_normalize:
            mean = np.array(image_processor.image_mean, dtype=np.float32)[:, None]
            std = np.array(image_processor.image_std, dtype=np.float32)[:, None]
            values = (values - mean) / std
        return torch.from_numpy(values)

    def model_pixels(self, patches, byte_values=None):
        """(P, 3 * patch * patch) uint8 patches, on any device -> (P, 3 * temporal * patch * patch) float32
        pixel_values, exactly those of transformers' processor: a table lookup per byte, then each patch
        repeated over the temporal patch (a still image is `temporal` identical frames). Embedder passes
        its own copy of the table, already on the device."""
        values = (self.byte_values if byte_values is None else byte_values).to(patches.device)  # (3, 256)
        x = patches.view(patches.shape[0], 3, -1).long()  # (P, 3, patch * patch)
        x = values[torch.arange(3, device=x.device)[None, :, None], x]  # (P, 3, patch * patch) float32
        temporal = self.image_processor.temporal_patch_size
        return x[:, :, None, :].expand(-1, -1, temporal, -1).reshape(x.shape[0], -1)

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


def _image_size(image):
    if isinstance(image, Image.Image):
        return image.size
    try:
        with Image.open(image) as opened:  # reads the header only
            return opened.size
    except Exception as error:
        raise ValueError(f"cannot read image {os.fspath(image)!r}: {error}") from None


def _mrope_positions(num_head, grid_h, grid_w, num_tail):
    """3-D rotary positions (temporal, height, width) of text + one image + text, as Qwen3.5 defines
    them: text counts up on all three axes; the image's merged grid spans rows and columns from the
    position where it starts; text after it resumes at start + max(grid_h, grid_w). -> (3, L)"""
    head = torch.arange(num_head).expand(3, -1)
    rows = torch.arange(grid_h).repeat_interleave(grid_w)
    cols = torch.arange(grid_w).repeat(grid_h)
    image = torch.stack([torch.zeros_like(rows), rows, cols]) + num_head
    start = num_head + max(grid_h, grid_w)
    tail = torch.arange(start, start + num_tail).expand(3, -1)
    return torch.cat([head, image, tail], dim=1)


# -----------------------------------------------------------------------------
# the embedder

class Embedder(nn.Module):
    """Qwen3.5 backbone + last-token pooling. Holds transformers' Qwen3_5Model as `self.model`
    (`model.visual`: frozen vision tower and merger; `model.language_model`: the trained part)."""

    def __init__(self, model, preprocessor):
        super().__init__()
        self.model = model
        self.preprocessor = preprocessor
        self.model.config.use_cache = False
        self.model.visual.requires_grad_(False)  # frozen in both stages (paper, Section 4)
        # the pixel lookup table, kept on the model's device (not saved): no host-to-device copy a forward
        self.register_buffer("byte_values", preprocessor.byte_values.clone(), persistent=False)

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, max_length=8192, min_pixels=None, max_pixels=None):
        """Load a local Hugging Face Qwen3.5 folder (a release, or an export/ of this project)."""
        from transformers import AutoConfig, Qwen3_5Model
        path = os.fspath(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != "qwen3_5":
            raise ValueError(f"{path}: model_type {config.model_type!r}; this project needs a Qwen3.5 'qwen3_5' checkpoint")
        model = Qwen3_5Model.from_pretrained(path, config=config, dtype=dtype, local_files_only=True,
                                             attn_implementation="sdpa")
        preprocessor = Preprocessor.from_pretrained(path, max_length, min_pixels, max_pixels)
        return cls(model, preprocessor)

    @property
    def dim(self):
        return self.model.config.text_config.hidden_size

    def forward(self, input_ids, attention_mask, position_ids, mm_token_type_ids=None,
                pixel_values=None, image_grid_thw=None):
        """A collated batch -> (B, D) float32 embeddings: the hidden state at each row's last token.
        pixel_values may be the Preprocessor's uint8 patches (made model-ready here, on the device) or
        transformers' float pixel_values."""
        if pixel_values is not None and pixel_values.dtype == torch.uint8:
            pixel_values = self.preprocessor.model_pixels(pixel_values, self.byte_values)
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            mm_token_type_ids=mm_token_type_ids, pixel_values=pixel_values,
                            image_grid_thw=image_grid_thw, use_cache=False).last_hidden_state  # (B, L, D)
        last = attention_mask.sum(dim=1) - 1  # (B,) right padding: the pooled <|endoftext|>
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()

    @torch.no_grad()
    def encode(self, items, batch_size=16, num_workers=0, progress=False):
        """items: list of {"text": str, "image": path | PIL image | None} -> (N, D) float32, input order.
        Items are sorted by length and batched so little compute goes to padding."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        batches = length_sorted_batches([_named(i, self.preprocessor.num_tokens, *_item(i, it))
                                         for i, it in enumerate(items)], batch_size)
        dataset = _EncodeBatches(items, batches, self.preprocessor)
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers)
        out = torch.empty(len(items), self.dim)
        done, start, last_print = 0, time.time(), time.time()
        for indices, batch in zip(batches, loader):
            batch = {k: v.to(device, non_blocking=True) if v is not None else None for k, v in batch.items()}
            out[indices] = self(**batch).cpu()
            done += len(indices)
            if progress and (done == len(items) or time.time() - last_print > 10):
                last_print = time.time()
                print(f"encoded {done}/{len(items)} items, {done / (last_print - start):.1f} items/s", flush=True)
        self.train(was_training)
        return out


# -----------------------------------------------------------------------------
# processes

def compute_init(device):
    """-> (rank, local_rank, world_size, torch.device). Under torchrun (RANK set) it joins the process
    group: NCCL on GPU, gloo on CPU. Without torchrun, one process on `device`. train.py and eval.py."""
    import torch.distributed as dist
    if "RANK" not in os.environ:
        return 0, 0, 1, torch.device(device)
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        return rank, local_rank, world, torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return rank, local_rank, world, torch.device("cpu")


# -----------------------------------------------------------------------------
# checkpoints: Hugging Face folders (releases, export/) and training step folders

CHECKPOINT_INFO = "pace.json"  # beside the weights: how the model was trained (similarity, LoRA, step)
HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                 "merges.txt", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                 "preprocessor_config.json", "video_preprocessor_config.json")


def read_checkpoint_info(path):
    """The pace.json of an export/ or step folder ({} for a plain release)."""
    info_path = os.path.join(path, CHECKPOINT_INFO)
    if not os.path.isfile(info_path):
        return {}
    with open(info_path) as f:
        return json.load(f)


def load_embedder(path, dtype=torch.float32, **preprocessor_args):
    """Any checkpoint this project meets -> (Embedder, info).
    - a Hugging Face folder (a release or an export/): loaded as is;
    - a training step folder (out_dir/step_NNNNNN, written by train.py): the backbone it names is
      loaded, LoRA adapters are injected if that run trained them, and the sharded weights are read
      with torch.distributed.checkpoint (one process or all ranks alike)."""
    path = os.fspath(path)
    info = read_checkpoint_info(path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return Embedder.from_pretrained(path, dtype, **preprocessor_args), info
    if not info or not os.path.isfile(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"{path!r} is neither a Hugging Face folder (config.json) nor a training step folder "
                                f"({CHECKPOINT_INFO} and .metadata)")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    embedder = Embedder.from_pretrained(info["backbone"], dtype, **preprocessor_args)
    if info.get("lora_rank", 0) > 0:
        from lora import inject_lora
        inject_lora(embedder.model, info["lora_rank"], info["lora_alpha"])
    state = {"model": get_model_state_dict(embedder)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(embedder, state["model"])
    return embedder, info


def save_hf_folder(state_dict, backbone, out_dir, info):
    """Write a consolidated Embedder state_dict (keys "model.visual...", "model.language_model..."; LoRA
    already merged) as a Hugging Face folder in the release layout, so both Embedder.from_pretrained and
    plain transformers (Qwen3_5ForConditionalGeneration) load it. Atomic: written aside, then renamed."""
    import shutil
    from safetensors.torch import save_file
    if any("lora_" in key for key in state_dict):
        raise ValueError("merge the LoRA adapters (lora.merge_lora) before saving a Hugging Face folder")
    tmp_dir = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    for name in HF_SIDE_FILES:
        if os.path.isfile(os.path.join(backbone, name)):
            shutil.copy(os.path.join(backbone, name), tmp_dir)
    tensors = {key: value.detach().cpu().contiguous() for key, value in state_dict.items()}
    save_file(tensors, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp_dir, CHECKPOINT_INFO), "w") as f:
        json.dump(info, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)


def _item(index, item):
    """Validate one encode() item -> (text, image), naming the item on error."""
    if not isinstance(item, dict) or not ({"text", "image"} & set(item)):
        raise ValueError(f"item {index}: expected a dict with 'text' and/or 'image', got {item!r:.80}")
    text, image = item.get("text") or "", item.get("image")
    if not text.strip() and image is None:
        raise ValueError(f"item {index}: has no text and no image")
    return text, image


def _named(index, function, *args):
    """function(*args), with a ValueError naming the item it came from."""
    try:
        return function(*args)
    except ValueError as error:
        raise ValueError(f"item {index}: {error}") from None


def length_sorted_batches(lengths, batch_size):
    """Index batches of items sorted by length, longest first (an out-of-memory error shows at once)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


class _EncodeBatches(torch.utils.data.Dataset):
    """Batch k of encode(): preprocess its items (in a worker when num_workers > 0) and collate."""

    def __init__(self, items, batches, preprocessor):
        self.items, self.batches, self.preprocessor = items, batches, preprocessor

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, k):
        features = [_named(i, self.preprocessor, *_item(i, self.items[i])) for i in self.batches[k]]
        return self.preprocessor.collate(features)


# -----------------------------------------------------------------------------
# a tiny random Qwen3.5 in the layout of a real release

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                       "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]


def _tiny_tokenizer(vocab_size=1024):
    """A byte-level BPE trained on a fixed English corpus: deterministic, Qwen's special tokens on top."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    words = ("system user assistant represent the user's input given image to answer following question retrieve an that best matches "
             "description find caption describes this matching described changes what is shape colour color "
             "of a in on at left right top bottom middle center small large big tiny circle square triangle "
             "star cross diamond red green blue yellow purple orange black white gray pink brown cyan how many "
             "objects there are picture photo showing with and one two three four five six which where near far "
             "above below next select box region object from query candidate answer yes no true false").split()
    corpus = [" ".join(words[i:i + 7]) for i in range(len(words))] * 4 + ["0 1 2 3 4 5 6 7 8 9 , . ? ! : ; - ( )"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TINY_SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens(TINY_SPECIAL_TOKENS)
    return tokenizer


def make_tiny_checkpoint(out_dir, seed=0):
    """Write a tiny random Qwen3.5 (text and vision; Gated DeltaNet and full-attention layers) with a
    byte-level BPE tokenizer into out_dir, in the file layout of a Qwen3.5-0.8B-Base release. -> out_dir"""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers import PreTrainedTokenizerFast
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _tiny_tokenizer()
    token = tokenizer.token_to_id
    hidden = 64
    config = Qwen3_5Config(
        text_config=dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=hidden, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_conv_kernel_dim=4,
                         layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=8192,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                                              mrope_section=[2, 1, 1], mrope_interleaved=True),
                         tie_word_embeddings=True, eos_token_id=token("<|endoftext|>")),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64),
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
        tie_word_embeddings=True)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    with torch.no_grad():
        # transformers' 0.02-std init leaves the residual stream to the token embedding, so every item
        # pooled at the same <|endoftext|> would look alike; unit-variance layers make context count.
        # The vision blocks keep the small init, so the residual stream still carries the patch pixels.
        for name, param in model.named_parameters():
            if param.dim() >= 2 and ".visual.blocks." not in name:
                fan_in = param[0].numel()
                param.normal_(0.0, 1.0 if "embed_tokens" in name else fan_in ** -0.5)
            elif name.endswith("linear_attn.A_log"):
                # Gated DeltaNet keeps exp(-A * softplus(a + dt_bias)) of its state per token. The stock
                # A, up to 16, forgets within a token, so images would reach the pooled token only through
                # the one full-attention layer; A in [0.005, 0.05] remembers tens of tokens, and two
                # pictures of different colours then give cos 0.95, not 0.999 (tests/test_model.py).
                param.copy_(torch.empty_like(param).uniform_(0.005, 0.05).log())
    model.save_pretrained(out_dir)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            unk_token=None).save_pretrained(out_dir)
    # the class a Qwen3.5 release names; transformers maps it onto tokenizer.json
    _update_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_class="Qwen2Tokenizer",
                 model_max_length=8192)
    image = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
                 image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    _update_json(os.path.join(out_dir, "preprocessor_config.json"), image_processor_type="Qwen2VLImageProcessor", **image)
    _update_json(os.path.join(out_dir, "video_preprocessor_config.json"),
                 video_processor_type="Qwen3VLVideoProcessor", **image)
    return out_dir


def _update_json(path, **values):
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data.update(values)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")

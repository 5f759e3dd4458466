"""
model.py: the PACE embedder, a Qwen vision-language backbone turned into an embedding model.

    embedder = Embedder.from_pretrained("/models/Qwen3.5-0.8B-Base")   # a local folder, nothing downloaded
    vectors = embedder.encode([{"text": "a red circle", "image": None}, {"text": "<|video_1|> What happens?",
                               "video": ["f1.jpg", "f2.jpg"]}])         # (2, D) float32, as embedder.spec says

Every query, positive and negative is encoded alone under one prompt (paper, Appendix A.2):

    <|im_start|>system
    Represent the user's input.<|im_end|>
    <|im_start|>user
    {the image (or video) through vision placeholders, then the text}<|im_end|>
    <|im_start|>assistant
    <|endoftext|>

and its embedding is the final hidden state at that last <|endoftext|> (last-token pooling), float32, not
normalised: Stage I's cosine (eq. 1) normalises inside the loss, Stage II's dot product (eq. 2) uses the norm.
EmbeddingSpec says what a vector means; FAMILIES and POOLINGS what differs between backbones and poolings.
"""
import dataclasses
import json
import logging
import os

import torch
import torch.nn as nn

import deltanet
import loss
from common import Progress, UserError, write_json
from media import IMAGE_MARKER, VIDEO_MARKER, Vision, frame_choice, frames_of, image_size, load_image, visual_name

SPEC_FILE = "embedding_spec.json"  # beside the weights of every step folder and export: the EmbeddingSpec
MARKERS = {"image": IMAGE_MARKER, "video": VIDEO_MARKER}

# runs/cost.py's kernel_report says once what transformers says twice a process at the first forward
logging.getLogger("transformers.integrations.hub_kernels").addFilter(
    lambda record: "falling back to its reference PyTorch implementation" not in record.getMessage())


@dataclasses.dataclass(frozen=True)
class Family:  # what differs between backbone families (config.json's model_type); everything else is shared
    name: str  # as the model card names it
    model_class: str  # transformers' class without an LM head: the Embedder's model
    tokenizer_class: str  # transformers' class for the folder's tokenizer.json
    linear_attention: bool  # text_config.layer_types mixes in Gated DeltaNet layers (the FLOP count reads them)


FAMILIES = {  # a third family: an entry here, a tiny checkpoint in shapes/tiny_model.py; see docs/forks.md
    # Qwen3_5Tokenizer, not the Qwen2Tokenizer a release names: before transformers 5.18 its split ignored combining marks
    "qwen3_5": Family("Qwen3.5", "Qwen3_5Model", "Qwen3_5Tokenizer", True),
    "qwen3_vl": Family("Qwen3-VL", "Qwen3VLModel", "Qwen2Tokenizer", False),
}


def family_of(path):  # the Family of a local Hugging Face folder, by its config.json's model_type
    try:
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError) as error:
        raise UserError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)" if isinstance(
            error, FileNotFoundError) else f"{path}/config.json: not a Hugging Face config ({error})") from None
    if model_type not in FAMILIES:
        raise UserError(f"{path}: model_type {model_type!r}; this project reads "
                        + ", ".join(f"{f.name} ({t!r})" for t, f in FAMILIES.items()) + " checkpoints")
    return FAMILIES[model_type]


def as_user_error(function, *args):  # function(*args), its ValueError (media.py's, naming the file) a UserError
    try:
        return function(*args)
    except ValueError as error:
        raise UserError(str(error)) from None


def last_token(hidden, mask):  # (B, L, D), (B, L) right-padded -> (B, D): each row's last real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.sum(dim=1) - 1]


def mean_of_tokens(hidden, mask):  # (B, L, D), (B, L) -> (B, D): the mean over each row's real tokens, in float32
    weights = mask.unsqueeze(-1).float()  # (B, L, 1)
    return (hidden.float() * weights).sum(dim=1) / weights.sum(dim=1)


@dataclasses.dataclass(frozen=True)
class Pooling:  # a pooling choice and all that follows from it: the vector, and how an export says it
    pool: object  # (B, L, D) final hidden states, (B, L) attention mask -> (B, D)
    sentence_transformers: str  # the pooling_mode of sentence-transformers' Pooling module
    words: str  # the model card's
    code: str  # the card's plain-transformers expression of it: over `hidden`, one item's (L, D) final states, and torch


POOLINGS = {
    "last_token": Pooling(last_token, "lasttoken", "the last layer's hidden state at the final `<|endoftext|>`",
                          "hidden[-1]"),
    "mean": Pooling(mean_of_tokens, "mean", "the mean of the last layer's hidden states over every token of the prompt",
                    "hidden.mean(dim=0)"),
}


@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
    """What defines an embedding: two vectors compare only if every field agrees. Each field but the lineage
    (backbone) is a config key of train.py, with this default and comment."""
    system_prompt: str = "Represent the user's input."  # the system turn of the embedding prompt (Appendix A.2)
    pooling: str = "last_token"  # the embedding: a key of model.POOLINGS ('last_token': the state at the last <|endoftext|>)
    similarity: str = "cos"  # how two vectors compare: 'cos' (eq. 1, Stage I) or 'dot' (eq. 2, Stage II)
    max_length: int = 8192  # tokens an item may take; text is cut, never the image or the template
    min_pixels: int = 0  # an image's fewest pixels, as the image processor resizes it (0: the checkpoint's own)
    max_pixels: int = 1605632  # an image's most pixels (the paper's 1,605,632)
    video_frames: int = 8  # frames a video keeps, spread evenly (VLM2Vec-V2's MMEB-V2 budget)
    video_min_pixels: int = 0  # a video's fewest pixels over all its frames, t * h * w (0: the checkpoint's own)
    video_max_pixels: int = 0  # a video's most pixels over all its frames (0: the checkpoint's own)
    video_fps: float = 2.0  # the frame rate its timestamps assume (Qwen3-VL's video processor samples at 2)
    dim: int = 0  # a vector's dimensions: the pooled state's first dim (Matryoshka's truncation); 0: all of it
    matryoshka_dims: tuple = ()  # the leading prefixes trained beside the whole vector (MRL), increasing; (): none
    backbone: str = ""  # the Hugging Face release folder the weights descend from (absolute path)

    def __post_init__(self):
        for key, allowed in (("pooling", tuple(POOLINGS)), ("similarity", loss.SIMILARITIES)):
            if getattr(self, key) not in allowed:
                raise UserError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {getattr(self, key)!r}")
        if not (isinstance(self.video_frames, int) and self.video_frames >= 1 and self.video_fps > 0):
            raise UserError(f"video_frames must be 1 or more and video_fps above 0, got {self.video_frames!r} and "
                            f"{self.video_fps!r}")
        dims = tuple(self.matryoshka_dims)
        object.__setattr__(self, "matryoshka_dims", dims)  # a JSON list or a config's list, as a tuple
        if not (isinstance(self.dim, int) and self.dim >= 0 and all(isinstance(d, int) and d > 0 for d in dims)
                and list(dims) == sorted(set(dims))):
            raise UserError(f"dim must be 0 or more and matryoshka_dims increasing positive dimensions, got "
                            f"dim={self.dim!r}, matryoshka_dims={list(dims)!r}")

    fields = classmethod(lambda cls: [field.name for field in dataclasses.fields(cls)])
    defaults = classmethod(lambda cls: {k: v for k, v in dataclasses.asdict(cls()).items() if k != "backbone"})
    to_dict = dataclasses.asdict

    def replace(self, **changes):  # a copy with some fields changed; None, '' or 0 keeps a field
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v not in (None, "", 0)})

    def save(self, folder):
        write_json(os.path.join(folder, SPEC_FILE), self.to_dict())

    @classmethod
    def load(cls, folder):  # the spec stored in folder (SPEC_FILE), or None where there is none (a release)
        path = os.path.join(folder, SPEC_FILE)
        try:
            with open(path) as f:
                return cls(**json.load(f))  # an unknown field is a TypeError naming it
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as error:
            raise UserError(f"{path}: not an embedding spec ({error})") from None


class Preprocessor:
    """One item -> its prompt's token ids, 3-D rotary positions and uint8 patches, as spec says; vision["image"],
    vision["video"] (media.Vision): the processors' settings under the spec's pixel budgets. Runs in DataLoader workers."""

    fit_images = False  # eval, search, mining: an image or video too large for max_length is shrunk to fit

    def __init__(self, tokenizer, vision, spec=EmbeddingSpec()):
        from tokenizers import Tokenizer
        self.tokenizer, self.vision, self.spec = tokenizer, vision, spec
        definition = json.loads(tokenizer.backend_tokenizer.to_str())
        self.plain = Tokenizer.from_str(json.dumps(dict(definition, added_tokens=[])))  # for user text: ids()
        self.max_length = spec.max_length
        token = tokenizer.convert_tokens_to_ids
        self.pad_ids = {"image": token("<|image_pad|>"), "video": token("<|video_pad|>")}
        self.vision_start_id, self.vision_end_id, self.pad_id = map(token, ("<|vision_start|>", "<|vision_end|>",
                                                                            "<|endoftext|>"))
        self.shrunk = []  # with fit_images: the images and videos found too large, each time num_tokens met one
        self.prefix_ids = self.ids(f"<|im_start|>system\n{spec.system_prompt}<|im_end|>\n<|im_start|>user\n", True)
        self.suffix_ids = self.ids("<|im_end|>\n<|im_start|>assistant\n<|endoftext|>", True)
        if self.suffix_ids[-1] != self.pad_id or tokenizer.unk_token_id in self.pad_ids.values():
            raise UserError("tokenizer lacks the Qwen special tokens (<|endoftext|>, <|image_pad|>, ...)")
        if self.max_length < len(self.prefix_ids) + len(self.suffix_ids) + 1:
            raise UserError(f"max_length={self.max_length} cannot hold the prompt template")

    @classmethod
    def from_pretrained(cls, path, spec=None, **changes):
        """The tokenizer and processor settings of a local folder, under spec (EmbeddingSpec()) with changes (0 or
        None keeps a field). A pixel budget of 0 becomes the folder's own, in numbers in the returned spec."""
        import transformers
        tokenizer = getattr(transformers, family_of(path).tokenizer_class).from_pretrained(path, local_files_only=True)
        spec, budgets, vision = (spec or EmbeddingSpec()).replace(**changes), {}, {}
        for kind, prefix in (("image", ""), ("video", "video_")):
            processor = as_user_error(Vision.from_pretrained, path, kind)
            low = budgets[f"{prefix}min_pixels"] = getattr(spec, f"{prefix}min_pixels") or processor.size["shortest_edge"]
            high = budgets[f"{prefix}max_pixels"] = getattr(spec, f"{prefix}max_pixels") or processor.size["longest_edge"]
            if low > high:
                raise UserError(f"{prefix}min_pixels {low} > {prefix}max_pixels {high}")
            vision[kind] = processor.with_budget(low, high)
        return cls(tokenizer, vision, dataclasses.replace(spec, **budgets))

    def ids(self, text, special=False):
        """Token ids of text. special: the template's own, its control tokens parsed. Else user text, which never
        injects one: every added token stays text (also "<think>", which a release marks non-special)."""
        if special:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.plain.encode(text, add_special_tokens=False).ids

    def split_text(self, text, marker=None):
        """An item's text -> (the text before its visual, the text after it), at marker (MARKERS; None: no visual);
        without it the visual leads. Other markers go with the newline or space after them (mmE5's image-less
        queries carry "<|image_1|>\n")."""
        for other in [m for m in MARKERS.values() if m != marker]:
            head, found, tail = text.partition(other)
            tail = tail.replace(other, "")
            text = head + (tail[1:] if found and tail[:1] in ("\n", " ") else tail)
        before, found, after = text.partition(marker) if marker else ("", "", text)
        return (before, after.replace(marker, "")) if found else ("", text)  # one image or video per item

    def text_ids(self, text, marker=None, visual_tokens=0):
        """Token ids of the text before and after the item's visual of visual_tokens (split_text), cut from the
        text's end, so the visual and the template always survive."""
        before, after = self.split_text(text, marker)
        before_ids, after_ids = self.ids(before) if before else [], self.ids(after) if after else []
        budget = self.max_length - len(self.prefix_ids) - len(self.suffix_ids) - visual_tokens
        return before_ids[:budget], after_ids[:max(0, budget - len(before_ids))]

    def visual(self, image=None, video=None):  # -> (its kind, the frames it keeps: paths or PIL images) or (None, [])
        if image is not None and video is not None:
            raise UserError("an item holds an image or a video, not both")
        if video is None:
            return ("image", [image]) if image is not None else (None, [])
        frames = as_user_error(frames_of, video)
        return "video", [frames[k] for k in frame_choice(len(frames), self.spec.video_frames)]

    def overhead(self, kind, num_frames):  # tokens besides the pads: vision start and end, a video's timestamps
        stamps = self.vision[kind].timestamps(num_frames, self.spec.video_fps) or [""]
        return sum(len(self.ids(stamp)) + 2 for stamp in stamps)

    def grid(self, kind, frames, size, text=None, count=False):
        """(grid_t, grid_h, grid_w) of a visual's kept frames, the first of size (width, height) (media.Vision.grid);
        with fit_images and the text, the largest that fits max_length beside it (or half the room, for a long one),
        a shrunk one recorded in self.shrunk when count. Errors name the visual."""
        room = None
        if self.fit_images and text is not None:
            room = self.max_length - len(self.prefix_ids) - len(self.suffix_ids) - self.overhead(kind, len(frames))
            room -= min(sum(map(len, self.text_ids(text, MARKERS[kind]))), room // 2)
        try:
            grid = self.vision[kind].grid(len(frames), size[1], size[0], room)
            if count and room is not None and grid != self.vision[kind].grid(len(frames), size[1], size[0]):
                self.shrunk.append(visual_name(frames, kind))  # counted where the items are batched
            return grid
        except ValueError as error:  # e.g. an aspect ratio over 200
            raise UserError(f"{visual_name(frames, kind)}: {error}") from None

    def visual_tokens(self, text, kind, frames, grid):
        """A visual item's tokens without the template -> (ids, pieces for mrope_positions), as transformers' Qwen
        processors lay them out, at the marker, else first: per temporal patch (an image has one) a video's
        timestamp as text, <|vision_start|>, a pad per merged patch, <|vision_end|>. Too long: a UserError naming it."""
        stamps = self.vision[kind].timestamps(len(frames), self.spec.video_fps)
        stamp_ids = [self.ids(stamp) for stamp in stamps] or [[]]
        merge = self.vision[kind].merge_size
        grid_t, rows, cols = grid[0], grid[1] // merge, grid[2] // merge
        tokens = grid_t * rows * cols + self.overhead(kind, len(frames))
        if len(self.prefix_ids) + tokens + len(self.suffix_ids) > self.max_length:
            budgets = "video_max_pixels or video_frames" if stamps else "max_pixels"
            raise UserError(f"{visual_name(frames, kind)}: its {tokens} tokens ({grid_t} x {rows * cols} merged patches) "
                            f"do not fit max_length={self.max_length}; lower {budgets}, or raise max_length")
        before, after = self.text_ids(text, MARKERS[kind], tokens)
        head, whole = before + stamp_ids[0], self.split_text(text, MARKERS[kind])[0]
        if stamps and before and len(before) == len(self.ids(whole)):  # transformers tokenises the text before a
            joint = self.ids(whole + stamps[0])  # video with its first stamp, whose "<" joins a space or colon before it
            head = joint if len(joint) <= len(head) else head
        ids, pieces = [], []
        for k in range(grid_t):  # a grid piece per temporal patch, as get_rope_index splits a video
            run = (head if k == 0 else [self.vision_end_id] + stamp_ids[k]) + [self.vision_start_id]
            ids, pieces = ids + run + [self.pad_ids[kind]] * (rows * cols), pieces + [len(run), (rows, cols)]
        return ids + [self.vision_end_id] + after, pieces + [len(after) + 1]

    def num_tokens(self, text, image=None, video=None):
        """An item's exact length, from its image's header or its video's first kept frame's: for sorted batches."""
        text, (kind, frames) = text or "", self.visual(image, video)
        if kind is None:
            return len(self.prefix_ids) + sum(map(len, self.text_ids(text))) + len(self.suffix_ids)
        grid = self.grid(kind, frames, as_user_error(image_size, frames[0]), text, count=True)
        return len(self.prefix_ids) + len(self.visual_tokens(text, kind, frames, grid)[0]) + len(self.suffix_ids)

    def __call__(self, text, image=None, video=None):
        """One item -> {"input_ids": (L,), "position_ids": (3, L)} and its uint8 patches and grid (1, 3):
        "pixel_values", "image_grid_thw" or "pixel_values_videos", "video_grid_thw". An item with neither text nor a
        visual is the prompt around nothing, as VLM2Vec embeds one (training refuses an empty query or positive)."""
        ids, pieces, patches, grid = self.item_tokens(text, image, video)
        names = ("pixel_values", "image_grid_thw") if video is None else ("pixel_values_videos", "video_grid_thw")
        feature = {} if patches is None else dict(zip(names, (patches, grid)))
        feature["input_ids"] = torch.tensor(self.prefix_ids + ids + self.suffix_ids, dtype=torch.long)
        feature["position_ids"] = mrope_positions([len(self.prefix_ids)] + pieces + [len(self.suffix_ids)])  # (3, L)
        return feature

    def item_tokens(self, text, image=None, video=None):
        """An item's tokens without the template -> (ids, mrope pieces, its visual's uint8 patches, grid_thw (1, 3))."""
        text, (kind, kept) = text or "", self.visual(image, video)
        if kind is None:
            before, after = self.text_ids(text)
            return before + after, [len(before) + len(after)], None, None
        frames = [as_user_error(load_image, frame) for frame in kept]
        grid = self.grid(kind, kept, frames[0].size, text)
        ids, pieces = self.visual_tokens(text, kind, kept, grid)
        return ids, pieces, self.vision[kind].patches(frames, grid), torch.tensor([grid])

    def collate(self, features):
        """Right-padded batch of preprocessed items. Pooling reads position length-1 of each row."""
        size = (len(features), max(len(f["input_ids"]) for f in features))
        input_ids, attention_mask = torch.full(size, self.pad_id), torch.zeros(size, dtype=torch.long)
        position_ids = torch.zeros(3, *size, dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            input_ids[row, :n], attention_mask[row, :n], position_ids[:, row, :n] = feature["input_ids"], 1, feature["position_ids"]
        joined = {key: [f[key] for f in features if key in f] for key in
                  ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")}
        kinds = (input_ids == self.pad_ids["image"]).int() + 2 * (input_ids == self.pad_ids["video"]).int()
        return {
            "input_ids": input_ids,  # (B, L)
            "attention_mask": attention_mask,  # (B, L)
            "position_ids": position_ids,  # (3, B, L): temporal, height, width (M-RoPE)
            "mm_token_type_ids": kinds * attention_mask.int(),  # (B, L): 1 at image, 2 at video placeholders
            # the items' uint8 patches (P, 3 * patch * patch), (P', 3 * temporal * patch * patch), grids (n, 3), or None
            **{key: torch.cat(parts) if parts else None for key, parts in joined.items()},
        }


def mrope_positions(pieces):
    """3-D rotary positions (3, L) of text runs (ints: lengths) and grids ((rows, cols) of merged patches), as Qwen's
    get_rope_index: text counts up on all three axes; a grid spans rows and columns from where it starts, and the
    text after it resumes at start + max(rows, cols). A video is a grid per temporal patch."""
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


class Embedder(nn.Module):
    """A backbone + the spec's pooling: transformers' base model as `self.model` (`model.visual`: the frozen vision
    tower and merger; `model.language_model`: the trained part; no LM head)."""

    def __init__(self, model, preprocessor):
        super().__init__()
        self.model, self.preprocessor, self.model.config.use_cache = model, preprocessor, False
        self.model.visual.requires_grad_(False)  # frozen in both stages (paper, Appendix A.1)
        if self.family.linear_attention:  # Qwen3.5's Gated DeltaNet layers: fla's kernels where right, else ours
            deltanet.bind()
        # (3, 256) float32 on the model's device: each byte's pixel value, exactly as the processor computes it
        self.register_buffer("pixel_table", preprocessor.vision["image"].pixel_table(), persistent=False)
        self.register_buffer("video_pixel_table", preprocessor.vision["video"].pixel_table(), persistent=False)
        hidden, spec = model.config.text_config.hidden_size, preprocessor.spec
        if max((spec.dim, *spec.matryoshka_dims)) > hidden:
            raise UserError(f"dim={spec.dim} and matryoshka_dims={list(spec.matryoshka_dims)}: the backbone's vectors "
                            f"have {hidden} dimensions")

    @classmethod
    def from_pretrained(cls, path, dtype=torch.float32, spec=None, **changes):
        """A local Hugging Face folder of a family in FAMILIES: a release (EmbeddingSpec(), itself the backbone) or an
        export (the spec beside its weights). spec replaces that spec; changes (similarity=...) single fields."""
        import transformers
        path, model_class = os.fspath(path), getattr(transformers, family_of(path).model_class)
        spec = spec or EmbeddingSpec.load(path) or EmbeddingSpec(backbone=os.path.abspath(path))
        model = model_class.from_pretrained(path, dtype=dtype, local_files_only=True, attn_implementation="sdpa")
        return cls(model, Preprocessor.from_pretrained(path, spec, **changes))

    spec = property(lambda self: self.preprocessor.spec)  # what the vectors mean: the prompt is built from it
    family = property(lambda self: FAMILIES[self.model.config.model_type])
    dim = property(lambda self: self.spec.dim or self.model.config.text_config.hidden_size)  # of the vectors
    device = property(lambda self: self.pixel_table.device)  # where it computes: a buffer, which FSDP2 never shards

    def pixel_values(self, patches, video=False):
        """(P, 3 * patch * patch) uint8 patches -> (P, 3 * temporal * patch * patch) float32 pixel values, bit for bit
        the processor's: a lookup per byte, an image repeated over the temporal patch (a video holds its frames)."""
        x = patches.view(patches.shape[0], 3, -1).long()  # (P, 3, patch * patch), a video's (P, 3, temporal * ...)
        table = self.video_pixel_table if video else self.pixel_table
        x = table[torch.arange(3, device=x.device)[None, :, None], x]
        temporal = 1 if video else self.preprocessor.vision["image"].temporal_patch_size
        return x[:, :, None, :].expand(-1, -1, temporal, -1).reshape(x.shape[0], -1)

    def forward(self, input_ids, attention_mask, position_ids, mm_token_type_ids=None, pixel_values=None,
                image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None):
        """A collated batch, on any device -> (B, D) float32 embeddings, pooled as the spec says; pixel values may be
        the Preprocessor's uint8 patches or transformers' floats."""
        device = self.device
        move = lambda x: None if x is None else x.to(device, non_blocking=True)  # noqa: E731
        pixels = lambda x, video: self.pixel_values(x, video) if x is not None and x.dtype == torch.uint8 else x  # noqa: E731
        attention_mask = move(attention_mask)
        hidden = self.model(input_ids=move(input_ids), attention_mask=attention_mask, position_ids=move(position_ids),
                            mm_token_type_ids=move(mm_token_type_ids), pixel_values=pixels(move(pixel_values), False),
                            image_grid_thw=move(image_grid_thw), video_grid_thw=move(video_grid_thw),
                            pixel_values_videos=pixels(move(pixel_values_videos), True),
                            use_cache=False).last_hidden_state  # (B, L, D)
        pooled = POOLINGS[self.spec.pooling].pool(hidden, attention_mask).float()  # (B, D)
        return pooled[:, :self.spec.dim].clone() if self.spec.dim else pooled  # (B, dim); a copy: FSDP2 warns of views

    @torch.no_grad()
    def encode(self, items, batch_size=16, num_workers=0, progress=""):
        """[{"text", "image": path | PIL image | None} or {"text", "video": [frames]}] -> (N, D) float32 in input order,
        in batches of about one length, decoded in num_workers processes; progress: a label for a progress line."""
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

    def enable_activation_checkpointing(self):  # each decoder layer recomputed in backward: less memory, 1/3 more compute
        language_model = self.model.language_model  # transformers 5.23 renamed gradient_checkpointing_enable
        (getattr(language_model, "activation_checkpointing_enable", None)
         or language_model.gradient_checkpointing_enable)({"use_reentrant": False})


def item_inputs(index, item, function):
    """function(text, image, video) of one item dict; a UserError naming the item if it is malformed or fails."""
    if not isinstance(item, dict) or not ({"text", "image", "video"} & set(item)):
        raise UserError(f"item {index}: expected a dict with 'text' and/or 'image' or 'video', got {item!r:.80}")
    try:
        return function(item.get("text") or "", item.get("image"), item.get("video"))
    except ValueError as error:
        raise UserError(f"item {index}: {error}") from None


class Items(torch.utils.data.Dataset):  # items[i] preprocessed, in a worker when num_workers > 0
    def __init__(self, items, preprocessor):
        self.items, self.preprocessor = items, preprocessor

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return item_inputs(i, self.items[i], self.preprocessor)


def item_batches(items, preprocessor, batch_size, num_workers=0):  # -> (indices, collated batch) pairs
    lengths = [item_inputs(i, item, preprocessor.num_tokens) for i, item in enumerate(items)]
    return length_batches(Items(items, preprocessor), lengths, batch_size, num_workers, preprocessor.collate)


def length_batches(dataset, lengths, batch_size, num_workers, collate_fn):
    """(indices, collate_fn of their entries) pairs of batch_size entries of about one length, longest first (an
    out-of-memory error shows at once), built in num_workers DataLoader workers."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate_fn)
    return zip(batches, loader)

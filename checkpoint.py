"""
checkpoint.py: what train.py's folders hold on disk, and how they are checked before anything trusts them.

    out_dir/step_NNNNNN/   a training step: the sharded model and optimizer (torch.distributed.checkpoint:
                           .metadata and __<rank>_<n>.distcp), rng_rank<r>.pt per rank, and pace.json (step,
                           data position, config, and every file's size and CRC-32), written last
    out_dir/export/        the merged model as a Hugging Face folder (model.safetensors, config, tokenizer),
                           pace.json and a model card, README.md

A step folder is written under a .tmp name and renamed when complete, so a crash leaves no half-written one
that looks finished. verify() reads back each file's size and checksum: a truncated, emptied or corrupted
file names the folder and the file. Loading a step folder is safe: its .metadata pickle is read by an
unpickler that builds only the few classes such a file holds (load_state), and the shards' non-tensor entries
and the RNG files as plain data only (weights_only). The export's safetensors never run code.
"""
import glob
import json
import os
import pickle
import re
import shutil
import warnings
import zlib

import torch

from common import UserError, write_text
from model import SYSTEM_PROMPT, Embedder

# torch.distributed.checkpoint says this at every save and load in one process, which is how it is meant here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

INFO = "pace.json"  # beside the weights: how the model was trained, and the files to verify
STEP_NAME = re.compile(r"step_\d{6}$")


def step_path(out_dir, step):
    return os.path.join(out_dir, f"step_{step:06d}")


def complete(out_dir):
    """The complete step folders of out_dir (renamed from .tmp, pace.json inside), oldest first."""
    paths = [p for p in glob.glob(os.path.join(glob.escape(out_dir), "step_*")) if STEP_NAME.search(p)]
    return sorted(p for p in paths if os.path.isfile(os.path.join(p, INFO)))


def remove(path):
    """Delete a file or a folder, if it is there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def read_info(path):
    """The pace.json of an export/ or step folder; {} for a plain release. ValueError naming a broken one."""
    info_path = os.path.join(path, INFO)
    if not os.path.isfile(info_path):
        return {}
    try:
        with open(info_path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: broken checkpoint, cannot read {INFO} ({error})") from None


def fingerprint(path):
    """A short id of a checkpoint's weights. A step folder: its pace.json, which holds every file's CRC-32. A
    release or an export: its config.json and pace.json and the CRC-32 of every weight file (about a second a GB:
    two releases of one shape, a random and a trained one, differ only there). A copy elsewhere keeps the id."""
    import hashlib
    digest, info = hashlib.sha256(), read_info(path)
    for name in (INFO, "config.json"):
        if os.path.isfile(os.path.join(path, name)):
            with open(os.path.join(path, name), "rb") as f:
                digest.update(name.encode() + f.read())
    if not info.get("files"):
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                digest.update(f"{name}:{json.dumps(file_record(os.path.join(path, name)))}".encode())
    return digest.hexdigest()[:16]


def file_record(path):
    """{"bytes": size, "crc32": checksum}: what pace.json keeps of each file. CRC-32 reads at GB/s, little next to
    writing the shards; it catches a flipped byte, which the size alone would not."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return {"bytes": os.path.getsize(path), "crc32": crc}


def record_files(folder, rank, world_size):
    """Every rank records the files it wrote into folder (its shards __<rank>_*, its RNG state; rank 0 also
    .metadata); rank 0 gets them all, plus any file no rank claimed. -> {name: record} on rank 0, else {}."""
    names = os.listdir(folder)
    mine = [n for n in names if n.startswith(f"__{rank}_") or n == f"rng_rank{rank}.pt"
            or (rank == 0 and n == ".metadata")]
    records = {name: file_record(os.path.join(folder, name)) for name in mine}
    if world_size > 1:
        gathered = [None] * world_size
        torch.distributed.all_gather_object(gathered, records)
        records = {name: record for part in gathered for name, record in part.items()}
    if rank != 0:
        return {}
    for name in set(names) - set(records) - {INFO}:
        records[name] = file_record(os.path.join(folder, name))
    return dict(sorted(records.items()))


def verify(path):
    """A step folder -> its pace.json, once every file it lists has its recorded size and CRC-32 (sizes first:
    cheap, and a truncated or empty shard shows at once). ValueError naming the folder and the broken file."""
    info = read_info(path)
    if not info:
        raise UserError(f"{path}: not a step folder of this project (no {INFO})")
    files = info.get("files")
    if files is None:
        print(f"{path}: written before checkpoints recorded checksums; loading it unverified")
        return info
    for name, record in files.items():
        file = os.path.join(path, name)
        size = os.path.getsize(file) if os.path.isfile(file) else None
        if size != record["bytes"]:
            raise UserError(f"{path}: broken checkpoint, {name} is "
                             f"{'missing' if size is None else f'{size:,} bytes'}, {record['bytes']:,} written")
    for name, record in files.items():
        if file_record(os.path.join(path, name))["crc32"] != record["crc32"]:
            raise UserError(f"{path}: broken checkpoint, {name} has changed since it was written (CRC-32)")
    return info


def finish(tmp, path, info):
    """Complete a step folder written under tmp: pace.json last, then the rename that makes it a checkpoint."""
    with open(os.path.join(tmp, INFO), "w") as f:
        json.dump(info, f, indent=2)
    remove(path)
    os.replace(tmp, path)


def load_rng(path):
    """A rank's RNG states, read as tensors only: a shared checkpoint's pickle cannot run code here."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - truncated, corrupt or hostile: the same answer
        raise UserError(f"{path}: broken checkpoint, cannot read the RNG states ({error})") from None


# -----------------------------------------------------------------------------
# the export: a Hugging Face folder and its model card

HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                 "merges.txt", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                 "preprocessor_config.json", "video_preprocessor_config.json")


def save_hf_folder(state_dict, backbone, out_dir, info, card="", image_size=None):
    """Write a consolidated Embedder state_dict (keys "model.visual...", "model.language_model..."; LoRA already
    merged) as a Hugging Face folder in the release layout, so Embedder.from_pretrained and plain transformers
    (Qwen3_5ForConditionalGeneration) both load it, with pace.json and the model card `card` (README.md).
    Atomic: written aside, then renamed. image_size: the image processor's size to record (its pixel budget).
    config.json says the dtype the weights are stored in (training's float32 master weights), not the release's
    (bfloat16): plain transformers loads a folder in its config's dtype, and would compute in bf16 otherwise."""
    from safetensors.torch import save_file
    if any("lora_" in key for key in state_dict):
        raise UserError("merge the LoRA adapters (lora.merge_lora) before saving a Hugging Face folder")
    tmp_dir = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    for name in HF_SIDE_FILES:
        if os.path.isfile(os.path.join(backbone, name)):
            shutil.copy(os.path.join(backbone, name), tmp_dir)
    if image_size:  # the pixel budget the model trained at ({"shortest_edge", "longest_edge"}), not the release's
        path = os.path.join(tmp_dir, "preprocessor_config.json")
        with open(path) as f:
            processor = json.load(f)
        with open(path, "w") as f:
            json.dump(dict(processor, size=dict(image_size)), f, indent=2)
    tensors = {key: value.detach().cpu().contiguous() for key, value in state_dict.items()}
    stored = {str(v.dtype).replace("torch.", "") for v in tensors.values() if v.is_floating_point()}
    if len(stored) == 1 and os.path.isfile(os.path.join(tmp_dir, "config.json")):
        path = os.path.join(tmp_dir, "config.json")
        with open(path) as f:
            config = json.load(f)
        for part in [config] + [config[k] for k in ("text_config", "vision_config") if isinstance(config.get(k), dict)]:
            for key in ("dtype", "torch_dtype"):
                if key in part or (part is config and key == "dtype"):
                    part[key] = next(iter(stored))
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    save_file(tensors, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp_dir, INFO), "w") as f:
        json.dump(info, f, indent=2)
    if card:
        with open(os.path.join(tmp_dir, "README.md"), "w") as f:
            f.write(card)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)


CARD = '''---
library_name: transformers
pipeline_tag: feature-extraction
{base_model}tags: [multimodal-embedding, qwen3_5, pace]
---

# {name}: a multimodal embedding model trained with PACE

A Qwen3.5 vision-language model ({backbone_name}) turned into an embedding model: text, an image, or both
go in; one vector comes out. Trained with PACE (Progressive Angular-to-Norm Contrastive Embedding): Stage I
trains LoRA adapters with cosine logits, Stage II merges them and fine-tunes the whole language model with
dot-product logits; both weight each query by the Focal Embedding Loss. This checkpoint: {what}, step {step}.

## Similarity: {similarity}

Rank candidates by the **{similarity}** of the query's and the candidates' embeddings. {similarity_why}

## Prompt and pooling

Every input, query or candidate, is encoded alone under this prompt; the embedding is the last layer's
hidden state at the final `<|endoftext|>` (last-token pooling), not normalised:

```
<|im_start|>system
{system_prompt}<|im_end|>
<|im_start|>user
{{the image, as <|vision_start|><|image_pad|>...<|vision_end|>, then the text}}<|im_end|>
<|im_start|>assistant
<|endoftext|>
```

Queries start their text with a task instruction, e.g. "Retrieve an image that best matches the following
description." or "Find the caption that best describes this image.".

## Load it with plain transformers (text)

```python
import torch
from transformers import Qwen3_5Model, Qwen3_5Tokenizer  # transformers 5.17 or newer

path = "{folder}"
tokenizer = Qwen3_5Tokenizer.from_pretrained(path)
model = Qwen3_5Model.from_pretrained(path).eval()

def embed(text):
    prompt = ("<|im_start|>system\\n{system_prompt}<|im_end|>\\n<|im_start|>user\\n"
              + text + "<|im_end|>\\n<|im_start|>assistant\\n<|endoftext|>")
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        return model(**inputs, use_cache=False).last_hidden_state[0, -1]

query = embed("Find the caption that best describes this picture: a red circle")
candidate = embed("a red circle")
score = {score_expression}
```

Images go through the same prompt with Qwen's image placeholders; the PACE repository's `load_embedder`
builds them (and batches, and pools) for you:

```python
from checkpoint import load_embedder   # run from the PACE repository's root
embedder, info = load_embedder("{folder}")
vectors = embedder.encode([{{"text": "Find the caption that best describes this image.", "image": "photo.jpg"}},
                           {{"text": "a dog catching a frisbee", "image": None}}])
score = {encode_score_expression}
```

## Training

{training}

## Evaluation

{evaluation}
'''
EVALUATION_START = "## Evaluation\n"


def model_card(info, folder):
    """The README.md of an export folder (Hugging Face model card) from its pace.json `info`."""
    config, similarity = info.get("config", {}), info.get("similarity", "cos")
    dot = similarity == "dot"
    keys = ("init_from", "train_data", "max_iters", "batch_size", "num_hard_negatives", "learning_rate",
            "warmup_ratio", "similarity", "temperature", "focal_gamma", "focal_temperature", "weighting", "lora_rank",
            "lora_alpha", "grad_cache_chunk", "instructions", "max_length", "max_pixels", "seed")
    training = "\n".join(f"| `{k}` | `{config[k]!r}` |" for k in keys if k in config)
    backbone = os.path.basename(os.path.normpath(info.get("backbone", "")))
    trained = "dot-product" if dot else "cosine"
    trained += " training of LoRA adapters (merged here)" if info.get("trained_lora_rank") else \
        " training of the whole language model"
    return CARD.format(
        base_model=f"base_model: Qwen/{backbone}\n" if backbone.startswith("Qwen3.5-") else "",
        name=os.path.basename(os.path.dirname(os.path.abspath(folder))) or "pace", backbone_name=backbone or "Qwen3.5",
        what=trained, step=info.get("step", "?"), similarity="dot product" if dot else "cosine",
        similarity_why=("The norms carry meaning after Stage II: do not normalise the vectors." if dot else
                        "It was trained with cosine logits: normalise the vectors (or use cosine similarity)."),
        folder=folder, system_prompt=SYSTEM_PROMPT, score_expression="query @ candidate" if dot else
        "torch.nn.functional.cosine_similarity(query, candidate, dim=0)",
        encode_score_expression="vectors[0] @ vectors[1]" if dot else
        "torch.nn.functional.cosine_similarity(vectors[0], vectors[1], dim=0)",
        training="| key | value |\n|---|---|\n" + training if training else "(no training config recorded)",
        evaluation="Not evaluated yet: `python eval.py --init_from=<this folder> ...` in the PACE repository "
                   "writes its MMEB table here.")


def add_evaluation(folder, text):
    """Replace the Evaluation section of folder's model card with `text` (eval.py's table), if it has a card."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        card = f.read()
    head = card.split(EVALUATION_START)[0]
    write_text(path, head + EVALUATION_START + "\n" + text.rstrip() + "\n")
    return True


# -----------------------------------------------------------------------------
# loading a step folder safely: torch.distributed.checkpoint reads .metadata with pickle.load, and the shards'
# non-tensor entries (the optimizer's lr, betas, ...) with torch.load(weights_only=False), so a step folder from
# elsewhere could run code. These read both as data only.

METADATA_CLASSES = {("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"), ("torch", "Size"),
                    ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
METADATA_CLASSES |= {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")}  # all that dcp.save writes there


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only METADATA_CLASSES and torch dtypes: what a .metadata written by
    torch.distributed.checkpoint holds. Anything else (os.system, say) is refused, not called."""

    def find_class(self, module, name):
        if (module, name) in METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which torch.distributed.checkpoint never writes")


def read_metadata(path):
    """A step folder's .metadata, read safely; ValueError naming the folder for anything that is not DCP metadata."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    try:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Exception as error:  # noqa: BLE001 - hostile, truncated or corrupt: refused alike
        raise UserError(f"{path}: refusing its .metadata: {error}") from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"{path}: refusing its .metadata: it holds a {type(metadata).__name__}, not DCP metadata")
    metadata.storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
    return metadata


def load_state(state, path):
    """torch.distributed.checkpoint.load of a step folder into `state` (in place, on every rank alike), reading
    its .metadata with MetadataUnpickler and its non-tensor entries as plain data (weights_only)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(self.path)
            metadata.storage_meta.load_id = self.load_id  # as the stock reader sets it
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                torch.load(value, weights_only=True)  # plain data (numbers, strings, tuples) passes; code does not
            except Exception as error:  # noqa: BLE001
                raise UserError(f"{path}: refusing its entry {read_item.dest_index.fqn}: {error}") from None
            value.seek(0)
            super().load_bytes(read_item, value)

    read_metadata(path)  # first: dcp.load would swallow the refusal and fall back to another file
    try:
        dcp.load(state, storage_reader=Reader(path), planner=Planner())
    except dcp.api.CheckpointException as error:  # a BaseException: one line naming the folder instead
        causes = [cause[0] if isinstance(cause, tuple) else cause for cause in error.failures.values()]
        ours = [cause for cause in causes if isinstance(cause, ValueError) and str(cause).startswith(str(path))]
        raise UserError(str(ours[0]) if ours else f"{path}: cannot load it: {causes[0] if causes else error}") from None


# -----------------------------------------------------------------------------
# loading any checkpoint

def load_embedder(path, dtype=torch.float32, **preprocessor_args):
    """Any checkpoint this project meets -> (model.Embedder, info):
    - a Hugging Face folder (a release or an export/): loaded as is; info is its pace.json ({} for a release);
    - a training step folder (out_dir/step_NNNNNN of train.py): its files are verified against pace.json, the
      backbone it names is loaded with the run's max_length and pixel budget, LoRA adapters are injected if that
      run trained them, and the sharded weights are read with torch.distributed.checkpoint (in one process, or
      on every rank alike), through load_state, so a step folder from elsewhere cannot run code here.
    export/ (safetensors) is still the format to share: it needs neither this repository nor the backbone."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    import lora
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise UserError(f"{path!r} does not exist (or is not a folder): expected a Hugging Face folder (a release or "
                        "an export/) or a training step folder")
    info = read_info(path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return Embedder.from_pretrained(path, dtype, **preprocessor_args), info
    if not info or not os.path.isfile(os.path.join(path, ".metadata")):
        raise UserError(f"{path!r} is neither a Hugging Face folder (config.json) nor a training step folder "
                        f"({INFO} and .metadata)")
    verify(path)
    backbone = info["backbone"]
    if not os.path.isfile(os.path.join(backbone, "config.json")):
        raise UserError(f"{path} was trained from the backbone {backbone!r}, which is not here: put it there (or a "
                        "link to it), or export the run (train.py --resume=True --export_only=True)")
    run = info.get("config", {})  # the run's text and pixel budget, unless the caller sets them (as its export has)
    trained = {"max_length": run.get("max_length"), "max_pixels": run.get("max_pixels"), "min_pixels": run.get("min_pixels")}
    embedder = Embedder.from_pretrained(backbone, dtype, **{**{k: v for k, v in trained.items() if v}, **preprocessor_args})
    if info.get("lora_rank", 0) > 0:
        lora.inject_lora(embedder.model, info["lora_rank"], info["lora_alpha"])
    state = {"model": get_model_state_dict(embedder)}
    load_state(state, path)
    set_model_state_dict(embedder, state["model"])
    return embedder, info


def load_for_inference(path, dtype, device, max_length, max_pixels, similarity=""):
    """load_embedder as eval.py, search.py and mine.py use it: dtype a name ('float32', 'bfloat16'), max_pixels 0
    for the checkpoint's own budget, the model on device in eval mode. similarity: what to score with; '' = what
    the checkpoint was trained with (its pace.json), cosine for a plain release. -> (embedder, info, similarity)"""
    embedder, info = load_embedder(path, getattr(torch, dtype), max_length=max_length,
                                   **({"max_pixels": max_pixels} if max_pixels else {}))
    return embedder.to(device).eval(), info, similarity or info.get("similarity") or "cos"

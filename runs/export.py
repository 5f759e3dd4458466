"""
runs/export.py: a trained embedder as others use it: the export (a Hugging Face folder with the embedding spec and
a model card), and the one loader of every checkpoint this project meets.

    save_hf_folder(state_dict, spec, "out/stage2/export", info)       # train.py, at the end
    embedder, info = load_embedder("out/stage2/export")              # or a release, or a step folder
    embedder, info = load_embedder("out/stage1/step_002000", max_pixels=128 * 128)   # spec fields changed

out_dir/export/ holds model.safetensors (LoRA merged), the release's config, tokenizer and processor files (the
processor's size set to the spec's pixel budget), the spec (model.SPEC_FILE), pace.json (step, the training
config) and README.md, the model card: the prompt, the pooling, the similarity, how to load it with plain
transformers, the training config, and eval.py's table once it has run. Everything the card says of the vectors
comes from the spec.
"""
import json
import os
import shutil

import torch

import lora
from common import UserError, relative_hint, shareable, write_json, write_text
from model import FAMILIES, POOLINGS, Embedder, EmbeddingSpec, family_of
from runs.checkpoint import INFO, defining, fingerprint, load_state, read_info, verify

HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                 "merges.txt", "special_tokens_map.json", "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")
# transformers before 5 saves the image processor as preprocessor_config.json; transformers 5 nests it under
# "image_processor" in processor_config.json (and its loaders prefer that): an export keeps whichever it was given


def save_hf_folder(state_dict, spec, out_dir, info):
    """Write a consolidated Embedder state_dict (keys "model.visual...", "model.language_model..."; LoRA already
    merged) as a Hugging Face folder in the release layout of spec.backbone, so Embedder.from_pretrained and plain
    transformers both load it, with the spec, pace.json (info) and the model card. Keys outside the backbone's
    ("model.") are not written (a fork's learnable temperature trains, but is no part of the embedder). Atomic: written aside, then renamed. The processors' sizes are the spec's pixel budgets (image, video),
    not the release's.
    config.json says the dtype the weights are stored in (training's float32 master weights), not the release's
    (bfloat16): plain transformers loads a folder in its config's dtype, and would compute in bf16 otherwise."""
    from safetensors.torch import save_file
    if any("lora_" in key for key in state_dict):
        raise UserError("merge the LoRA adapters (lora.merge_lora) before saving a Hugging Face folder")
    tmp_dir = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    for name in HF_SIDE_FILES:
        if os.path.isfile(os.path.join(spec.backbone, name)):
            shutil.copyfile(os.path.join(spec.backbone, name), os.path.join(tmp_dir, name))  # the mode is the umask's
    def budget(kind):  # "" (the image processor) or "video_": its size becomes the spec's pixel budget
        return lambda processor: dict(processor, size={"shortest_edge": getattr(spec, f"{kind}min_pixels"),
                                                       "longest_edge": getattr(spec, f"{kind}max_pixels")})
    edit_json(os.path.join(tmp_dir, "preprocessor_config.json"), budget(""))
    edit_json(os.path.join(tmp_dir, "video_preprocessor_config.json"), budget("video_"))
    edit_json(os.path.join(tmp_dir, "processor_config.json"), lambda processor: dict(processor, **{
        key: budget(kind)(processor[key]) for key, kind in (("image_processor", ""), ("video_processor", "video_"))
        if key in processor}))
    tensors = {key: value.detach().cpu().contiguous() for key, value in state_dict.items()
               if key.startswith(("model.", "lm_head."))}  # a reranker's untied head beside the backbone's weights
    stored = {str(v.dtype).replace("torch.", "") for v in tensors.values() if v.is_floating_point()}
    if len(stored) == 1:
        edit_json(os.path.join(tmp_dir, "config.json"), lambda config: stored_dtype(config, next(iter(stored))))
    width = state_dict["model.language_model.norm.weight"].shape[0]
    if spec.matryoshka_dims:  # where vLLM looks before it accepts a request's `dimensions` (a Matryoshka model)
        dims = sorted({*spec.matryoshka_dims, spec.dim or width})
        edit_json(os.path.join(tmp_dir, "config.json"),
                  lambda config: dict(config, is_matryoshka=True, matryoshka_dimensions=dims))
    save_file(tensors, os.path.join(tmp_dir, "model.safetensors"), metadata={"format": "pt"})
    shareable(os.path.join(tmp_dir, "model.safetensors"))  # save_file leaves 0600
    spec.save(tmp_dir)
    reranker = info.get("config", {}).get("objective") == "rerank"  # rerank.py's: no embedding template or modules
    if not reranker:
        write_text(os.path.join(tmp_dir, "chat_template.jinja"), chat_template(spec))  # the release's is a chat's
        sentence_transformers_files(tmp_dir, spec, width)
    edit_json(os.path.join(tmp_dir, "tokenizer_config.json"),
              lambda tokenizer: {k: v for k, v in tokenizer.items() if k != "chat_template"})
    with open(os.path.join(tmp_dir, INFO), "w") as f:
        json.dump(info, f, indent=2)
    card = (rerank_card if reranker else model_card)(spec, info, out_dir, family_of(tmp_dir))
    if os.path.isfile(os.path.join(out_dir, "README.md")) and fingerprint(out_dir) == fingerprint(tmp_dir):
        with open(os.path.join(out_dir, "README.md")) as f:  # a re-export of the same weights keeps their evaluation
            earlier = f.read()
        if EVALUATION_START in earlier and "Not evaluated yet" not in earlier.split(EVALUATION_START)[1]:
            card = card.split(EVALUATION_START)[0] + EVALUATION_START + earlier.split(EVALUATION_START)[1]
    with open(os.path.join(tmp_dir, "README.md"), "w") as f:
        f.write(card)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp_dir, out_dir)


def chat_template(spec):
    """The export's chat template: a user message rendered as the embedding prompt (model.Preprocessor's), so that
    template-based tools (sentence-transformers, a pooling server, apply_chat_template) build the same ids. Images
    first, one placeholder each for the processor to expand, then the text parts; nothing after <|endoftext|>."""
    def parts(kind, output):
        return "{% for part in message['content'] %}{% if part['type'] == '" + kind + "' %}" + output + "{% endif %}{% endfor %}"
    system = spec.system_prompt.replace("{", "{{ '{' }}")  # literal text, even where it holds template syntax
    return ("{% for message in messages %}{% if message['role'] == 'user' %}"
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            + parts("image", "<|vision_start|><|image_pad|><|vision_end|>") + parts("text", "{{ part['text'] }}")
            + "{% endif %}<|im_end|>\n<|im_start|>assistant\n<|endoftext|>{% endif %}{% endfor %}")


def sentence_transformers_files(folder, spec, dim):
    """What SentenceTransformer(folder) reads (sentence-transformers 6), as its own save() writes them: the
    transformers module (feature extraction, every modality through the chat template, the PIL image processor
    training used: where torchvision is installed transformers would pick another, whose resize differs), then
    the spec's pooling (model.POOLINGS), not normalised, and the spec's similarity. No prompts: the template holds the system turn."""
    forward = {"method": "forward", "method_output_name": "last_hidden_state"}
    write_json(os.path.join(folder, "modules.json"), [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}])
    write_json(os.path.join(folder, "sentence_bert_config.json"), {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": forward, "image": forward, "message": dict(forward, format="structured")},
        "module_output_name": "token_embeddings", "processor_kwargs": {"use_fast": False}, "unpad_inputs": False})
    write_json(os.path.join(folder, "1_Pooling", "config.json"), {
        "embedding_dimension": int(dim), "pooling_mode": POOLINGS[spec.pooling].sentence_transformers, "include_prompt": True})
    write_json(os.path.join(folder, "config_sentence_transformers.json"), {
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "dot" if spec.similarity == "dot" else "cosine"})


def edit_json(path, change):
    """Rewrite a JSON file of the folder as change(its dict) returns it; nothing when it is not there."""
    if os.path.isfile(path):
        with open(path) as f:
            value = change(json.load(f))
        with open(path, "w") as f:
            json.dump(value, f, indent=2)


def stored_dtype(config, dtype):
    """A config.json (and its text and vision parts) saying its weights are stored in dtype."""
    for part in [config] + [config[k] for k in ("text_config", "vision_config") if isinstance(config.get(k), dict)]:
        for key in ("dtype", "torch_dtype"):
            if key in part or (part is config and key == "dtype"):
                part[key] = dtype
    return config


# -----------------------------------------------------------------------------
# the model card

CARD = '''---
library_name: transformers
pipeline_tag: feature-extraction
{base_model}tags: [multimodal-embedding, {model_type}, pace]
---

# {name}: a multimodal embedding model trained with PACE

A {family} vision-language model ({backbone_name}) turned into an embedding model: text, an image, or both
go in; one vector comes out. Trained with PACE (Progressive Angular-to-Norm Contrastive Embedding): Stage I
trains LoRA adapters with cosine logits, Stage II merges them and fine-tunes the whole language model with
dot-product logits; both weight each query by the Focal Embedding Loss. This checkpoint: {what}.

## Similarity: {similarity}

Rank candidates by the **{similarity}** of the query's and the candidates' embeddings. {similarity_why}

## Prompt and pooling

Every input, query or candidate, is encoded alone under this prompt, at most {max_length} tokens and an image
resized to {min_pixels:,} to {max_pixels:,} pixels; the embedding is {pooling_words} ({pooling}
pooling), not normalised:

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

This is not the base model's chat template, which trims the text and ends `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`:
build the prompt above, or the vectors differ. The embedding is `last_hidden_state`, after the final norm, not the
state before it (which `hidden_states[-1]` can be). Text that spells a control token (`<|im_end|>`, `<think>`) is
tokenised as plain text.

The folder's chat template renders a user message as this prompt (images first, then the text), so
`tokenizer.apply_chat_template([{{"role": "user", "content": [...]}}])` builds the same ids.

## Load it with sentence-transformers

```python
from PIL import Image
from sentence_transformers import SentenceTransformer  # 6.0 or newer, with torchvision (Qwen's processor needs it)

model = SentenceTransformer("{folder}"{truncate})
vectors = model.encode(["Find the caption that best describes this picture: a red circle", "a red circle",
                        Image.open("photo.jpg"), {{"text": "What is in the picture?", "image": Image.open("photo.jpg")}}])
scores = model.similarity(vectors[:1], vectors[1:])  # {similarity}, as this folder's config says
```

The folder's sentence-transformers files give the vectors above: the chat template for the prompt, {pooling}
pooling, no normalisation, and the PIL image processor training used (`"use_fast": false`; transformers would
otherwise take its torchvision processor, whose resize differs).

## Load it with plain transformers

Text, an image, or both, with or without torchvision installed: the PIL image processor is the one training used.

```python
import torch
from PIL import Image, ImageOps
from transformers import {model_class}, {tokenizer_class}  # transformers 5.17 or newer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

path = "{folder}"
tokenizer = {tokenizer_class}.from_pretrained(path)
image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
model = {model_class}.from_pretrained(path).eval()

def embed(text="", image=None):
    extra, vision = {{}}, ""
    if image is not None:  # a path: turned as the camera was held, in RGB
        extra = dict(image_processor(images=[ImageOps.exif_transpose(Image.open(image)).convert("RGB")], return_tensors="pt"))
        count = int(extra["image_grid_thw"].prod()) // image_processor.merge_size ** 2
        vision = "<|vision_start|>" + "<|image_pad|>" * count + "<|vision_end|>"
    prompt = ("<|im_start|>system\\n{system_prompt}<|im_end|>\\n<|im_start|>user\\n"
              + vision + text + "<|im_end|>\\n<|im_start|>assistant\\n<|endoftext|>")
    inputs = tokenizer(prompt, return_tensors="pt")
    if image is not None:  # which tokens are the image's: the model needs it beside the pixels
        extra["mm_token_type_ids"] = (inputs["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int()
    with torch.no_grad():
        hidden = model(**inputs, **extra, use_cache=False).last_hidden_state[0]  # (L, D): the prompt's final states
    return {pooling_code}

query = embed("Find the caption that best describes this picture: a red circle")
candidate = embed("a red circle")
score = {score_expression}
# an image alone, or with text: embed(image="photo.jpg"), embed("What is in the picture?", image="photo.jpg")
```

The PACE repository's `load_embedder` does the same, batched:

```python
from runs.export import load_embedder   # run from the PACE repository's root
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
CARD_STEERING = ("max_iters", "learning_rate", "warmup_ratio", "grad_cache_chunk")  # shown beside what defines it


def training_table(spec, info):
    """The card's training section: the spec's fields, then what else defined the run and its steering keys."""
    config = info.get("config", {})
    rows = [(f"`{k}`", f"`{v!r}`") for k, v in spec.to_dict().items()]
    shown = [k for k in config if k in CARD_STEERING or k in defining(config) and k not in spec.to_dict()]
    rows += [(f"`{k}`", f"`{config[k]!r}`") for k in shown]  # the training config after the spec's fields
    return "| key | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


RERANK_CARD = '''---
library_name: transformers
pipeline_tag: text-ranking
tags: [multimodal-reranker, {model_type}, pace]
---

# {name}: a multimodal reranker

A {family} vision-language model ({backbone}), {what}, trained to judge whether a candidate meets a query: one
prompt holds both, and the score is the log-odds of "yes" against "no" for the next token, step {step}. Higher is
more relevant; rank a query's candidates by it. Each side's text is cut to fit max_length = {max_length} tokens
(never its image), an image resized to {min_pixels:,} to {max_pixels:,} pixels.

```
<|im_start|>system
{system_prompt}<|im_end|>
<|im_start|>user
<Query>:
{{the query: its image as <|vision_start|><|image_pad|>...<|vision_end|>, then its text}}
<Document>:
{{the candidate, the same way}}<|im_end|>
<|im_start|>assistant
<think>

</think>

```

## Load it with plain transformers

```python
import torch
from transformers import {generator_class}, {tokenizer_class}

path = "{folder}"
tokenizer = {tokenizer_class}.from_pretrained(path)
model = {generator_class}.from_pretrained(path).eval()
yes, no = (tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in ("yes", "no"))

def score(query, document):  # text alone; images go in as the embedder's card shows, one per side
    prompt = ("<|im_start|>system\\n{system_prompt}<|im_end|>\\n<|im_start|>user\\n<Query>:\\n" + query
              + "\\n<Document>:\\n" + document + "<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n")
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0, -1]
    return (logits[yes] - logits[no]).item()
```

The PACE repository's `load_reranker` does the same, batched, images and videos too:

```python
from runs.reranker import load_reranker   # run from the PACE repository's root
reranker, info = load_reranker("{folder}")
scores = reranker.score([({{"text": "a red circle"}}, {{"text": "", "image": "circle.png"}})])
```

## Training

{training}
'''


def rerank_card(spec, info, folder, family):
    """The README.md of a reranker's export."""
    return RERANK_CARD.format(
        model_type=next(t for t, f in FAMILIES.items() if f == family), family=family.name,
        name=os.path.basename(os.path.dirname(os.path.abspath(folder))) or "pace",
        backbone=os.path.basename(os.path.normpath(spec.backbone)) or family.name, step=info.get("step", "?"),
        what="its LoRA adapters merged" if info.get("trained_lora_rank") else "its whole language model",
        max_length=spec.max_length, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
        system_prompt=spec.system_prompt, generator_class=family.model_class.replace("Model", "ForConditionalGeneration"),
        tokenizer_class=family.tokenizer_class, folder=folder, training=training_table(spec, info))


def model_card(spec, info, folder, family=FAMILIES["qwen3_5"]):
    """The README.md of an export folder (Hugging Face model card): spec says what the vectors are (POOLINGS the
    words and the code of its pooling), info (its pace.json) how the model was trained, family (model.FAMILIES) the
    classes that load it."""
    dot = spec.similarity == "dot"
    backbone = os.path.basename(os.path.normpath(spec.backbone))
    trained = "dot-product" if dot else "cosine"
    trained += " training of LoRA adapters (merged here)" if info.get("trained_lora_rank") else \
        " training of the whole language model"
    trained += f", step {info.get('step', '?')}"
    pooling_code = POOLINGS[spec.pooling].code  # over one item's final states, `hidden`; cut to dim if it has one
    pooling_code = f"({pooling_code})[:{spec.dim}]" if spec.dim else pooling_code
    if info.get("merged_from"):  # tools/merge.py's
        trained = (f"the weighted average of {len(info['merged_from'])} checkpoints (tools/merge.py; pace.json names "
                   f"them and their weights), the first from {trained}")
    return CARD.format(
        base_model=f"base_model: Qwen/{backbone}\n" if backbone.startswith(family.name + "-") else "",
        model_type=next(t for t, f in FAMILIES.items() if f == family), family=family.name,
        model_class=family.model_class, tokenizer_class=family.tokenizer_class, pooling_words=POOLINGS[spec.pooling].words,
        name=os.path.basename(os.path.dirname(os.path.abspath(folder))) or "pace", backbone_name=backbone or family.name,
        what=trained, similarity="dot product" if dot else "cosine",
        similarity_why=("The norms carry meaning after Stage II: do not normalise the vectors." if dot else
                        "It was trained with cosine logits: normalise the vectors (or use cosine similarity).")
        + (f" Its first {', '.join(map(str, spec.matryoshka_dims))} dimensions were trained as vectors too (Matryoshka):"
           " truncate to one of them (`truncate_dim=`) and compare the same way." if spec.matryoshka_dims else ""),
        max_length=spec.max_length, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
        pooling=spec.pooling.replace("_", "-"), pooling_code=pooling_code,
        truncate=f", truncate_dim={spec.dim}" if spec.dim else "", folder=folder, system_prompt=spec.system_prompt,
        score_expression="query @ candidate" if dot else "torch.nn.functional.cosine_similarity(query, candidate, dim=0)",
        encode_score_expression="vectors[0] @ vectors[1]" if dot else
        "torch.nn.functional.cosine_similarity(vectors[0], vectors[1], dim=0)",
        training=training_table(spec, info),
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
# loading any checkpoint

def load_embedder(path, dtype=torch.float32, **changes):
    """Any checkpoint this project meets -> (model.Embedder, info), its spec with `changes` (EmbeddingSpec
    fields: similarity=..., max_length=..., max_pixels=...; 0, None or '' keep a field):
    - a Hugging Face folder (a release or an export/): loaded as is; info is its pace.json ({} for a release);
    - a training step folder (out_dir/step_NNNNNN of train.py): its files are verified against pace.json, the
      backbone its spec names is loaded under that spec, LoRA adapters are injected if that run trained them, and
      the sharded weights are read with torch.distributed.checkpoint (in one process, or on every rank alike),
      through runs.checkpoint.load_state, so a step folder from elsewhere cannot run code here.
    export/ (safetensors) is still the format to share: it needs neither this repository nor the backbone."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    path = os.fspath(path)
    info = read_info(path) if os.path.isdir(path) else {}
    if check_checkpoint(path) == "hf":
        return Embedder.from_pretrained(path, dtype, **changes), info
    verify(path)
    spec = EmbeddingSpec.load(path)
    embedder = Embedder.from_pretrained(spec.backbone, dtype, spec=spec, **changes)
    if info.get("lora_rank", 0) > 0:
        lora.inject_lora(embedder.model, info["lora_rank"], info["lora_alpha"])
    state = {"model": get_model_state_dict(embedder)}
    load_state(state, path)
    set_model_state_dict(embedder, state["model"])
    return embedder, info


def check_checkpoint(path):
    """What load_embedder refuses that costs no loading to check (train.py asks before it writes anything): the
    folder, its kind, a release's model type, a step folder's spec and backbone. -> 'hf' or 'step'"""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise UserError(f"{path!r} does not exist (or is not a folder): expected a Hugging Face folder (a release or "
                        "an export/) or a training step folder" + relative_hint(path))
    if os.path.isfile(os.path.join(path, "config.json")):
        family_of(path)  # a family this project reads, or a UserError naming the folder
        return "hf"
    if not read_info(path) or not os.path.isfile(os.path.join(path, ".metadata")):
        raise UserError(f"{path!r} is neither a Hugging Face folder (config.json) nor a training step folder "
                        f"({INFO} and .metadata)")
    spec = EmbeddingSpec.load(path)
    if spec is None:
        raise UserError(f"{path}: a step folder without its embedding spec (written before specs were kept): "
                        "export it with the version that wrote it")
    if not os.path.isfile(os.path.join(spec.backbone, "config.json")):
        raise UserError(f"{path} was trained from the backbone {spec.backbone!r}, which is not here: put it there "
                        "(or a link to it), or export the run (train.py --resume=True --export_only=True)")
    return "step"


def saved_spec(path):
    """The embedding spec saved in a step folder or an export at path; None for a release, or where no folder is."""
    return EmbeddingSpec.load(path) if os.path.isdir(path) else None


def trained_dims(path, embedder):
    """The widths the checkpoint at path was trained at: its spec's dim (or the whole vector) and its
    matryoshka_dims; a release without a spec: its whole vector. -> sorted list"""
    saved = saved_spec(path)
    width = embedder.model.config.text_config.hidden_size
    return sorted({(saved.dim if saved else 0) or width, *(saved.matryoshka_dims if saved else ())})


def dim_line(path, embedder):
    """What eval.py and tools/search.py say of the width they score at, with a WARNING where the checkpoint was never
    trained at it (Matryoshka: only its matryoshka_dims and its whole vector were)."""
    dims, width = trained_dims(path, embedder), embedder.model.config.text_config.hidden_size
    line = f"dim: scoring at {embedder.dim} of the backbone's {width} dimensions"
    if embedder.dim in dims:
        return line + f" (trained at {', '.join(map(str, dims))})"
    return (line + f"; WARNING: {path} was trained at {', '.join(map(str, dims))} only (its spec's dim and "
            f"matryoshka_dims): its first {embedder.dim} dimensions were never a vector of their own in training")


def changed_settings(path, width, **changes):
    """The spec fields `changes` (eval.py's overrides, 0 or '' = the checkpoint's own) move away from the spec saved
    at path: {field: (saved, now)}; {} at the checkpoint's own settings, or for a release (no spec to differ from).
    width: the backbone's, which dim=0 means."""
    saved = saved_spec(path)
    own = lambda key: (saved.dim or width) if key == "dim" else getattr(saved, key)  # noqa: E731
    return {key: (getattr(saved, key), value) for key, value in changes.items()
            if saved and value not in (None, "", 0) and value != own(key)}


def inherited_spec(init_from, fields, chosen):
    """A run's spec fields when it starts from a step folder or an export (Stage II from Stage I): each field its
    config does not set (chosen: the keys a file or flag set) is init_from's spec's, so Stage II keeps Stage I's
    pooling, dim, matryoshka_dims, prompt and budgets. -> (fields, what differs from init_from's spec, said at start:
    ["pooling 'mean' kept (the config's default is 'last_token')", "similarity 'cos' -> 'dot'", ...])"""
    earlier = saved_spec(init_from)
    if earlier is None:
        return dict(fields), []
    fields, said = dict(fields), []
    for key, value in list(fields.items()):
        before = getattr(earlier, key)
        if key not in chosen and value != before:
            fields[key] = before
            if value not in (0, "", None) or key == "dim":  # a budget's 0 means the checkpoint's own: no news
                said.append(f"{key} {before!r} kept (the config's default is {value!r})")
        elif value != before:
            said.append(f"{key} {before!r} -> {value!r}")
    return fields, said


def load_for_inference(path, dtype, device, **changes):
    """load_embedder as eval.py, tools/search.py and tools/mine.py use it: dtype a name ('float32', 'bfloat16'), the
    model on device in eval mode, the spec's fields changed as `changes` say, an image too large for max_length
    shrunk to the largest grid that fits (model.Preprocessor.fit_images; training names it instead). -> (embedder,
    info)"""
    embedder, info = load_embedder(path, getattr(torch, dtype), **changes)
    embedder.preprocessor.fit_images = True  # a photo too large for max_length is shrunk to fit, and counted
    return embedder.to(device).eval(), info

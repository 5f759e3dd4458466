"""
shapes/pretrain.py: a brief, deterministic pretraining of the toy's tiny Qwen3.5 on the toy's training scenes, so
that Stage I starts, as the paper's does, from a backbone that already ties words to pictures.

    python -m shapes.prepare                                     # writes the toy and calls this (--pretrain=False: not)
    python -m shapes.pretrain                                    # pretrains data/shapes/tiny-qwen3.5 in place
    python -m shapes.pretrain --checkpoint=/tmp/tiny --steps=20  # another folder, a shorter run
    python -m shapes.pretrain --norms_of=data/shapes/tiny-qwen3.5  # only the spread of its evaluation norms
    from shapes.pretrain import pretrain
    summary = pretrain("data/shapes/tiny-qwen3.5", "data/shapes/train.jsonl", "data/shapes/images")

The recipe: captioning by next-token prediction through the model's tied LM head (the checkpoint is a
Qwen3_5ForConditionalGeneration; the embedder later drops the head). Each row of train.jsonl gives one picture and
the words that describe it, under the embedding prompt's template with the answer in the assistant's turn:

    <|im_start|>system ... <|im_start|>user\\n{picture}{prompt}<|im_end|>\\n<|im_start|>assistant\\n{target}<|endoftext|>

    classification, VQA, image->text rows   the query's picture and text -> the positive text (label, answer, caption)
    text->image rows                        the positive picture, the image->text instruction -> the query's caption
    grounding rows                          the positive crop and its candidate text -> the query's label

The loss is the cross-entropy of the target tokens (and the closing <|endoftext|>) alone. Every parameter trains,
the vision tower too (a release's is pretrained; Stage I and II then freeze it): AdamW, lr warmed up over the
first 10 % of the steps, then cosine down to a tenth; five epochs unless told the steps. One torch thread; the same
seed gives byte-identical weights.
Only training rows are read, and the run refuses (UserError) a row that names a colour-shape pair of
prepare.UNSEEN or whose picture is not under images/train/: the OOD datasets stay out of distribution.

Every 20th example is held out and scored at the end twice, with its own picture and with another picture of the
same task: the gap says the model reads the pictures, not only the words. The folder keeps its release layout
(config.json, model.safetensors, tokenizer, preprocessor configs; written aside, then moved in), plus
pretraining.json: the recipe, the loss of every step, the held-out losses and the time.
"""
import contextlib
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

import configurator
from common import UserError, compute_init, duration, write_json
from media import IMAGE_MARKER
from shapes.prepare import DATA_DIR, GROUNDING, IMAGE_TO_TEXT, TEXT_TO_IMAGE, UNSEEN

EPOCHS = 5  # the default length: 5 passes over the examples, 297 steps on the toy's 1,900 (about 100 s on one core)
BATCH_SIZE = 32
LEARNING_RATE = 2e-3
HOLD_OUT = 20  # every 20th example is held out for the picture check
RECORD = "pretraining.json"


@contextlib.contextmanager
def torch_threads(count):
    """torch's CPU threads set to `count` inside the block, and what they were restored after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# -----------------------------------------------------------------------------
# rows -> captioning examples (prompt, picture, target)

def names_unseen(text):
    """True when text names a held-out colour-shape pair ("red circle", "a small red circle at ...")."""
    return any(f"{colour} {shape}" in text for colour, shape in UNSEEN)


def captioning_example(row):
    """One train.jsonl row -> (prompt, picture path relative to images/, target text); see the module's table."""
    query_image, positive_image = row["qry_image_path"], row["pos_image_path"]
    if query_image and not positive_image:  # classification, VQA, image->text
        return row["qry"], query_image, row["pos_text"]
    if positive_image and not query_image:  # text->image: caption the positive picture
        if not row["qry"].startswith(TEXT_TO_IMAGE):
            raise UserError(f"a text->image row whose query does not start with {TEXT_TO_IMAGE!r}: {row['qry'][:80]!r}")
        return f"{IMAGE_MARKER}\n{IMAGE_TO_TEXT}", positive_image, row["qry"][len(TEXT_TO_IMAGE):].strip()
    if GROUNDING not in row["qry"]:
        raise UserError(f"a row with two pictures that is not a grounding row: {row['qry'][:80]!r}")
    return row["pos_text"], positive_image, row["qry"].split(GROUNDING, 1)[1].strip()  # grounding: label the crop


def captioning_examples(train_jsonl):
    """Every row of the toy's train.jsonl -> [(prompt, picture, target)]. Refuses (UserError) a row that names an
    UNSEEN pair anywhere (query, positive or negatives) or a picture outside train/: pretraining sees training
    scenes only."""
    examples = []
    with open(train_jsonl, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            row = json.loads(line)
            texts = [row["qry"], row["pos_text"], *row.get("neg_text", [])]
            images = [row["qry_image_path"], row["pos_image_path"], *row.get("neg_image_path", [])]
            if any(names_unseen(text) for text in texts):
                raise UserError(f"{train_jsonl}:{number} names a colour-shape pair held out of training (prepare.UNSEEN)")
            if any(image and not image.startswith("train/") for image in images):
                raise UserError(f"{train_jsonl}:{number}: a picture outside images/train/; pretraining reads training "
                                "scenes only")
            examples.append(captioning_example(row))
    if not examples:
        raise UserError(f"{train_jsonl} holds no rows")
    return examples


# -----------------------------------------------------------------------------
# examples -> model inputs with labels

def sequence(preprocessor, prompt, image, target):
    """The embedding prompt of (prompt, image) with its final <|endoftext|> replaced by target<|endoftext|>.
    -> the Preprocessor's feature plus "labels": (L,) the target's ids where they are predicted, -100 elsewhere."""
    feature = preprocessor(prompt, image)
    ids, positions = feature["input_ids"][:-1], feature["position_ids"][:, :-1]  # (L0,), (3, L0)
    answer = torch.tensor(preprocessor.ids(target) + [preprocessor.pad_id])  # (A,) ends with <|endoftext|>
    after = positions[:, -1:] + 1 + torch.arange(len(answer))  # (3, A): text counts up on all three axes
    feature["input_ids"] = torch.cat([ids, answer])  # (L,) L = L0 + A
    feature["position_ids"] = torch.cat([positions, after], dim=1)  # (3, L)
    feature["labels"] = torch.cat([torch.full_like(ids, -100), answer])  # (L,)
    return feature


def collate(preprocessor, features):
    """Right-padded batch -> the Preprocessor's batch plus "labels": (B, L), -100 on padding."""
    batch = preprocessor.collate(features)
    labels = torch.full(batch["input_ids"].shape, -100, dtype=torch.long)  # (B, L)
    for row, feature in enumerate(features):
        labels[row, :len(feature["labels"])] = feature["labels"]
    batch["labels"] = labels
    return batch


def lm_loss(model, pixel_values, batch, reduction="mean"):
    """Next-token cross-entropy of the labelled tokens through the tied LM head. pixel_values: model.Embedder's
    uint8 patches -> float pixel values. -> a scalar (reduction="mean") or (summed loss, token count)."""
    pixels = pixel_values(batch["pixel_values"]) if batch["pixel_values"] is not None else None
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                   pixel_values=pixels, image_grid_thw=batch["image_grid_thw"], use_cache=False).logits  # (B, L, V)
    predicted, labels = logits[:, :-1].float(), batch["labels"][:, 1:]  # token t predicts t + 1
    loss = F.cross_entropy(predicted.reshape(-1, predicted.shape[-1]), labels.reshape(-1), reduction="sum")
    count = int((labels != -100).sum())
    return loss / count if reduction == "mean" else (loss, count)


def learning_rate(step, steps, peak):
    """Linear warm-up over the first 10 % of the steps, then cosine down to peak / 10 at the last step."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# -----------------------------------------------------------------------------
# the run

def load(checkpoint):
    """-> (Qwen3_5ForConditionalGeneration, model.Preprocessor, the uint8-patches -> pixel values function),
    every parameter trainable."""
    from transformers import Qwen3_5ForConditionalGeneration
    from model import Embedder, Preprocessor
    if not os.path.isfile(os.path.join(checkpoint, "config.json")):
        raise UserError(f"{checkpoint!r} is not a Hugging Face checkpoint folder (no config.json): write one with "
                        "python -m shapes.prepare --pretrain=False")
    model = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32, local_files_only=True,
                                                            attn_implementation="sdpa")
    preprocessor = Preprocessor.from_pretrained(checkpoint, max_length=512)
    pixel_values = Embedder(model.model, preprocessor).pixel_values  # its table of the processor's pixel values
    model.requires_grad_(True)  # Embedder froze the vision tower; pretraining trains it
    model.config.use_cache = False
    return model, preprocessor, pixel_values


@torch.no_grad()
def held_out_losses(model, preprocessor, pixel_values, examples, image_dir, batch_size):
    """Mean target-token loss of the held-out examples with their own picture and with the picture of the next
    held-out example of the same task (its folder, train/<task>: pictures of one size). -> (own, another)"""
    model.eval()
    results = []
    for swap in (False, True):
        pictures = [image for _, image, _ in examples]
        if swap:
            by_task = {}
            for index, (_, image, _) in enumerate(examples):
                by_task.setdefault(os.path.dirname(image), []).append(index)
            for indices in by_task.values():
                for k, index in enumerate(indices):
                    pictures[index] = examples[indices[(k + 1) % len(indices)]][1]
        total, count = 0.0, 0
        for start in range(0, len(examples), batch_size):
            chunk = range(start, min(start + batch_size, len(examples)))
            batch = collate(preprocessor, [sequence(preprocessor, examples[i][0], os.path.join(image_dir, pictures[i]),
                                                    examples[i][2]) for i in chunk])
            loss, tokens = lm_loss(model, pixel_values, batch, reduction="sum")
            total, count = total + loss.item(), count + tokens
        results.append(total / count)
    model.train()
    return tuple(results)


def save_in_place(model, checkpoint):
    """model.save_pretrained into a folder beside, then its files (config.json, generation_config.json,
    model.safetensors) moved over checkpoint's, each whole; the tokenizer and the preprocessor configs stay."""
    aside = checkpoint.rstrip("/") + ".pretrained.tmp"
    shutil.rmtree(aside, ignore_errors=True)  # an interrupted run's
    model.save_pretrained(aside)
    for name in sorted(os.listdir(aside)):
        os.replace(os.path.join(aside, name), os.path.join(checkpoint, name))
    os.rmdir(aside)


def pretrain(checkpoint, train_jsonl, image_dir, steps=None, batch_size=BATCH_SIZE, peak_lr=LEARNING_RATE, seed=0,
             log_every=25, threads=1):
    """Pretrain the Qwen3.5 folder `checkpoint` in place by captioning train_jsonl's pictures (see the module's
    docstring) for `steps` steps (None: EPOCHS passes over the training examples). Deterministic: the same folder,
    data and seed give byte-identical weights. -> the summary written to checkpoint/pretraining.json"""
    compute_init("cpu")  # transformers binds the PyTorch reference kernels, as on every CPU run here
    with torch_threads(threads):
        return _pretrain(checkpoint, train_jsonl, image_dir, steps, batch_size, peak_lr, seed, log_every)


def _pretrain(checkpoint, train_jsonl, image_dir, steps, batch_size, peak_lr, seed, log_every):
    start = time.time()
    examples = captioning_examples(train_jsonl)
    held_out = examples[HOLD_OUT - 1::HOLD_OUT]
    training = [e for i, e in enumerate(examples) if (i + 1) % HOLD_OUT]
    steps = steps or math.ceil(EPOCHS * len(training) / batch_size)
    model, preprocessor, pixel_values = load(checkpoint)
    features = [sequence(preprocessor, prompt, os.path.join(image_dir, image), target)
                for prompt, image, target in training]
    print(f"pretraining {checkpoint}: {steps} steps of {batch_size} captions from {len(training):,} training "
          f"examples ({len(held_out)} held out), lr {peak_lr:g}", flush=True)
    losses = train(model, preprocessor, pixel_values, features, steps, batch_size, peak_lr, seed, log_every, start)
    own, another = held_out_losses(model, preprocessor, pixel_values, held_out, image_dir, batch_size)
    save_in_place(model, checkpoint)
    weight = model.model.language_model.norm.weight.detach().double()  # (D,) the final norm's w; gain 1 + w
    summary = {"recipe": {"task": "captioning the training scenes, next-token prediction of the target text",
                          "steps": steps, "batch_size": batch_size, "peak_lr": peak_lr, "seed": seed,
                          "optimizer": "AdamW (0.9, 0.95), no weight decay, clip 1.0, warm-up 10 %, cosine to lr/10",
                          "train_jsonl": os.path.abspath(train_jsonl), "examples": len(training),
                          "held_out": len(held_out)},
               "first_loss": losses[0], "final_loss": sum(losses[-20:]) / len(losses[-20:]),  # the last 20 steps'
               "held_out_loss": own, "held_out_loss_another_picture": another,
               "final_norm_weight": {"mean": weight.mean().item(), "std": weight.std().item(),
                                     "min": weight.min().item(), "max": weight.max().item()},
               "seconds": round(time.time() - start, 1), "losses": losses}
    write_json(os.path.join(checkpoint, RECORD), summary)
    print(f"pretrained in {duration(summary['seconds'])}: loss {summary['first_loss']:.2f} -> "
          f"{summary['final_loss']:.3f}; held out {own:.3f} with its own picture, {another:.3f} with another "
          "scene's", flush=True)
    return summary


def batch_order(count, batch_size, steps, seed):
    """Which examples each step trains on: a fresh permutation of the `count` examples each epoch, cut into
    batches. -> steps lists of batch_size indices"""
    generator = torch.Generator().manual_seed(seed)
    order = []
    while len(order) < steps * batch_size:
        order += torch.randperm(count, generator=generator).tolist()
    return [order[k * batch_size:(k + 1) * batch_size] for k in range(steps)]


def train(model, preprocessor, pixel_values, features, steps, batch_size, peak_lr, seed, log_every, start):
    """The loop: AdamW on every parameter, the learning_rate schedule, gradients clipped at 1. -> the losses"""
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    model.train()
    for step, picked in enumerate(batch_order(len(features), batch_size, steps, seed)):
        batch = collate(preprocessor, [features[i] for i in picked])
        lr = learning_rate(step, steps, peak_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = lm_loss(model, pixel_values, batch)
        if not torch.isfinite(loss):
            raise RuntimeError(f"pretraining loss {loss.item()} at step {step + 1}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.time() - start
            print(f"pretraining step {step + 1}/{steps}: loss {losses[-1]:.3f}, lr {lr:.2e}, {duration(elapsed)} "
                  f"elapsed, ~{duration(elapsed / (step + 1) * (steps - step - 1))} left", flush=True)
    return losses


# -----------------------------------------------------------------------------
# the spread of the embedding norms over the toy's evaluation items

def evaluation_items(eval_dir, image_dir):
    """Every query and every distinct candidate of the toy's evaluation datasets -> [{"text", "image"}]."""
    import pyarrow.parquet as pq
    items, seen = [], set()
    for name in sorted(os.listdir(eval_dir)):
        table = pq.read_table(os.path.join(eval_dir, name, "test.parquet")).to_pydict()
        pairs = list(zip(table["qry_text"], table["qry_img_path"]))
        for texts, images in zip(table["tgt_text"], table["tgt_img_path"]):
            pairs += [pair for pair in zip(texts, images) if pair not in seen and not seen.add(pair)]
        items += [{"text": text, "image": os.path.join(image_dir, image) if image else None} for text, image in pairs]
    return items


def norm_spread(checkpoint, eval_dir, image_dir, threads=1):
    """The embedding norms of every evaluation item (queries and candidates) under checkpoint, before any
    contrastive training. -> {"items", "mean", "std", "cv"}: cv = std / mean"""
    from model import Embedder
    compute_init("cpu")
    with torch_threads(threads):
        embedder = Embedder.from_pretrained(checkpoint, max_length=512, max_pixels=128 * 128)
        norms = embedder.encode(evaluation_items(eval_dir, image_dir), batch_size=32, progress="norms").norm(dim=1).double()
    return {"items": len(norms), "mean": norms.mean().item(), "std": norms.std().item(),
            "cv": (norms.std() / norms.mean()).item()}


# -----------------------------------------------------------------------------
# the command line (every default can be overridden by --key=value)
checkpoint = os.path.join(DATA_DIR, "tiny-qwen3.5")  # pretrained in place
train_jsonl = os.path.join(DATA_DIR, "train.jsonl")  # the toy's training rows, whose scenes are captioned
image_dir = os.path.join(DATA_DIR, "images")  # where their images are
steps = 0  # pretraining steps (0: EPOCHS epochs)
batch_size = BATCH_SIZE  # captions a step
lr = LEARNING_RATE  # peak learning rate
seed = 0  # seeds the order of the captions
norms_of = ""  # only print the spread of this checkpoint's embedding norms over eval_dir's items
eval_dir = os.path.join(DATA_DIR, "eval")  # the toy's evaluation datasets


def main(argv=None):
    """Pretrain checkpoint in place, or with norms_of print its norms' spread. -> the summary or the spread"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    if norms_of:
        spread = norm_spread(norms_of, eval_dir, image_dir)
        print(f"{norms_of}: {spread['items']:,} evaluation items, norm mean {spread['mean']:.4f}, "
              f"std {spread['std']:.4f}, cv {spread['cv']:.4f}")
        return spread
    return pretrain(checkpoint, train_jsonl, image_dir, steps or None, batch_size, lr, seed)


if __name__ == "__main__":
    from common import install_error_hook
    install_error_hook()
    main()

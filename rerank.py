"""
rerank.py: a pointwise multimodal reranker, a second head on the embedder's backbone (Qwen3-VL-Reranker's form).

    torchrun --nproc_per_node=8 train.py config/rerank.py            # LoRA on the language model, the same rows
    python train.py config/shapes_rerank.py                          # the toy's, on a laptop CPU
    reranker, info = load_reranker("out/rerank/export")              # runs/reranker.py: a step folder, a release
    scores = reranker.score([(query, candidate), ...])               # (n,) float64 log-odds, higher = more relevant

One prompt holds both sides, each laid out as model.Preprocessor lays out an item (its image or video through
vision placeholders, then its text; the query's last text tokenised with the newline after it, so the ids are
the whole prompt string's), and the score is read at the last position, where the answer comes next:

    <|im_start|>system
    {spec.system_prompt: SYSTEM_PROMPT in config/rerank.py}<|im_end|>
    <|im_start|>user
    <Query>:
    {the query}
    <Document>:
    {the candidate}<|im_end|>
    <|im_start|>assistant
    <think>

    </think>


    s(q, c) = log P("yes" | prompt) - log P("no" | prompt) = h . (w_yes - w_no)        (R1)

h (D,) is the language model's final hidden state there (model.Embedder's last-token pooling) and w_yes, w_no the
LM head's rows of the answer words' first tokens, frozen: the softmax's normaliser cancels in the difference, so
the (vocabulary, D) head is never multiplied out. Training (loss.rerank_loss, eq. R2) is a softmax cross-entropy
over each query's positive and K hard negatives; evaluation reranks an embedder's top K (rescore_top, which
eval.py --rerank_from runs);
tools/distill.py writes its scores where soft_labels="judge" reads them. max_length bounds each side, not the pair.
"""
import functools
import json
import math
import os
import time

import torch

import common
from common import UserError
from data import TrainDataset, split_by_length, video_of
from model import Embedder, length_batches, mrope_positions

ANSWER_WORDS = ("yes", "no")  # the reranker's answer; the score is their log-odds (R1)
ANSWER_START = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's answer without thinking, fixed text


def template(system_prompt):
    """The reranker's prompt around its two sides: (head, middle, tail), as the docstring above shows it."""
    return (f"<|im_start|>system\n{system_prompt}<|im_end|>\n<|im_start|>user\n<Query>:\n", "\n<Document>:\n",
            f"<|im_end|>\n{ANSWER_START}")


class PairPrompt:
    """A (query, candidate) pair -> one prompt's inputs, shaped as model.Preprocessor shapes an item's: input_ids
    (L,), position_ids (3, L) and each side's visual (the query's first): its uint8 patches and grid under
    pixel_values / image_grid_thw (n, 3) or pixel_values_videos / video_grid_thw. head + query + middle + candidate +
    tail, the three texts the template's own (their control tokens parsed). Picklable: DataLoader workers build it."""

    def __init__(self, preprocessor, head, middle, tail):
        self.pre = preprocessor
        # the middle's leading newline is tokenised with the query's last text, as the whole string would be
        # (Qwen's pre-tokenizer joins "?" or "." and the newline after it)
        self.query_end = "\n" if middle.startswith("\n") else ""
        middle = middle[len(self.query_end):]
        self.head, self.middle, self.tail = (preprocessor.ids(text, True) for text in (head, middle, tail))

    def side(self, item, end=""):
        """-> (ids, position pieces, patches or None, grid (1, 3) or None) of a query or a candidate, its text
        followed by `end`."""
        return self.pre.item_tokens((item.get("text") or "") + end, item.get("image"), item.get("video"))

    def __call__(self, query, candidate):
        try:
            sides = [self.side(query, self.query_end), self.side(candidate)]
        except ValueError as error:  # an unreadable image, an aspect ratio over 200 (UserErrors naming the image)
            raise UserError(f"the pair {query.get('text', '')[:60]!r} and {candidate.get('text', '')[:60]!r}: "
                            f"{error}") from None
        ids = self.head + sides[0][0] + self.middle + sides[1][0] + self.tail
        pieces = [len(self.head)] + sides[0][1] + [len(self.middle)] + sides[1][1] + [len(self.tail)]
        feature = {"input_ids": torch.tensor(ids, dtype=torch.long), "position_ids": mrope_positions(pieces)}
        for kind, names in (("image", ("pixel_values", "image_grid_thw")),
                            ("video", ("pixel_values_videos", "video_grid_thw"))):
            parts = [(patches, grid) for (_, _, patches, grid), item in zip(sides, (query, candidate))
                     if patches is not None and (item.get("video") is not None) == (kind == "video")]
            if parts:
                feature[names[0]], feature[names[1]] = (torch.cat(part) for part in zip(*parts))
        return feature

    def batch(self, pairs):
        """A DataLoader's collate_fn over a list of pairs: their features, right-padded (Preprocessor.collate)."""
        return self.pre.collate([self(*pair) for pair in pairs])


def lm_head_file(folder):
    """The safetensors file of folder that holds lm_head.weight, or None (the head is tied to the embeddings)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            name = json.load(f)["weight_map"].get("lm_head.weight")
        return name and os.path.join(folder, name)
    from safetensors import safe_open
    path = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(path):  # a training step folder: its weights are sharded, its head is its backbone's
        return None
    with safe_open(path, "pt") as f:
        return path if "lm_head.weight" in f.keys() else None


def lm_head_tensors(folder):
    """{"lm_head.weight": the head} of a folder whose head is its own, {} where it is tied: what an export of a
    reranker adds to the trained weights (the head is frozen, so the backbone's is the reranker's)."""
    path = lm_head_file(folder)
    if path is None:
        return {}
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {"lm_head.weight": f.get_tensor("lm_head.weight")}


class Reranker(Embedder):
    """An Embedder whose forward gives each collated pair's score (R1), (B,) float32: the last-token pooled state
    times the difference of the LM head's rows of ANSWER_WORDS. Build one with Reranker.of(embedder, folder)."""

    words = ANSWER_WORDS

    def __init__(self, model, preprocessor, answer_rows):
        super().__init__(model, preprocessor)
        spec = preprocessor.spec
        if spec.pooling != "last_token" or spec.dim or spec.matryoshka_dims:
            raise UserError(f"a reranker reads the last token's whole state: pooling='last_token', dim=0 and no "
                            f"matryoshka_dims (got {spec.pooling!r}, {spec.dim}, {list(spec.matryoshka_dims)})")
        self.register_buffer("answer", (answer_rows[0] - answer_rows[1]).float(), persistent=False)  # (D,)
        self.prompt = self.make_prompt(preprocessor)

    def make_prompt(self, preprocessor):
        return PairPrompt(preprocessor, *template(preprocessor.spec.system_prompt))

    @classmethod
    def of(cls, embedder, folder):
        """embedder's backbone (its LoRA, if injected, kept) as a reranker, its head the LM head of folder (a release,
        a reranker's export), else of the spec's backbone (an embedder's export keeps none), else (tied) the token
        embeddings. Training freezes it: an export writes that head beside the trained weights."""
        first_token = lambda word: embedder.preprocessor.tokenizer(word, add_special_tokens=False)["input_ids"][0]  # noqa: E731
        ids = [first_token(word) for word in cls.words]
        if ids[0] == ids[1]:
            raise UserError(f"{folder}: its tokenizer starts {cls.words[0]!r} and {cls.words[1]!r} with one token")
        source = next((f for f in (folder, embedder.spec.backbone) if f and lm_head_file(f)), None)  # an embedder's export
        config = embedder.model.config
        tied = getattr(config, "tie_word_embeddings", False) or getattr(config.text_config, "tie_word_embeddings", False)
        if source is None and not tied:
            raise UserError(f"{folder}: its backbone's LM head is its own (tie_word_embeddings is false), but neither "
                            f"{folder} nor {embedder.spec.backbone} holds lm_head.weight in model.safetensors")
        head = lm_head_tensors(source)["lm_head.weight"] if source else embedder.model.language_model.embed_tokens.weight
        reranker = cls(embedder.model, embedder.preprocessor, head[ids].detach().float())  # tied: the embeddings
        reranker.head_source = source  # where an export reads the untied head it keeps (None: tied)
        return reranker

    def forward(self, **batch):
        """A collated batch of pairs -> (B,) float32 scores s(q, c), eq. (R1)."""
        hidden = super().forward(**batch)  # (B, D) float32 at the last token: where the answer comes next
        return (hidden * self.answer).sum(dim=-1)  # a product and a sum: no autocast to bf16 of the head

    @torch.no_grad()
    def score(self, pairs, batch_size=16, num_workers=0, label=""):
        """[(query, candidate)] -> (n,) float64 scores (R1) in input order, in batches of about one length; label:
        a progress line."""
        was_training = self.training
        self.eval()
        measured = {}  # (text, image, video) -> tokens: a query meets each of its candidates, its length read once
        key = lambda x: (x.get("text") or "", x.get("image"), str(x.get("video")))  # noqa: E731
        for pair in pairs:
            for x in pair:
                if key(x) not in measured:
                    measured[key(x)] = self.preprocessor.num_tokens(x.get("text") or "", x.get("image"), x.get("video"))
        lengths = [sum(measured[key(x)] for x in pair) for pair in pairs]
        if self.preprocessor.shrunk and label:
            print(f"{label}: {len(self.preprocessor.shrunk)} images too large for max_length were shrunk to fit")
        scores, meter = torch.empty(len(pairs), dtype=torch.float64), common.Progress(len(pairs), label, "pairs")
        for indices, batch in length_batches(pairs, lengths, batch_size, num_workers, self.prompt.batch):
            scores[indices] = self(**batch).double().cpu()
            if label:
                meter.update(len(indices))
        self.train(was_training)
        return scores


def rescore_top(reranker, pair, scores, top, batch_size=16, num_workers=0, rank=0, world_size=1, label="", block=256):
    """The embedder's scores (Q, K) -> (reranked (Q, K): the reranker's scores s(q, c) (eq. R1 of rerank.py) of each
    row's `top` best candidates, and below them the rest in the embedder's order (-inf stays no candidate), so the
    metrics rank the reranked top first and miss a gold the embedder left out of it; the top (Q, K) bool; the cost).
    pair(q, k): row q's query and its candidate k, asked for `block` rows at a time (a page is built when read).
    Under torchrun rank r rescores rows r::world_size, gathered."""
    best = scores.topk(min(top, scores.shape[1]), dim=1)  # (Q, top): values, indices
    start = time.time()

    def rescore(indices):  # this rank's rows -> ((n, K) scores,)
        share = torch.full((len(indices), scores.shape[1]), -math.inf, dtype=torch.float64)
        for at in range(0, len(indices), block):
            kept = [(n, i, k) for n, i in enumerate(indices[at:at + block], at)
                    for j, k in enumerate(best.indices[i].tolist()) if best.values[i, j] > -math.inf]
            got = reranker.score([pair(i, k) for _, i, k in kept], batch_size, num_workers, label if rank == 0 else "")
            if not torch.isfinite(got).all():
                _, i, k = kept[int((~torch.isfinite(got)).nonzero()[0])]
                raise UserError(f"{label or 'reranking'}: the reranker gave a non-finite score for "
                                f"{int((~torch.isfinite(got)).sum())} of {len(got)} pairs, e.g. row {i}'s candidate {k}")
            for (n, _, k), value in zip(kept, got.tolist()):
                share[n, k] = value
        return (share,)
    (reranked,) = common.shared_rows(rescore, len(scores), rank, world_size)
    seconds, in_top = time.time() - start, torch.isfinite(reranked)
    if in_top.any():  # the rest after the lowest reranked score, in the embedder's order
        below = scores.double() - scores[torch.isfinite(scores)].max() + reranked[in_top].min() - 1.0
        reranked = torch.where(in_top, reranked, below)
    return reranked, in_top, {"top": best.indices.shape[1], "pairs": int(in_top.sum()), "seconds": seconds,
                              "queries_per_second": len(scores) / max(seconds, 1e-9)}


# -----------------------------------------------------------------------------
# training rows as pairs

class PairDataset(TrainDataset):
    """TrainDataset whose rows are (query, candidate) prompts: dataset[i]["pairs"] holds the 1 + K features of row
    i's query with its positive, then with each hard negative (the fill of missing ones as TrainDataset's). prompt:
    a Reranker's PairPrompt, which stands where TrainDataset takes its Preprocessor."""

    def prepare(self, row):
        with_video = lambda side: dict(side, video=video_of(side.get("video")))  # noqa: E731
        try:
            return {"pairs": [self.preprocessor(with_video(row["query"]), with_video(c)) for c in row["candidates"]]}
        except ValueError as error:
            raise UserError(f"{row['source']}: {error}") from None


def collate_pairs(preprocessor, max_items=None, cut=split_by_length):
    """collate_fn over PairDataset: n rows -> {"query": [], "candidate": [collated chunks of the n * (1 + K) pairs],
    "pairs": (n, 1 + K) each row's pairs' positions in the chunks' order (its positive first), "rows", "skipped"}.
    The chunks are cut as data.collate_train cuts a side: by length, one forward call each."""
    return functools.partial(_collate_pairs, preprocessor=preprocessor, max_items=max_items, cut=cut)


def _collate_pairs(items, preprocessor, max_items, cut):
    width = len(items[0]["pairs"])  # 1 + K
    features = [feature for item in items for feature in item["pairs"]]  # row i's k-th pair at i * width + k
    chunks = cut([len(f["input_ids"]) for f in features], max_items)
    position = {j: p for p, j in enumerate(j for chunk in chunks for j in chunk)}
    return {"query": [], "candidate": [preprocessor.collate([features[j] for j in chunk]) for chunk in chunks],
            "pairs": torch.tensor([[position[i * width + k] for k in range(width)] for i in range(len(items))]),
            "rows": torch.tensor([item["row"] for item in items], dtype=torch.long),
            "skipped": [message for item in items for message in item["skipped"]]}

"""
tools/judge.py: UniME-V2's MLLM-as-a-judge (Gu et al., AAAI 2026): a generative Qwen-VL model asked whether a
candidate meets a query's requirement, its answer's Yes/No logits turned into a score in [0, 1]. tools/mine.py runs
it over each query's pool of mined candidates, in resumable chunks: `python -m tools.mine --judge_from=MODEL ...`
(docs/hard_negatives.md). Run alone, this module says so.

    judge = Judge("/models/Qwen3.5-2B", torch.float32, device, max_length=8192, max_pixels=1605632)
    scores = judge.score([(query, candidate), ...], batch_size=8, num_workers=4)   # (n,) float64
"""
import hashlib
import json
import math
import os
import sys
import time

import torch

import common
from common import UserError
from model import Embedder, Preprocessor, length_batches, mrope_positions



def answer_start(tokenizer):
    """The text a chat template puts after a user turn to start the assistant's answer, without thinking."""
    if not getattr(tokenizer, "chat_template", None):
        return "<|im_start|>assistant\n"
    marker = "\x00"  # a user turn of one character no template changes, to cut the answer's start after it
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    if f"{marker}<|im_end|>\n" not in text:
        raise UserError("judge_from: its chat template does not end a user turn with <|im_end|> (not a Qwen model?)")
    return text.split(f"{marker}<|im_end|>\n", 1)[1]


class JudgePrompt:
    """A (query, candidate) pair -> the judge's inputs, shaped as model.Preprocessor shapes an item's: input_ids (L,),
    position_ids (3, L) and, with images, their uint8 patches (the query's first) and image_grid_thw (n, 3).
    Picklable, so DataLoader workers build them. The pair is one chat turn, images as Qwen's placeholders:

        <|im_start|>user
        {PROMPT}
        Query:
        {the query: its image as <|vision_start|><|image_pad|>...<|vision_end|> where its text has <|image_1|>
         (else first), and its text}
        Candidate:
        {the candidate, the same way}<|im_end|>
        {the answer's start: what the checkpoint's chat template puts after a user turn with enable_thinking=False,
         e.g. Qwen3's <|im_start|>assistant\n<think>\n\n</think>\n\n; <|im_start|>assistant\n without a template}

    and s = e_yes / (e_yes + e_no) = softmax(logit_yes, logit_no)[0], from the logits of the next token after the
    last one at "Yes" and "No", each word's first token (a small tokenizer splits them; Qwen's keep them whole).
    PROMPT is UniME-V2's question in other words (its reranker's prompt asks whether the candidate meets the
    requirements of the query, answered 'Yes' or 'No')."""

    PROMPT = "I will show you a query and a candidate. Does the candidate meet the requirement of the query? " \
             "Answer Yes or No."

    def __init__(self, preprocessor):
        self.pre = preprocessor
        self.head = preprocessor.ids(f"<|im_start|>user\n{self.PROMPT}\nQuery:\n", True)
        self.middle = preprocessor.ids("\nCandidate:\n", True)
        self.tail = preprocessor.ids(f"<|im_end|>\n{answer_start(preprocessor.tokenizer)}", True)

    def side(self, item):
        """-> (ids, position pieces, patches or None, grid (1, 3) or None) of a query or a candidate."""
        return self.pre.item_tokens(item.get("text") or "", item.get("image"))

    def __call__(self, query, candidate):
        try:
            sides = [self.side(query), self.side(candidate)]
        except ValueError as error:  # an unreadable image, an aspect ratio over 200 (UserErrors naming the image)
            raise UserError(f"judging {query.get('text', '')[:60]!r} against {candidate.get('text', '')[:60]!r}: "
                            f"{error}") from None
        ids = self.head + sides[0][0] + self.middle + sides[1][0] + self.tail
        pieces = [len(self.head)] + sides[0][1] + [len(self.middle)] + sides[1][1] + [len(self.tail)]
        feature = {"input_ids": torch.tensor(ids, dtype=torch.long), "position_ids": mrope_positions(pieces)}
        images = [(patches, grid) for _, _, patches, grid in sides if patches is not None]
        if images:
            feature["pixel_values"] = torch.cat([patches for patches, _ in images])  # query's first
            feature["image_grid_thw"] = torch.cat([grid for _, grid in images])
        return feature

    def batch(self, pairs):
        """A DataLoader's collate_fn over a list of pairs: their features, right-padded (Preprocessor.collate)."""
        return self.pre.collate([self(*pair) for pair in pairs])


class Judge:
    """A generative Qwen-VL folder as UniME-V2's judge: its language model's last hidden state at the answer position
    (Embedder's forward pools that very token, and turns patches into pixels) times its LM head's rows of Yes, No."""

    def __init__(self, path, dtype, device, max_length, max_pixels):
        from transformers import AutoModelForImageTextToText
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"judge_from={path!r} is not a Hugging Face checkpoint folder (no config.json)")
        preprocessor = Preprocessor.from_pretrained(path, max_length=max_length, max_pixels=max_pixels)
        preprocessor.fit_images = True  # each side's photo too large for max_length is shrunk to fit, as eval's
        self.generator = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=True)
        self.body = Embedder(self.generator.model, preprocessor)  # shares the weights
        self.generator.to(device).eval()
        self.body.to(device).eval()
        self.prompt = JudgePrompt(preprocessor)
        first_token = lambda word: preprocessor.tokenizer(word, add_special_tokens=False)["input_ids"][0]  # noqa: E731
        yes, no = first_token("Yes"), first_token("No")
        if yes == no:
            raise UserError(f"judge_from={path}: its tokenizer starts 'Yes' and 'No' with the same token")
        lm_head = self.generator.lm_head
        self.head = lm_head.weight[[yes, no]].detach().float()  # (2, D), in float32 even for a bf16 judge
        self.bias = None if lm_head.bias is None else lm_head.bias[[yes, no]].detach().float()

    @torch.no_grad()
    def score(self, pairs, batch_size, num_workers, label=""):
        """[(query, candidate)] -> (n,) float64 s = e_yes / (e_yes + e_no) of each pair, in input order."""
        measured = {}  # (text, image) -> tokens: a query meets each of its candidates, its length is read once
        for side in {(x.get("text") or "", x.get("image")) for pair in pairs for x in pair}:
            measured[side] = self.prompt.pre.num_tokens(*side)
        lengths = [sum(measured[x.get("text") or "", x.get("image")] for x in pair) for pair in pairs]
        if self.prompt.pre.shrunk and label:
            print(f"{label}: {len(self.prompt.pre.shrunk)} images too large for max_length were shrunk to fit")
        scores, meter = torch.empty(len(pairs), dtype=torch.float64), common.Progress(len(pairs), label, "pairs")
        for indices, batch in length_batches(pairs, lengths, batch_size, num_workers, self.prompt.batch):
            hidden = self.body(**batch)  # (B, D) float32 at the last token: where the answer comes next
            logits = hidden @ self.head.T + (0 if self.bias is None else self.bias)  # (B, 2): the rows of Yes, No
            scores[indices] = logits.double().softmax(dim=-1)[:, 0].cpu()  # e_yes / (e_yes + e_no)
            if label:
                meter.update(len(indices))
        return scores


def judge_chunks(judge, row_pairs, num_rows, folder, size, batch_size, num_workers, judge_id, rank, world):
    """Every chunk of `size` rows not already in folder, judged by rank (chunk % world), batch_size pairs a forward
    pass, and written there. row_pairs(i) = (query, [positive, pooled candidates...]) of row i. -> {chunk: its file}"""
    chunk_rows = lambda c: [row_pairs(i) for i in range(c * size, min(num_rows, (c + 1) * size))]  # noqa: E731
    files = {}
    for c in range(math.ceil(num_rows / size)):
        keys = [[[x.get("text") or "", x.get("image") or ""] for x in [q] + xs] for q, xs in chunk_rows(c)]
        digest = hashlib.sha256(json.dumps([judge_id, JudgePrompt.PROMPT, keys]).encode()).hexdigest()[:16]
        files[c] = os.path.join(folder, f"chunk_{c:06d}_{digest}.json")
    done = sum(os.path.isfile(path) for path in files.values())
    if done and rank == 0:
        print(f"judge: {done} of {len(files)} chunks already done in {folder} (an earlier run): skipped", flush=True)
    for c in range(rank, len(files), world):
        if os.path.isfile(files[c]):
            continue
        part = chunk_rows(c)
        pairs = [(q, x) for q, candidates in part for x in candidates]
        scores = judge.score(pairs, batch_size, num_workers, f"judge: chunk {c + 1}/{len(files)}" if rank == 0 else "").tolist()
        per_row, at = [], 0
        for _, candidates in part:
            per_row.append(scores[at:at + len(candidates)])
            at += len(candidates)
        common.write_json(files[c], {"rows": [c * size, c * size + len(part)], "scores": per_row})
    return files


def wait_for_chunks(files, timeout_minutes, poll_seconds=2.0):
    """Rank 0, its own chunks judged: until the other ranks' chunk files are all there. No collective (a rank may
    lag by hours over a long judge run); a UserError once timeout_minutes pass without a new chunk."""
    seen, since = -1, time.time()
    while (done := sum(os.path.isfile(path) for path in files.values())) < len(files):
        if done > seen:
            seen, since = done, time.time()
        elif time.time() - since > 60 * timeout_minutes:
            raise UserError(f"judge: {len(files) - done} chunks missing and none came for {timeout_minutes} minutes "
                            "(a rank stopped?); run again to resume, the finished chunks are kept")
        time.sleep(poll_seconds)


if __name__ == "__main__":  # a library of tools/mine.py: it says what it is and how it runs
    common.library_help(__doc__, sys.argv[1:])

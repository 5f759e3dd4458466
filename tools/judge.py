"""
tools/judge.py: UniME-V2's MLLM-as-a-judge (Gu et al., AAAI 2026): a generative Qwen-VL model asked whether a
candidate meets a query's requirement, its answer's Yes/No logits turned into a score in [0, 1]. tools/mine.py runs
it over each query's pool of mined candidates, in resumable chunks: `python -m tools.mine --judge_from=MODEL ...`
(docs/hard_negatives.md). Run alone, this module says so.

    judge = Judge.load("/models/Qwen3.5-2B", torch.float32, device, max_length=8192, max_pixels=1605632)
    scores = judge.score([(query, candidate), ...], batch_size=8, num_workers=4)   # (n,) float64
"""
import hashlib
import json
import math
import os
import sys
import time

import common
from common import UserError
from model import Embedder
from rerank import PairPrompt, Reranker



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


class JudgePrompt(PairPrompt):
    """A (query, candidate) pair -> the judge's inputs (rerank.PairPrompt's), the pair one chat turn:

        <|im_start|>user
        {PROMPT}
        Query:
        {the query: its image as <|vision_start|><|image_pad|>...<|vision_end|> where its text has <|image_1|>
         (else first), and its text}
        Candidate:
        {the candidate, the same way}<|im_end|>
        {the answer's start: what the checkpoint's chat template puts after a user turn with enable_thinking=False,
         e.g. Qwen3's <|im_start|>assistant\n<think>\n\n</think>\n\n; <|im_start|>assistant\n without a template}

    PROMPT is UniME-V2's question in other words (its reranker's prompt asks whether the candidate meets the
    requirements of the query, answered 'Yes' or 'No')."""

    PROMPT = "I will show you a query and a candidate. Does the candidate meet the requirement of the query? " \
             "Answer Yes or No."

    def __init__(self, preprocessor):
        super().__init__(preprocessor, f"<|im_start|>user\n{self.PROMPT}\nQuery:\n", "\nCandidate:\n",
                         f"<|im_end|>\n{answer_start(preprocessor.tokenizer)}")


class Judge(Reranker):
    """A generative Qwen-VL folder as UniME-V2's judge: rerank.Reranker's log-odds of "Yes" against "No" (each word's
    first token: a small tokenizer splits them; Qwen's keep them whole) after JudgePrompt, as a probability:
    s = e_yes / (e_yes + e_no) = sigmoid(logit_yes - logit_no)."""

    words = ("Yes", "No")

    def make_prompt(self, preprocessor):
        return JudgePrompt(preprocessor)

    @classmethod
    def load(cls, path, dtype, device, max_length, max_pixels):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"judge_from={path!r} is not a Hugging Face checkpoint folder (no config.json)")
        body = Embedder.from_pretrained(path, dtype, max_length=max_length, max_pixels=max_pixels)
        body.preprocessor.fit_images = True  # each side's photo too large for max_length is shrunk to fit, as eval's
        return cls.of(body, path).to(device).eval()

    def score(self, pairs, batch_size, num_workers, label=""):
        """[(query, candidate)] -> (n,) float64 s = e_yes / (e_yes + e_no) of each pair, in input order."""
        return super().score(pairs, batch_size, num_workers, label).sigmoid()


def judge_chunks(judge, row_pairs, num_rows, folder, size, batch_size, num_workers, judge_id, rank, world,
                 name="judge"):
    """Every chunk of `size` rows not already in folder, judged by rank (chunk % world), batch_size pairs a forward
    pass, and written there. row_pairs(i) = (query, [positive, pooled candidates...]) of row i; judge: a Judge or a
    rerank.Reranker (tools/distill.py's), named in the progress lines by name. -> {chunk: its file}"""
    chunk_rows = lambda c: [row_pairs(i) for i in range(c * size, min(num_rows, (c + 1) * size))]  # noqa: E731
    files = {}
    for c in range(math.ceil(num_rows / size)):
        keys = [[[x.get("text") or "", x.get("image") or ""] for x in [q] + xs] for q, xs in chunk_rows(c)]
        digest = hashlib.sha256(json.dumps([judge_id, JudgePrompt.PROMPT, keys]).encode()).hexdigest()[:16]
        files[c] = os.path.join(folder, f"chunk_{c:06d}_{digest}.json")
    done = sum(os.path.isfile(path) for path in files.values())
    if done and rank == 0:
        print(f"{name}: {done} of {len(files)} chunks already done in {folder} (an earlier run): skipped", flush=True)
    for c in range(rank, len(files), world):
        if os.path.isfile(files[c]):
            continue
        part = chunk_rows(c)
        pairs = [(q, x) for q, candidates in part for x in candidates]
        scores = judge.score(pairs, batch_size, num_workers, f"{name}: chunk {c + 1}/{len(files)}" if rank == 0 else "").tolist()
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


def gathered_scores(files, timeout_minutes):
    """Rank 0, its own chunks judged: every chunk's scores once all are there (wait_for_chunks), in row order ->
    [[the row's scores...]] per row."""
    wait_for_chunks(files, timeout_minutes)
    scores = []
    for c in sorted(files):
        with open(files[c]) as f:
            scores += json.load(f)["scores"]
    return scores


if __name__ == "__main__":  # a library of tools/mine.py: it says what it is and how it runs
    common.library_help(__doc__, sys.argv[1:])

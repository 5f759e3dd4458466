"""
tools/merge.py: average the weights of two or more checkpoints of one backbone and one embedding spec into one
export (model merging: Qwen3-VL-Embedding's last stage averages its fine-tuned models; a "model soup").

    python -m tools.merge --inputs="['out/seed1/export', 'out/seed2/export']" --out=out/merged
    python -m tools.merge --inputs="['out/a/export', 'out/b/step_002000']" --weights="[0.7, 0.3]" --out=out/merged

Each input is an export, a release or a training step folder, loaded as load_embedder loads it; a step folder's
LoRA adapters are folded in first (lora.merge_lora), so a Stage I step merges as its weights W + (alpha / r) B A.
The merged weights are sum_i w_i theta_i, in float32, with w the weights normalised to sum to 1 (equal weights by
default). Inputs must agree on the backbone family, every tensor's name and shape, and every field of the
embedding spec (the prompt, the pooling, the similarity, dim, the budgets, the release they descend from): a field
that differs is refused, naming it, since their vectors would mean different things. The result is written as
train.py writes out_dir/export/ (safetensors, the spec, sentence-transformers' files, a card) and loads wherever
an export loads; its pace.json names the inputs and their weights.
"""
import os
import sys

import torch

import common
import configurator
import lora
from common import UserError
from model import EmbeddingSpec
from runs.checkpoint import fingerprint
from runs.export import load_embedder, save_hf_folder

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
inputs = []  # two or more checkpoints: exports, releases or training step folders of one backbone and spec
weights = []  # one weight per input, normalised to sum to 1; [] = equal weights
out = ""  # the merged export's folder (replaced if it exists)
# -----------------------------------------------------------------------------


def mixing_weights(count, given):
    """The weights of count inputs: given, normalised to sum to 1, or equal ones. UserError on a bad list."""
    if not given:
        return [1.0 / count] * count
    if len(given) != count or not all(isinstance(w, (int, float)) and w >= 0 for w in given) or sum(given) <= 0:
        raise UserError(f"weights: expected {count} non-negative numbers, not all 0 (one per input), got {given!r}")
    return [w / sum(given) for w in given]


def spec_differences(first, other):
    """The embedding spec fields two checkpoints disagree on -> ["pooling: 'last_token' vs 'mean'", ...]"""
    a, b = first.to_dict(), other.to_dict()
    return [f"{key}: {a[key]!r} vs {b[key]!r}" for key in EmbeddingSpec.fields() if a.get(key) != b.get(key)]


def loaded(path):
    """An input -> (its Embedder with any LoRA adapters folded in, its float32 state_dict, its pace.json)."""
    embedder, info = load_embedder(path)
    lora.merge_lora(embedder)
    return embedder, {k: v.float() for k, v in embedder.state_dict().items()}, info


def merge(paths, given_weights=()):
    """Average the checkpoints at paths. -> (the first's spec, the merged state_dict, pace.json of the result)"""
    if len(paths) < 2:
        raise UserError(f"inputs: merging needs two or more checkpoints, got {len(paths)}")
    shares = mixing_weights(len(paths), list(given_weights))
    first, state, first_info = loaded(paths[0])
    merged = {k: shares[0] * v for k, v in state.items()}
    for path, share in zip(paths[1:], shares[1:]):
        embedder, state, _ = loaded(path)
        if embedder.family != first.family:
            raise UserError(f"{path}: a {embedder.family.name} checkpoint; {paths[0]} is {first.family.name}")
        differs = spec_differences(first.spec, embedder.spec)
        if differs:
            raise UserError(f"{path}: its embedding spec differs from {paths[0]}'s: " + "; ".join(differs)
                            + " (their vectors mean different things: merge checkpoints of one spec)")
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        wanted = {k: tuple(v.shape) for k, v in merged.items()}
        if shapes != wanted:
            odd = sorted(set(shapes) ^ set(wanted)) or [k for k in wanted if shapes[k] != wanted[k]]
            raise UserError(f"{path}: its tensors differ from {paths[0]}'s, e.g. {odd[0]}: merge checkpoints of one "
                            "backbone")
        for key, value in state.items():
            merged[key] += share * value
    info = {"step": first_info.get("step", "?"), "trained_lora_rank": first_info.get("trained_lora_rank",
                                                                                    first_info.get("lora_rank", 0)),
            "config": first_info.get("config", {}),
            "merged_from": [{"path": os.path.abspath(p), "weight": w, "fingerprint": fingerprint(p)}
                            for p, w in zip(paths, shares)]}
    return first.spec, merged, info


def main(argv=None):
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    if not out:
        raise UserError("out: name the merged export's folder (--out=out/merged)")
    spec, state, info = merge(inputs, weights)
    save_hf_folder(state, spec, out, info)
    print(f"merged {len(inputs)} checkpoints (" + ", ".join(f"{m['path']} x {m['weight']:.3g}"
                                                          for m in info["merged_from"]) + f") into {out}")
    return out


if __name__ == "__main__":
    common.install_error_hook()
    with torch.no_grad():
        main()

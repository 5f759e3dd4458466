"""
tools/merge.py: the merged tensors are the weighted average computed by hand, the result loads as an export does
and says what it came from, and checkpoints whose family or embedding spec differ are refused, naming the field.

    python -m pytest -q tests/test_merge.py
"""
import json
import os

import pytest
import torch

from common import UserError
from model import Embedder
from runs.export import load_embedder, save_hf_folder
from tools import merge


def export_of(embedder, folder, seed=None, **spec_changes):
    """embedder's weights (each moved by seeded noise, if seed) saved as an export at folder. -> (folder, state)"""
    state = {k: v.clone() for k, v in embedder.state_dict().items()}
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        state = {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in state.items()}
    save_hf_folder(state, embedder.spec.replace(similarity="dot", **spec_changes), str(folder), {"step": 4})
    return str(folder), state


def test_the_merge_is_the_weighted_average_and_loads_as_an_export(tiny_embedder, tmp_path):
    (a, first), (b, second) = export_of(tiny_embedder, tmp_path / "a", 1), export_of(tiny_embedder, tmp_path / "b", 2)
    out = merge.main([f"--inputs={[a, b]!r}", "--weights=[3, 1]", f"--out={tmp_path / 'merged'}"])
    merged = Embedder.from_pretrained(out).state_dict()
    assert set(merged) == set(first) and len(merged) > 50
    for key in first:  # by hand: 3/4 of a's tensor and 1/4 of b's
        torch.testing.assert_close(merged[key], 0.75 * first[key] + 0.25 * second[key], atol=1e-6, rtol=1e-6)
    embedder, info = load_embedder(out)
    assert embedder.spec.similarity == "dot" and [m["weight"] for m in info["merged_from"]] == [0.75, 0.25]
    assert [m["path"] for m in info["merged_from"]] == [os.path.abspath(a), os.path.abspath(b)]
    vectors = embedder.encode([{"text": "a red circle", "image": None}])
    assert vectors.shape == (1, embedder.dim) and torch.isfinite(vectors).all()
    assert "the weighted average of 2 checkpoints (tools/merge.py" in open(os.path.join(out, "README.md")).read()
    assert json.load(open(os.path.join(out, "pace.json")))["merged_from"][0]["fingerprint"]
    _, equal, _ = merge.merge([a, b])  # no weights: equal ones
    key = "model.language_model.norm.weight"
    torch.testing.assert_close(equal[key], 0.5 * first[key] + 0.5 * second[key], atol=1e-6, rtol=1e-6)


def test_checkpoints_of_another_spec_or_family_are_refused_naming_what_differs(tiny_embedder, tiny_checkpoints,
                                                                               tmp_path):
    a, _ = export_of(tiny_embedder, tmp_path / "a")
    mean, _ = export_of(tiny_embedder, tmp_path / "mean", pooling="mean")
    with pytest.raises(UserError, match=r"mean: its embedding spec differs from .*: pooling: 'last_token' vs 'mean'"):
        merge.merge([a, mean])
    short, _ = export_of(tiny_embedder, tmp_path / "short", dim=16)
    with pytest.raises(UserError, match=r"dim: 0 vs 16"):
        merge.merge([a, short])
    with pytest.raises(UserError, match=r"a Qwen3-VL checkpoint; .* is Qwen3.5"):
        merge.merge([a, tiny_checkpoints["qwen3_vl"]])
    with pytest.raises(UserError, match=r"weights: expected 2 non-negative numbers"):
        merge.merge([a, a], [1.0])
    with pytest.raises(UserError, match=r"two or more checkpoints, got 1"):
        merge.merge([a])

"""bench.py: its FLOP count and padding arithmetic, and its CPU mode end to end with tiny sizes (a subprocess)."""
import json
import os
import subprocess
import sys

import pytest

import bench
import lora

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_224_pixel_image_is_raised_to_the_release_minimum():
    # 224 x 224 = 50,176 pixels < 65,536: smart_resize raises it to 256 x 256 = 8 x 8 merged patches
    assert bench.side_tokens((5, (224, 224))) == bench.TEMPLATE_TOKENS + 5 + 64 + 2
    assert bench.side_tokens((5, None)) == bench.TEMPLATE_TOKENS + 5
    assert bench.padded_size([10, 3, 7], [[0, 2], [1]]) == 2 * 10 + 3


def test_step_flops_count_the_weight_gradients_only_when_fully_finetuning(tiny_checkpoint):
    from model import Embedder
    embedder = Embedder.from_pretrained(tiny_checkpoint)
    features = [embedder.preprocessor("a red circle"), embedder.preprocessor("a blue square at the top left")]
    batch = {"query": [embedder.preprocessor.collate(features)], "candidate": []}
    tokens = sum(len(f["input_ids"]) for f in features)
    full, adapted = bench.step_flops(embedder, batch, True), bench.step_flops(embedder, batch, False)
    matmul_weights = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                         if p.dim() >= 2 and "embed_tokens" not in n)
    assert full - adapted == pytest.approx(2 * matmul_weights * tokens)  # 6N vs 4N per token
    lora.inject_lora(embedder.model, 4, 8)
    assert bench.step_flops(embedder, batch, False) > adapted  # the adapters' matmuls count too


def test_cpu_mode_runs_and_reports_every_row(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "bench.py", "--sections=step,lora", "--iters=1", "--warmup=0", "--batch_size=2",
               "--num_hard_negatives=1", "--grad_cache_chunk=2", f"--out={out}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = results["step"]
    assert [r["name"] for r in rows] == ["Stage I (LoRA, cos)", "Stage I (LoRA, cos) + GradCache",
                                         "Stage II (full, dot)", "Stage II (full, dot) + GradCache"]
    for row in rows:
        assert row["step_s"] > 0 and row["floor_s"] > 0
        assert row["ratio"] == pytest.approx(row["step_s"] / row["floor_s"])  # one round: the paired ratio is the ratio
        assert sum(row["phases"].values()) == pytest.approx(1.0)
        assert row["name"] in result.stdout
    # 2 queries and 4 candidates: one chunk per side without GradCache, chunks of 2 items with it
    assert (rows[0]["chunks"], rows[1]["chunks"]) == (2, 3)
    assert rows[1]["ratio_own_floor"] < rows[1]["ratio"]
    assert results["lora"]["ratio"] > 0
    assert results["header"]["shape"] == "tiny" and results["header"]["gated_deltanet"]

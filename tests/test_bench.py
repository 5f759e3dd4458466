"""bench/bench.py: the padding arithmetic and its goal on the MMEB-shaped mix, the FLOP count it reports, its one-rank
FSDP2 mode end to end (a subprocess, tiny sizes), the start-up figures on a synthetic download
in mmE5's layout, and bench/fla_check.py's comparison on a CPU."""
import json
import sys

import pytest

import lora
from bench import bench, fla_check, synthetic
from tests.toyrun import rank_env, run_process
from runs.cost import step_flops
from shapes.pretrain import torch_threads

TINY = ["--iters=1", "--warmup=0", "--batch_size=4", "--num_hard_negatives=1", "--grad_cache_chunk=2",
        "--max_pixels=131072"]  # the MMEB-shaped mix's images at most 362 x 362: seconds, not minutes


def run_bench(tmp_path, *args):
    """python -m bench.bench with tiny sizes in a subprocess, from the repository root. -> (its JSON results, its
    output)"""
    out = tmp_path / "bench.json"
    code, output = run_process([sys.executable, "-m", "bench.bench", *TINY, *args, f"--out={out}"], env=rank_env())
    assert code == 0, output[-5000:]
    return json.loads(out.read_text()), output


def test_a_224_pixel_image_is_raised_to_the_release_minimum():
    # 224 x 224 = 50,176 pixels < 65,536: smart_resize raises it to 256 x 256 = 8 x 8 merged patches
    assert synthetic.side_tokens((5, (224, 224)), 1605632) == synthetic.TEMPLATE_TOKENS + 5 + 64 + 2
    assert synthetic.side_tokens((5, None), 1605632) == synthetic.TEMPLATE_TOKENS + 5
    assert bench.padded_size([10, 3, 7], [[0, 2], [1]]) == 2 * 10 + 3
    assert synthetic.equal_chunks([1, 5, 3, 4, 2], 2) == [[1, 3], [2, 4], [0]]  # ceil(5 / 2) chunks, longest first


def test_padding_goal_on_the_mmeb_shaped_mix():
    results = bench.Results()
    bench.measure_padding(results, None)  # the mix only: 100 batches of 32 rows, as --sections=padding
    rows = {row["name"]: row for row in results.data["padding"]}
    least, equal = rows["micro_batch 32, least padding"], rows["micro_batch 32, sorted, equal chunks"]
    assert rows["one chunk per side"]["mix_calls"] == 2
    assert least["mix"] <= 0.10 < equal["mix"] < rows["micro_batch 32, batch order"]["mix"]  # the goal, met by the cut
    assert least["mix_calls"] == 6 + 14 and equal["mix_calls"] == 1 + 6  # ceil(sqrt(n)) vs ceil(n / 32), n = 32, 192
    assert rows["GradCache 8, least padding"]["mix_calls"] == 6 + 24  # at least 192 / 8 candidate chunks
    assert least["mix"] < rows["GradCache 8, least padding"]["mix"] < rows["GradCache 8, sorted, equal chunks"]["mix"]


def test_step_flops_count_the_weight_gradients_only_when_fully_finetuning(tiny_checkpoint):
    from model import Embedder
    embedder = Embedder.from_pretrained(tiny_checkpoint)
    features = [embedder.preprocessor("a red circle"), embedder.preprocessor("a blue square at the top left")]
    chunks = [embedder.preprocessor.collate(features)]
    tokens = sum(len(f["input_ids"]) for f in features)
    full, adapted = step_flops(embedder, chunks, True), step_flops(embedder, chunks, False)
    matmul_weights = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                         if p.dim() >= 2 and "embed_tokens" not in n)
    assert full - adapted == pytest.approx(2 * matmul_weights * tokens)  # 6N vs 4N per token
    lora.inject_lora(embedder.model, 4, 8)
    assert step_flops(embedder, chunks, False) > adapted  # the adapters' matmuls count too


def check_step_rows(rows, stdout):
    assert [r["name"] for r in rows] == ["Stage I (LoRA, cos)", "Stage I (LoRA, cos) + GradCache",
                                         "Stage II (full, dot)", "Stage II (full, dot) + GradCache",
                                         "Stage I, 8-frame videos", "Stage II + MRL"]
    matryoshka = rows.pop()
    assert rows[-1]["real_tokens"] > rows[0]["real_tokens"]  # the video queries: 8 frames each, longer than images
    assert matryoshka["dims"] == [16, 32] and matryoshka["ratio"] > 0.5  # D/4 and D/2 of the tiny model's 64
    for row in rows:
        assert row["step_s"] > 0 and row["floor_s"] > 0 and row["name"] in stdout
        assert row["ratio"] == pytest.approx(row["step_s"] / row["floor_s"])  # one round: the paired ratio is the ratio
    # 4 queries and 8 candidates: ceil(sqrt(n)) chunks a side without GradCache (2 + 3), at most 2 items with it (2 + 4)
    assert (rows[0]["chunks"], rows[1]["chunks"]) == (5, 6)
    assert 0 < rows[1]["ratio_own_floor"] < rows[1]["ratio"]


@pytest.mark.slow
def test_fsdp_mode_shards_with_train_py_and_times_the_distributed_step(tmp_path):
    # the step as an 8-GPU run takes it (the plain mode times the same functions, unsharded: bench/RESULTS.md)
    results, stdout = run_bench(tmp_path, "--fsdp=True", "--sections=step,lora")
    assert results["header"]["sharding"] == {"backend": "gloo", "world_size": 1, "dtensor_parameters": True}
    assert results["header"]["shape"] == "tiny" and results["header"]["kernels"] and results["header"]["commit"]
    check_step_rows(results["step"], stdout)
    assert "lora" not in results  # under FSDP2: step and cut only


@pytest.mark.slow
def test_startup_converts_a_download_in_the_mmE5_layout_and_starts_two_ranks_on_it(tmp_path):
    results, stdout = run_bench(tmp_path, "--sections=startup", "--startup_rows=500")
    row, = results["startup"]
    assert row["video_rows"] == 74 and row["rows"] == 500 + 74 and row["ranks"] == 2  # none lost; two starts at once
    assert row["conversion_rows_per_s"] > 0 and 0 < row["start_s"] < 60
    assert 200 < row["table_bytes_per_row"] < 2000  # a row: its texts, paths and five negatives
    assert 0 <= row["start_private_bytes"] < 200 * 2**20  # a start holds no copy of the rows
    assert row["paper_conversion_s"] == pytest.approx(2_330_000 / row["conversion_rows_per_s"])
    assert row["check_data_bad"] == 0 and row["check_data_rows_per_s"] == pytest.approx(574 / row["check_data_s"])
    assert "--check_data=True on the cached table" in stdout and "74 video folders looked up" in stdout
    assert "the paper's 2,030,000 rows and 300,000 videos" in stdout


def test_fla_check_passes_a_second_reference_and_fails_a_wrong_one():
    # On a CPU, transformers' token-by-token reference stands in for fla's kernel; one with v's sign flipped is wrong
    # transformers' token-by-token PyTorch gated delta rule: a second, independent reference
    recurrent = fla_check.reference("torch_recurrent_gated_delta_rule")
    with torch_threads(1):  # many small ops: more threads only wait on each other
        assert max(fla_check.check(recurrent, "cpu", tokens=70).values()) <= fla_check.TOLERANCE
        wrong = fla_check.check(lambda q, k, v, **args: recurrent(q, k, -v, **args), "cpu", tokens=70)
    assert wrong["output"] > 1 and wrong["grad v"] > 1

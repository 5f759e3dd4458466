"""bench/bench.py: the padding arithmetic and its goal on the MMEB-shaped mix, the FLOP count it reports, its one-rank
FSDP2 mode end to end (a subprocess, tiny sizes), the start-up figures on a synthetic download
in mmE5's layout, bench/fla_check.py's comparison and choice on a CPU, section gdn's rows, and bench/gpu.sh's flow
(its dry run)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

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
                                         "Stage I, 8-frame videos", "Stage II + MRL", "Reranker (LoRA, pairs)"]
    reranker = rows.pop()  # 4 queries, each with its positive and negative: 8 prompts in ceil(sqrt(8)) calls
    assert (reranker["queries"], reranker["chunks"]) == (4, 3) and reranker["step_s"] > 0 and reranker["floor_s"] > 0
    assert reranker["name"] in stdout
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


def test_gdn_layer_rows_give_ratio_error_and_a_fifth_of_the_launches(monkeypatch):
    from bench import gdn
    from bench.timing import Results
    monkeypatch.setattr(gdn, "SHAPES", ((1, 70),))  # a partial chunk; the ops are counted at 2 x 4,096 on meta
    results = Results()
    gdn.measure_layers(results, torch.device("cpu"), torch.float32, iters=1, warmup=0)
    layer, ops = results.data["gdn"]
    assert layer["name"] == "1 x 70" and layer["transformers"]["ratio"] == 1.0 and layer["pytorch"]["ratio"] > 0
    assert layer["pytorch"]["largest_error"] < 1e-5 and layer["pytorch"]["largest_error_of"] in gdn.NAMES
    assert ops["share"] == ops["pytorch"] / ops["transformers"] <= 0.2 and ops["transformers"] > 2000


def test_gdn_step_rows_run_each_path_and_restore_the_environment(monkeypatch, tmp_path):
    from bench import gdn
    from bench.timing import Results
    import deltanet
    monkeypatch.delenv("PACE_DELTANET", raising=False)
    seen = []
    steps = [(name, lambda: seen.append(deltanet.paths(torch.device("cpu")).forward), 1000, 1e9)
             for name in ("Stage I", "Stage II")]
    results = Results()
    gdn.measure_step_paths(results, steps, torch.device("cpu"), iters=1, warmup=0, profile=str(tmp_path / "p.txt"))
    assert [row["name"] for row in results.data["gdn"]] == ["Stage I by path", "Stage II by path"]
    assert {"transformers", "pytorch"} <= set(seen) and "PACE_DELTANET" not in os.environ
    assert results.data["gdn"][0]["pytorch"]["tokens_per_s"] > 0
    assert (tmp_path / "p.txt").read_text().count("costliest ops") == 2


def test_fla_check_takes_the_fastest_path_that_agrees():
    right = {"agrees": True, "forward_agrees": True}
    results = [{"path": "flash-qla", "agrees": False, "forward_agrees": True, "forward_backward_ms": 1.0},
               {"path": "fla+tilelang", **right, "forward_backward_ms": 3.0},
               {"path": "fla_forward", **right, "forward_backward_ms": 2.0},
               {"path": "pytorch", **right, "forward_backward_ms": 9.0}]
    assert fla_check.fastest(results)["path"] == "fla_forward"  # flash-qla is faster, but wrong
    assert fla_check.fastest([{"path": "pytorch", **right}])["path"] == "pytorch"  # nothing timed: a CPU
    assert fla_check.fastest([dict(r, agrees=False) for r in results]) is None


@pytest.mark.slow
def test_fla_check_on_a_cpu_checks_deltanets_path_in_its_own_process(tmp_path):
    env_out = tmp_path / "path.env"
    code, output = run_process([sys.executable, "-m", "bench.fla_check", "--tokens=70", f"--env_out={env_out}"],
                               env=rank_env())
    assert code == 0, output[-3000:]
    assert re.search(r"pytorch +agrees +forward alone \d", output) and "fla  " in output
    assert output.count("not tried: no CUDA device") == len(fla_check.CHECKS) - 1
    assert env_out.read_text() == "export PACE_DELTANET=pytorch\n"


def test_gpu_sh_dry_run_shows_its_flow_within_the_machines_time():
    from configurator import config_keys
    result = subprocess.run(["bash", "bench/gpu.sh", "--dry-run"], capture_output=True, text=True, timeout=60,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr
    steps = re.findall(r"^\[(\d+) s\] ([\w.-]+): (.*)$", result.stdout, re.M)
    assert [name for _, name, _ in steps] == ["unpack", "fla_check", "qwen3.5-0.8b", "qwen3.5-2b"]
    assert sum(int(seconds) for seconds, _, _ in steps) <= 480  # 8 minutes of the machine's 15
    keys = {"bench.bench": config_keys(vars(bench)), "bench.fla_check": config_keys(vars(fla_check))}
    for _, name, command in steps[1:]:  # every flag is a key of the script it is given to
        script = re.search(r"-m (bench\.\w+)", command).group(1)
        flags = dict(re.findall(r"--(\w+)=(\S*)", command))
        assert set(flags) <= set(keys[script]), (name, set(flags) - set(keys[script]))
        if script == "bench.bench":
            assert flags["shape"] in synthetic.SHAPES and "gdn" in flags["sections"].split(",")


def test_fla_check_compares_the_fused_gated_norm_and_catches_a_wrong_one(monkeypatch):
    import deltanet

    def fused(x, g, weight, bias, activation, eps):  # fla's rms_norm_gated as documented, in float32
        assert bias is None and activation == "swish"
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight * torch.nn.functional.silu(g.float())
        return y.to(x.dtype)
    monkeypatch.setattr(deltanet, "fused_norm_on", lambda device: True)
    monkeypatch.setattr(deltanet, "fla_gated_norm", lambda: fused)
    errors = fla_check.check_norm(torch.device("cpu"), tokens=8)
    assert set(errors) == {"output", "grad x", "grad gate", "grad weight"}
    assert max(errors.values()) <= fla_check.TOLERANCE
    monkeypatch.setattr(deltanet, "fla_gated_norm", lambda: lambda x, g, weight, bias, **kw: fused(x, g, weight, bias,
                                                                                                  **kw) * 1.1)
    assert fla_check.check_norm(torch.device("cpu"), tokens=8)["output"] > fla_check.TOLERANCE

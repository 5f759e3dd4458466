"""
runs/results.py: what an evaluation keeps and shows (eval.py computes it): each dataset's result kept beside the
output as it finishes, keyed to what it depends on, so a rerun reads it back; the geometry samples and retrieval
sheets the tools draw from; the JSON's sections, the printed table, the model card's table and W&B.

    key = dataset_key("ImageNet-1K", folder, embedder.spec, fingerprint(init_from), settings)
    kept = kept_results("out/eval_datasets", {"ImageNet-1K": key}, overwrite=False)    # {name: result} finished
    report(output, "out/eval.json", started, card_folder="out/stage2/export")           # rank 0 only
"""
import hashlib
import json
import math
import os
import random

import torch
from safetensors.torch import save_file

import common
from readers import mmeb, mmeb_v2
from readers.evaluation import eval_files
from runs.export import add_evaluation
from runs.outdir import start_wandb


def sheet_rows(name, rows, scores, queries, top_k, seed):
    """`queries` seeded queries of a dataset with their top_k best candidates, for a retrieval sheet: [{"query":
    side, "results": [side with "score" and "gold"]}]."""
    picked = random.Random(f"{seed}/{name}").sample(range(len(rows)), min(queries, len(rows)))
    sheet = []
    for r in picked:
        top = [j for j in scores[r].argsort(descending=True).tolist() if math.isfinite(scores[r, j])][:top_k]
        sheet.append({"query": rows[r]["query"], "results": [dict(rows[r]["candidates"][j], score=float(scores[r, j]),
                                                                    gold=j == 0) for j in top]})
    return sheet


def dataset_key(name, folder, spec, checkpoint_id, settings):
    """What a dataset's result depends on, as a short hash: the checkpoint (its fingerprint), its embedding spec
    (the similarity, the prompt, the budgets: model.EmbeddingSpec), the evaluation's settings, and the dataset's
    files (path, size, modification time)."""
    paths = folder if isinstance(folder, list) else eval_files(folder)  # a V2 task's files, or a dataset folder's
    files = [(path, os.path.getsize(path), os.stat(path).st_mtime_ns) for path in paths]
    key = {"checkpoint": checkpoint_id, "spec": spec.to_dict(), "dataset": name, "files": files, **settings}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def kept_results(folder, keys, overwrite):
    """{name: result} of the datasets an earlier run finished under the same key (folder/<name>.json), unless
    overwrite. Rank 0 reads them; every rank gets the same answer."""
    kept = {}
    for name, key in keys.items():
        path = os.path.join(folder, f"{name}.json")
        if not overwrite and os.path.isfile(path):
            with open(path) as f:
                stored = json.load(f)
            if stored.get("key") == key:
                kept[name] = stored["result"]
    return kept


def keep_result(folder, name, key, result, sample):
    """Write one finished dataset's result (and its geometry sample) beside the output, atomically: the JSON last,
    so a kill loses at most the dataset in progress. Without a sample, an earlier run's is removed: the sample
    beside a result is always that result's."""
    path = os.path.join(folder, f"{name}.geometry.safetensors")
    if sample is not None:
        with common.replaced_atomically(path) as tmp:
            save_file({k: v.contiguous() for k, v in sample.items()}, tmp)
    elif os.path.exists(path):
        os.remove(path)
    common.write_json(os.path.join(folder, f"{name}.json"), {"key": key, "result": result})


def geometry_sample(embeddings, query_index, cand_index, size, generator):
    """What the geometry diagnostics (tools/geometry.py) need of one dataset, from its embeddings (N, D) and the
    rows' indices into them: geometry_sample_of its queries, their gold candidates and its distinct candidates."""
    candidates = embeddings[cand_index[cand_index >= 0].unique()]  # (M, D), distinct candidates
    return geometry_sample_of(embeddings[query_index], embeddings[cand_index[:, 0]], candidates, size, generator)


def geometry_sample_of(query_emb, positive_emb, candidate_emb, size, generator=None):
    """query_emb (Q, D) and positive_emb (Q, D) row by row (matched pairs), candidate_emb (M, D) -> per-pair
    scalars for every row (the log norm product and cos(q, c+) of the Pearson r, the norms), and vectors of a
    random sample of `size` queries and `size` candidates (the PCA and the random pairs)."""
    query_norm, positive_norm = query_emb.norm(dim=1), positive_emb.norm(dim=1)  # (Q,), (Q,)
    query_pick = torch.randperm(len(query_emb), generator=generator)[:size]
    candidate_pick = torch.randperm(len(candidate_emb), generator=generator)[:size]
    return {"log_norm_product": query_norm.clamp_min(1e-30).log() + positive_norm.clamp_min(1e-30).log(),  # (Q,)
            "cos_positive": torch.nn.functional.cosine_similarity(query_emb, positive_emb, dim=1),  # (Q,)
            "query_norms": query_norm, "candidate_norms": candidate_emb.norm(dim=1),  # (Q,), (M,)
            "queries": query_emb[query_pick], "candidates": candidate_emb[candidate_pick]}  # (s, D), (s', D)


def v2_section(per_task, image_results):
    """The MMEB-V2 part of the JSON: "results", every task's (an image task: its hit@1 as a fraction, from its
    P@1 run), and the means as readers.mmeb_v2.aggregate_v2 labels them (only all 78 is 'MMEB-V2 overall')."""
    results = {**{n: {"hit@1": r["v2_hit_at_1"] / 100, "num_queries": r["num_queries"]}
                  for n, r in image_results.items() if n in mmeb_v2.V2_TASKS}, **per_task}
    return {"results": results, **mmeb_v2.aggregate_v2(results)}


def scores_section(per_dataset, missing, is_mmeb):
    """One family's results -> its JSON part: the datasets, Table 8's means, the argmax means, and for MMEB how
    many of the 36 are in them."""
    section = {"datasets": per_dataset, **mmeb.aggregate(per_dataset),
               "argmax": mmeb.aggregate(per_dataset, "precision_at_1_argmax")}
    if is_mmeb:
        section["coverage"] = {"evaluated": len(per_dataset), "of": len(mmeb.MMEB_TABLE), "missing": missing}
    return section


def table_text(output):
    """The printed table: MMEB's part (its final score named for what it covers), then any other datasets apart."""
    parts = []
    if "datasets" in output:
        parts = [image_table(output)]
    if "mmeb_v2" in output:
        parts.append(mmeb_v2.format_table_v2(output["mmeb_v2"]["results"], f"MMEB-V2 ({output['similarity']} "
                                             "similarity; image tasks: hit@1 of the rows above)"))
    notes = "* out of distribution; P@1: ties are misses; argmax: the official scorer, ties go to the gold"
    notes += f"\nomitted (no Parquet files): {', '.join(output['omitted'])}" if output["omitted"] else ""
    return "\n\n".join(parts) + ("\n" + notes if "datasets" in output else "")


def image_table(output):
    """MMEB's table (its final score named for what it covers), then any other datasets apart."""
    if output["benchmark"] == "MMEB":
        coverage = output["coverage"]
        title = (f"Final score: MMEB overall, all {coverage['of']} datasets" if not coverage["missing"] else
                 f"Final score over {coverage['evaluated']} of MMEB's {coverage['of']} datasets (NOT MMEB overall; "
                 f"missing: {', '.join(coverage['missing'])})")
    else:
        title = f"Final score ({len(output['datasets'])} datasets, none of them MMEB's)"
    parts = [mmeb.format_table(output["datasets"], title)]
    if output.get("others"):
        parts.append(mmeb.format_table(output["others"]["datasets"], f"Final score of these {len(output['others']['datasets'])} "
                                       "datasets, apart from MMEB (in no MMEB mean)"))
    return "\n\n".join(parts)


def report(output, out, started, card_folder="", wandb_project=""):
    """Rank 0: the table, the JSON at out, the model card of card_folder (an export), W&B (when wandb_project)."""
    table = table_text(output)
    print(table)
    common.write_json(out, output, since=started)
    config = output["config"]
    print(f"wrote {out}" + (f"; draw its geometry: python -m tools.geometry {out}" if config["geometry"] else "")
          + (f"; its retrieval sheets: python -m tools.plot {out}" if config["sheet_queries"] else ""))
    spec = output["spec"]  # the settings the card's table was scored at, said with it
    settings = (f"{output['similarity']} similarity, instructions '{config['instructions']}', dim {output['dim']}, "
                f"max_pixels {spec['max_pixels']:,}, max_length {spec['max_length']:,}, video_frames "
                f"{spec['video_frames']}")
    if card_folder and add_evaluation(card_folder, f"MMEB ({settings}), eval.py:\n\n```\n{table}\n```"):
        print(f"added the table to {os.path.join(card_folder, 'README.md')}")
    if wandb_project:
        run_dir = os.path.dirname(os.path.abspath(output["init_from"]))
        wandb = start_wandb(run_dir, True, wandb_project, os.path.basename(run_dir), config)
        scores = {**output["meta_tasks"], "IND": output["IND"], "OOD": output["OOD"],
                  "overall": output["overall"]} if "meta_tasks" in output else {}
        if "mmeb_v2" in output:  # family, modality and all-task means, under names saying what they cover
            v2 = output["mmeb_v2"]
            scores.update({f"v2_{name}": c["mean"] for name, c in {**v2["families"], **v2["modalities"]}.items()})
            scores["v2_all" if v2["complete"] else "v2_partial_mean"] = v2["all"]["mean"]
        wandb.log({f"eval/{k}": v for k, v in scores.items() if v is not None})
        wandb.finish()

"""
readers/mmeb_v2.py: what this project knows of MMEB-V2's benchmark and how VLM2Vec-V2 scores it: the 78 scored
tasks (modality, family, headline metric, eval_type), VLM2Vec's ranking and RankingMetrics restated, and the
family / modality / all-task means. readers/mmeb_v2_rows.py reads the tasks from disk.

    V2_TASKS["MSR-VTT"]    # V2Task(modality='video', family='VID_RET', metric='hit@1', eval_type='global')
    ranking_metrics(scores, task["candidate_names"], task["labels"], task["rel_scores"], task["local"])
                           # scores (Q, K) over the pool -> {"hit@1": 0.52, "ndcg_linear@5": ..., ...} (fractions)
    aggregate_v2({"MSR-VTT": {"hit@1": 0.52, ...}, ...})           # family, modality and all-task means (x100)
    print(format_table_v2(per_task, "MMEB-V2, my model"))

Sources (TIGER-AI-Lab/VLM2Vec): experiments/public/eval/{image,video,visdoc}.yaml (task keys, eval_type),
experiments/report_score_v2.py (the 36 + 18 + 24 scored tasks by modality, hit@1 for image and video,
ndcg_linear@5 for visdoc, modality means over tasks), eval.py (ranking), src/utils/eval_utils/metrics.py
(RankingMetrics). The video and visdoc family groupings are those of Qwen3-VL-Embedding's MMEB-V2 gatherer (the
same tasks, in report_score_v2.py's order); the image families are MMEB v1's meta tasks (readers/mmeb.py), whose 36
names are the image.yaml keys unchanged.

Keys are the yaml keys, which are also eval.py's score-file names (<key>_score.json). Two visdoc tasks were fixed
on 2025-11-03 (VLM2Vec issue 167): the keys ViDoSeek-page and MMLongBench-page stayed, their data moved to
VLM2Vec/ViDoSeek-page-fixed and VLM2Vec/MMLongBench-page-fixed, and report_score_v2.py renames them to
'<key>-fixed' in its JSON report. Here the key is the yaml key (what the task reader and the score files say);
task_key() takes the '-fixed' name too, and the table marks the two, since numbers from before the fix (VLM2Vec's
v2.0 score files) are on the old data. VLM2Vec also runs or reports tasks outside the 78 (MomentSeeker_1k8, the
pre-dedup MomentSeeker; the English-only ViDoRe_*_v2 runs, ENGLISH_ONLY, which eval.py scores when
--v2_tasks names them and reports under their own heading and key): the means leave them out and name them.

How VLM2Vec ranks (eval.py, dense embeddings): scores are the dot products of L2-normalised float32 embeddings.
eval_type 'global' ranks every query against the whole de-duplicated pool, in the pool's order, with
np.argsort(-scores, axis=1); 'local' ranks a row's own candidate names only (in that row's order, a repeated name
twice), with np.argsort(-row_scores). Ties keep the order numpy's default sort gives: an unstable sort whose tie
order depends on the dtype, numpy's version and the CPU's SIMD path (numpy 2.4 on an AVX-512 CPU leaves index order
among ties even for five candidates). No rule restates that order, so rank() makes the very call VLM2Vec makes, on
the same dtype: the same numpy on the same CPU orders ties exactly as VLM2Vec does, and elsewhere both may order
them otherwise. (Late-interaction models, 3-D embeddings, rank with torch.argsort there; not restated here.)

How RankingMetrics scores a ranking, per query, then a plain mean over queries: golds are de-duplicated; hit@k 1
when a gold is in the top k; precision@k = distinct golds in the top k / k (k even when fewer candidates);
recall@k = that / number of golds (1.0 when a query has none); f1@k their harmonic mean; map@k sums precision at
each gold position of the top k (a repeated name counted each time) over min(golds, k); mrr@k 1 / rank of the first
gold in the top k; ndcg_{linear,exponential}@k = DCG / ideal DCG with gain rel or 2^rel - 1 and discount
log2(rank + 1), rel the graded qrels (rel_scores) when given, else 1 per gold; the ideal is the golds' rels sorted,
cut at k. RankingMetrics pairs rel_scores with list(set(labels)), the labels in a set's order, so a query with
golds of different grades can get another gold's grade. Here label i takes grade i, and the reader decides the
order (readers/mmeb_v2_rows.vlm2vec_pairing): for ViDoRe's integer ids, whose set order is fixed, the golds come
in that order, so the graded nDCG is VLM2Vec's own, pairing and all; for string ids (VisRAG), whose set order
follows PYTHONHASHSEED and changes from run to run in VLM2Vec, each gold keeps its own grade.
"""
import collections
import textwrap

import numpy as np
import torch

from common import UserError
from readers.mmeb import MMEB_DATASETS, mean

V2Task = collections.namedtuple("V2Task", "modality family metric eval_type")
HEADLINE = {"image": "hit@1", "video": "hit@1", "visdoc": "ndcg_linear@5"}  # report_score_v2.py's modality2metric

IMAGE_TASKS = ("ImageNet-1K", "N24News", "HatefulMemes", "VOC2007", "SUN397", "Place365", "ImageNet-A", "ImageNet-R",
               "ObjectNet", "Country211", "OK-VQA", "A-OKVQA", "DocVQA", "InfographicsVQA", "ChartQA", "Visual7W",
               "ScienceQA", "VizWiz", "GQA", "TextVQA", "VisDial", "CIRR", "VisualNews_t2i", "VisualNews_i2t",
               "MSCOCO_t2i", "MSCOCO_i2t", "NIGHTS", "WebQA", "FashionIQ", "Wiki-SS-NQ", "OVEN", "EDIS", "MSCOCO",
               "RefCOCO", "RefCOCO-Matching", "Visual7W-Pointing")  # report_score_v2.py's order; all eval_type local
VIDEO_FAMILIES = {  # family -> ((yaml key, eval_type), ...)
    "VID_CLS": (("K700", "global"), ("SmthSmthV2", "local"), ("HMDB51", "global"), ("UCF101", "global"),
                ("Breakfast", "global")),
    "VID_QA": (("MVBench", "local"), ("Video-MME", "local"), ("NExTQA", "local"), ("EgoSchema", "local"),
               ("ActivityNetQA", "local")),
    "VID_RET": (("DiDeMo", "global"), ("MSR-VTT", "global"), ("MSVD", "global"), ("VATEX", "global"),
                ("YouCook2", "global")),
    "VID_MRET": (("QVHighlight", "local"), ("Charades-STA", "local"), ("MomentSeeker", "local")),
}
VISDOC_FAMILIES = {  # family -> yaml keys, every one eval_type global
    "ViDoRe_v1": ("ViDoRe_arxivqa", "ViDoRe_docvqa", "ViDoRe_infovqa", "ViDoRe_tabfquad", "ViDoRe_tatdqa",
                  "ViDoRe_shiftproject", "ViDoRe_syntheticDocQA_artificial_intelligence",
                  "ViDoRe_syntheticDocQA_energy", "ViDoRe_syntheticDocQA_government_reports",
                  "ViDoRe_syntheticDocQA_healthcare_industry"),
    "ViDoRe_v2": ("ViDoRe_esg_reports_human_labeled_v2", "ViDoRe_biomedical_lectures_v2_multilingual",
                  "ViDoRe_economics_reports_v2_multilingual", "ViDoRe_esg_reports_v2_multilingual"),
    "VisRAG": ("VisRAG_ArxivQA", "VisRAG_ChartQA", "VisRAG_MP-DocVQA", "VisRAG_SlideVQA", "VisRAG_InfoVQA",
               "VisRAG_PlotQA"),
    "OOD": ("ViDoSeek-page", "ViDoSeek-doc", "MMLongBench-page", "MMLongBench-doc"),
}
V2_TASKS = {  # yaml key -> V2Task, image then video then visdoc
    **{name: V2Task("image", MMEB_DATASETS[name][0], HEADLINE["image"], "local") for name in IMAGE_TASKS},
    **{name: V2Task("video", family, HEADLINE["video"], eval_type)
       for family, tasks in VIDEO_FAMILIES.items() for name, eval_type in tasks},
    **{name: V2Task("visdoc", family, HEADLINE["visdoc"], "global")
       for family, names in VISDOC_FAMILIES.items() for name in names},
}
MODALITIES = {m: tuple(n for n, t in V2_TASKS.items() if t.modality == m) for m in HEADLINE}  # 36, 18, 24 keys
FAMILIES = {family: tuple(n for n, t in V2_TASKS.items() if t.family == family)
            for family in dict.fromkeys(t.family for t in V2_TASKS.values())}  # family -> keys, in table order
RENAMED = {"ViDoSeek-page": "ViDoSeek-page-fixed", "MMLongBench-page": "MMLongBench-page-fixed"}  # key -> report name
ENGLISH_ONLY = {f"ViDoRe_{topic}_v2": V2Task("visdoc", "ViDoRe_v2", HEADLINE["visdoc"], "global")
                for topic in ("biomedical_lectures", "economics_reports", "esg_reports")}
# visdoc.yaml's English-only runs of three ViDoRe v2 sets: not among the 78, so scored apart and in no mean


def task_key(name):
    """A task name -> its yaml key ('ViDoSeek-page-fixed' -> 'ViDoSeek-page'), or None if not one of the 78."""
    name = {report: key for key, report in RENAMED.items()}.get(name, name)
    return name if name in V2_TASKS else None


def v2_task(name):
    """A task eval.py scores -> its V2Task: one of the 78 (either name) or an English-only ViDoRe v2 run."""
    key = task_key(name)
    if key is None and name not in ENGLISH_ONLY:
        raise UserError(f"{name!r} is neither one of MMEB-V2's 78 tasks nor one of {', '.join(ENGLISH_ONLY)}")
    return V2_TASKS[key] if key else ENGLISH_ONLY[name]


# -----------------------------------------------------------------------------
# ranking, as VLM2Vec's eval.py ranks

def as_numpy_scores(scores, num_candidates=None):
    """scores (Q, K), numpy or torch, float -> a C-contiguous numpy array of the same dtype (torch bfloat16, which
    numpy lacks, becomes float32). NaN, a wrong rank or a wrong width is a UserError."""
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().cpu()
        scores = (scores.float() if scores.dtype == torch.bfloat16 else scores).numpy()
    scores = np.ascontiguousarray(scores)
    if scores.ndim != 2 or not np.issubdtype(scores.dtype, np.floating):
        raise UserError(f"scores must be a 2-D float matrix (queries, candidates), got {scores.dtype} "
                        f"of shape {tuple(scores.shape)}")
    if num_candidates is not None and scores.shape[1] != num_candidates:
        raise UserError(f"scores have {scores.shape[1]} columns but there are {num_candidates} candidate_names")
    if np.isnan(scores).any():
        q, k = np.argwhere(np.isnan(scores))[0]
        raise UserError(f"scores hold {int(np.isnan(scores).sum())} NaN, the first at query {q}, candidate {k}")
    return scores


def rank(scores, candidate_names, local=None, top=None):
    """Each query's candidate names, best first, cut to `top`: VLM2Vec's 'prediction' lists. scores (Q, K) over
    the pool candidate_names (K distinct names, in the pool's order); local: None (eval_type global: rank the whole
    pool) or, per query, its own candidate names (eval_type local: rank those only, in their order, a repeated name
    twice). Ties order as np.argsort(-scores) orders them (the file docstring says why)."""
    scores = as_numpy_scores(scores, len(candidate_names))
    position = {}
    for j, name in enumerate(candidate_names):
        if position.setdefault(name, j) != j:
            raise UserError(f"candidate_names: {name!r} at {position[name]} and {j} (the pool must be de-duplicated)")
    if local is None:
        order = np.argsort(-scores, axis=1)[:, :top]  # (Q, top) pool indices, as eval.py's global branch
        return [[candidate_names[j] for j in row] for row in order.tolist()]
    if len(local) != len(scores):
        raise UserError(f"local has {len(local)} rows but scores have {len(scores)} queries")
    ranked = []
    for q, names in enumerate(local):
        if not names:
            raise UserError(f"local: query {q} has no candidates")
        missing = [name for name in names if name not in position]
        if missing:
            raise UserError(f"local: query {q}'s candidate {missing[0]!r} is not among candidate_names "
                            f"({len(missing)} such)")
        row = scores[q, [position[name] for name in names]]  # (n,) that row's own scores, as eval.py's local branch
        ranked.append([names[i] for i in np.argsort(-row)[:top].tolist()])
    return ranked


# -----------------------------------------------------------------------------
# RankingMetrics, restated

METRICS = ("hit", "ndcg_linear", "ndcg_exponential", "precision", "recall", "f1", "map", "mrr")  # its key order


def dcg(gains):
    """sum gain_i / log2(i + 2) over ranks i = 0, 1, ..."""
    return float(sum(g / np.log2(i + 2) for i, g in enumerate(gains)))


def ndcg(top, grade, k, exponential):
    """nDCG@k of one ranking cut to k, grade: gold name -> its relevance."""
    gain = (lambda r: 2 ** r - 1) if exponential else (lambda r: r)
    ideal = sorted(grade.values(), reverse=True)[:k]
    idcg = dcg([gain(r) for r in ideal]) if ideal else 1.0  # no golds: RankingMetrics divides by 1
    return dcg([gain(grade.get(name, 0)) for name in top]) / idcg if idcg > 0 else 0.0


def query_metrics(ranked, labels, grades, k):
    """One query at one k -> {metric: value}; ranked: names best first, labels: its golds, grades: their rels
    (aligned with labels) or None."""
    gold = set(labels)
    top = ranked[:k]
    found = len(gold.intersection(top))  # distinct golds in the top k
    precision = found / k if gold else 0.0
    recall = found / len(gold) if gold else 1.0
    hits, precision_sum, first = 0, 0.0, None
    for i, name in enumerate(top):
        if name in gold:
            hits += 1
            precision_sum += hits / (i + 1)
            first = i if first is None else first
    grade = dict.fromkeys(gold, 1) if grades is None else dict(zip(labels, grades))
    return {"hit": 1.0 if found else 0.0,
            "ndcg_linear": ndcg(top, grade, k, exponential=False),
            "ndcg_exponential": ndcg(top, grade, k, exponential=True),
            "precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
            "map": precision_sum / min(len(gold), k) if hits else 0.0,
            "mrr": 1.0 / (first + 1) if first is not None else 0.0}


def k_list(ks):
    """ks -> sorted distinct positive ints (RankingMetrics sorts its k_list too), else a UserError."""
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise UserError(f"ks must be positive integers, got {ks!r}")
    return sorted(set(ks))


def metrics_from_rankings(rankings, labels, rel_scores=None, ks=(1, 5, 10)):
    """VLM2Vec's RankingMetrics.evaluate on rankings (per query: names, best first; the first max(ks) suffice):
    {"hit@1", ..., "ndcg_linear@k", "ndcg_exponential@k", "precision@k", "recall@k", "f1@k", "map@k", "mrr@k"} as
    fractions, each a plain mean over queries. labels: per query a list of gold names (or one name); rel_scores:
    None, or per query None or the golds' graded relevances, aligned with its labels."""
    ks = k_list(ks)
    if len(labels) != len(rankings) or (rel_scores is not None and len(rel_scores) != len(rankings)):
        raise UserError(f"{len(rankings)} queries but {len(labels)} label rows"
                        + (f" and {len(rel_scores)} rel_scores rows" if rel_scores is not None else ""))
    if not rankings:
        raise UserError("no queries to score")
    sums = {(metric, k): 0.0 for metric in METRICS for k in ks}
    for q, ranked in enumerate(rankings):
        gold = [labels[q]] if isinstance(labels[q], str) else list(labels[q])
        grades = None if rel_scores is None else rel_scores[q]
        if grades is not None and (len(grades) != len(gold) or len(set(gold)) != len(gold)):
            raise UserError(f"query {q}: {len(gold)} labels ({len(set(gold))} distinct) but {len(grades)} rel_scores;"
                            " graded labels must be distinct, one rel_score each")
        for k in ks:
            for metric, value in query_metrics(ranked, gold, grades, k).items():
                sums[metric, k] += value
    return {f"{metric}@{k}": sums[metric, k] / len(rankings) for metric in METRICS for k in ks}


def ranking_metrics(scores, candidate_names, labels, rel_scores=None, local=None, ks=(1, 5, 10)):
    """A task's scores (Q, K) over its pool -> VLM2Vec's metric dict (metrics_from_rankings), ranked as eval.py
    ranks (rank: the pool when local is None, else each row's own names). A gold that no ranking holds (not in the
    pool, or outside its row's local names) is a miss, as in VLM2Vec: its rows whose answer is none of their options
    (MVBench's "(@) ..." gold, readers/mmeb_v2_rows.py) count so; the reader counts them too."""
    if len(labels) != len(scores):
        raise UserError(f"scores have {len(scores)} queries but there are {len(labels)} label rows")
    rankings = rank(scores, candidate_names, local, top=max(k_list(ks)))
    return metrics_from_rankings(rankings, labels, rel_scores, ks)


# -----------------------------------------------------------------------------
# the benchmark's means

def coverage(names, scores):
    """{"mean", "present", "missing", "total"} of the tasks `names` over scores {key: percent}."""
    present = [n for n in names if n in scores]
    return {"mean": mean([scores[n] for n in present]), "present": present,
            "missing": [n for n in names if n not in scores], "total": len(names)}


def headline(name, result):
    """A task's metric dict (fractions) -> its headline metric x 100; a UserError when the metric is not there."""
    metric = v2_task(name).metric
    value = result.get(metric) if isinstance(result, dict) else None
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise UserError(f"per_task[{name!r}]: needs {metric!r} as a fraction in [0, 1] (VLM2Vec's score file), "
                        f"got {value!r}")
    return 100.0 * value


def aggregate_v2(per_task):
    """{task name: its metric dict (fractions, as ranking_metrics gives)} -> {"tasks": {key: headline x 100},
    "families": {family: coverage}, "modalities": {modality: coverage + "label"}, "all": coverage + "label",
    "complete": all 78 there, "english_only": {English-only ViDoRe v2 run: headline x 100} (scored, in no mean),
    "not_scored": other names given that are not among the 78 (not averaged)}. Coverage: {"mean", "present",
    "missing", "total"}; family means are over the family's tasks; modality and all-task means are plain means
    over tasks, not over families (as VLM2Vec reports them). Only the full 78 is labelled the MMEB-V2 overall; a
    partial set says 'N of 78'."""
    scores, english_only, not_scored = {}, {}, []
    for name, result in per_task.items():
        key = task_key(name)
        if name in ENGLISH_ONLY:
            english_only[name] = headline(name, result)
        elif key is None:
            not_scored.append(name)
        elif key in scores:
            raise UserError(f"per_task: {key!r} is given twice (as {key!r} and as {RENAMED[key]!r})")
        else:
            scores[key] = headline(name, result)
    summary = {"tasks": {n: scores[n] for n in V2_TASKS if n in scores},
               "families": {family: coverage(names, scores) for family, names in FAMILIES.items()},
               "modalities": {}, "all": coverage(tuple(V2_TASKS), scores),
               "english_only": {n: english_only[n] for n in ENGLISH_ONLY if n in english_only},
               "not_scored": not_scored}
    for modality, names in MODALITIES.items():
        c = summary["modalities"][modality] = coverage(names, scores)
        c["label"] = f"{modality}: {len(c['present'])} of {c['total']} tasks"
    c = summary["all"]
    summary["complete"] = not c["missing"]
    c["label"] = (f"MMEB-V2 overall: all {c['total']} tasks" if summary["complete"]
                  else f"mean of {len(c['present'])} of {c['total']} tasks (partial, {len(c['missing'])} missing)")
    return summary


def format_table_v2(per_task, title):
    """The benchmark's table for a run: tasks by modality and family (headline score x 100, its metric, the
    queries when the result says num_queries or num_data), family means, then under `title` the modality means
    and the all-task mean; a partial run names what it lacks and is never called the overall."""
    number = lambda x: "-" if x is None else f"{x:.1f}"
    summary = aggregate_v2(per_task)
    scores = summary["tasks"]
    lines = [f"{'task':<50}{'score':>7}  {'metric':<15}{'queries':>8}"]
    for modality, names in MODALITIES.items():
        lines.append(summary["modalities"][modality]["label"])
        for family in dict.fromkeys(V2_TASKS[n].family for n in names):
            c = summary["families"][family]
            lines.append(f"  {family}: {len(c['present'])} of {c['total']} tasks" + ("" if c["present"] else ", none"))
            if not c["present"]:
                continue
            for name in FAMILIES[family]:
                result = per_task.get(name, per_task.get(RENAMED.get(name), {}))
                queries = result.get("num_queries", result.get("num_data", ""))
                label = name + ("\u2020" if name in RENAMED else "")
                lines.append(f"    {label:<46}{number(scores.get(name)):>7}  "
                             f"{V2_TASKS[name].metric if name in scores else 'missing':<15}{queries:>8}")
            part = "" if not c["missing"] else f" ({len(c['present'])} of {c['total']})"
            lines.append(f"  {'All ' + family + part:<48}{number(c['mean']):>7}")
    lines.append(title)
    for modality in MODALITIES:
        c = summary["modalities"][modality]
        lines.append(f"{c['label']:<50}{number(c['mean']):>7}")
    c = summary["all"]
    lines.append(f"{c['label']:<50}{number(c['mean']):>7}")
    if c["missing"]:
        lines += textwrap.wrap(f"missing ({len(c['missing'])} of {c['total']}): " + ", ".join(c["missing"]), 118,
                               subsequent_indent="  ")
    if summary["english_only"]:
        lines.append("ViDoRe v2, English-only runs: not among the 78, in no mean")
        for name, score in summary["english_only"].items():
            queries = per_task[name].get("num_queries", per_task[name].get("num_data", ""))
            lines.append(f"    {name:<46}{number(score):>7}  {ENGLISH_ONLY[name].metric:<15}{queries:>8}")
    if summary["not_scored"]:
        lines.append("not among the 78 scored tasks (not averaged): " + ", ".join(summary["not_scored"]))
    if any(name in scores for name in RENAMED):
        lines.append("\u2020 on the fixed data (VLM2Vec/<task>-fixed, 2025-11-03), which reports call '<task>-fixed'")
    return "\n".join(line.rstrip() for line in lines)


def format_own_v2(per_task):
    """eval.py's own tasks (v2_dir/own_tasks.json: each in the layout of an MMEB-V2 task, scored by its metric) ->
    their table: the task, the MMEB-V2 task whose layout it takes, its headline metric x 100, the queries; no mean."""
    lines = ["Own tasks in MMEB-V2's layouts (v2_dir/own_tasks.json), scored as those tasks are, in no MMEB-V2 mean",
             f"{'task':<34}{'layout of':<16}{'score':>7}  {'metric':<15}{'queries':>8}"]
    for name, result in per_task.items():
        lines.append(f"    {name:<30}{result['layout']:<16}{100 * result[result['metric']]:>7.1f}  "
                     f"{result['metric']:<15}{result['num_queries']:>8}")
    return "\n".join(lines)

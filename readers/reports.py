"""
readers/reports.py: what reading one source found, said once: its files and rows, bad rows by reason with an
example, negatives per row, judged rows, what the instructions did, a leak of an evaluation dataset, a failure.
readers/training.py keeps each subset's report beside the prepared table; readers/evaluation.py reports a dataset.

    report = SourceReport("data/mmE5/mmE5-synthetic/VQA", "VQA", "train")
    print("\n".join(report.lines(num_hard_negatives=5)))      # what --check_data prints
    report.problems(skip_bad_rows=False)                      # why a run would not start
"""
import collections
import os


def summary(counts):
    """{what: count} -> '1,000 rewritten, 50 not of an MMEB dataset (kept)' (empty when nothing was counted)."""
    return ", ".join(f"{count:,} {what}" for what, count in collections.Counter(counts).most_common())


class SourceReport:
    """What reading one subset (a file or a subset folder) found: the files and split read and their rows, bad rows
    by reason with the first example, negatives per row before the fill, the rows a judge scored, what the
    instructions did ({"mode", "counts"}), a leak (training rows of an MMEB out-of-distribution dataset), a failure.
    lines() says it; problems() says why a run would not start. to_dict() / from_dict(): kept beside the table."""

    FIELDS = ("subset", "dataset", "split", "layout", "files", "bad", "examples", "negatives", "missing_negatives",
              "judged", "distinct", "instructions", "leak", "failure", "start", "stop", "entry", "videos")

    def __init__(self, subset, dataset, split, layout=""):
        self.subset, self.dataset, self.split, self.layout = subset, dataset, split, layout
        self.files, self.bad, self.examples, self.negatives = {}, collections.Counter(), {}, collections.Counter()
        self.missing_negatives = self.judged = self.distinct = self.start = self.stop = self.entry = 0
        self.instructions, self.leak, self.failure = {}, False, None
        self.videos = collections.Counter()  # frames a video has -> videos with that many

    @property
    def rows(self):
        return sum(self.files.values())

    @property
    def num_bad(self):
        return sum(self.bad.values())

    def bad_row(self, location, error):
        self.bad[error.reason] += 1
        self.examples.setdefault(error.reason, error.at(location))

    def to_dict(self):
        return {key: getattr(self, key) for key in self.FIELDS}

    @classmethod
    def from_dict(cls, values):
        report = cls(values["subset"], values["dataset"], values["split"])
        for key in cls.FIELDS:
            setattr(report, key, values.get(key, getattr(report, key)))
        report.bad = collections.Counter(report.bad)
        report.negatives = collections.Counter({int(n): c for n, c in report.negatives.items()})  # JSON keys: str
        report.videos = collections.Counter({int(n): c for n, c in report.videos.items()})
        return report

    def negative_range(self):
        """(min, median, max) of the negatives a row brought (the lower median of an even count)."""
        counts, seen = sorted(self.negatives.items()), 0
        middle = next(n for n, c in counts if (seen := seen + c) * 2 >= sum(self.negatives.values()))
        return counts[0][0], middle, counts[-1][0]

    def filled_and_cut(self, num_hard_negatives):
        """(rows with fewer than num_hard_negatives negatives, to be filled; rows with more, cut to their first)."""
        return (sum(c for n, c in self.negatives.items() if n < num_hard_negatives),
                sum(c for n, c in self.negatives.items() if n > num_hard_negatives))

    def lines(self, num_hard_negatives=None, video_frames=None):
        names = ", ".join(os.path.basename(f) for f in self.files) or "-"
        lines = [f"data: {self.subset}: {self.rows:,} rows from {names} (split {self.split}; dataset "
                 f"{self.dataset or 'not one of MMEB'}, layout {self.layout or 'unknown: no row read'})"]
        if self.negatives:
            low, middle, high = self.negative_range()
            line = (f"  negatives per row before the fill: min {low}, median {middle}, max {high}; "
                    f"{self.missing_negatives:,} entries with neither text nor image")
            if num_hard_negatives is not None:
                filled, cut = self.filled_and_cut(num_hard_negatives)
                line += f"; {filled:,} rows filled from other rows, {cut:,} cut to their first ones"
            lines.append(line)
        if self.videos:
            frames = sorted(self.videos.elements())
            lines.append(f"  videos: {len(frames):,}, frames each min {frames[0]}, median {frames[(len(frames) - 1) // 2]}"
                         f", max {frames[-1]}" + (f"; {sum(c for n, c in self.videos.items() if n < video_frames):,} "
                         f"with fewer than video_frames={video_frames}: all kept, not padded (as VLM2Vec-V2)"
                         if video_frames else ""))
        for reason, count in self.bad.most_common():
            lines.append(f"  bad rows: {count:,} {reason}, e.g. {self.examples[reason]}")
        if self.instructions.get("counts"):
            lines.append(f"  instructions='{self.instructions['mode']}': {summary(self.instructions['counts'])}")
        if self.leak:
            lines.append(f"  LEAK: {self.dataset} is one of MMEB's out-of-distribution evaluation datasets")
        if self.failure:
            lines.append(f"  cannot be used: {self.failure}")
        return lines

    def problems(self, skip_bad_rows, allow_eval_datasets=False, num_hard_negatives=0, judged=False):
        """Why a run would not start on this source: [] when it would. Each names what to do about it."""
        problems = [self.failure] if self.failure else []
        if self.bad and not skip_bad_rows:
            reason, _ = self.bad.most_common(1)[0]
            problems.append(f"{self.num_bad:,} bad rows, e.g. {self.examples[reason]} (skip_bad_rows=True skips them)")
        if self.leak and not allow_eval_datasets:
            problems.append(f"rows of {self.dataset}, one of MMEB's 16 out-of-distribution evaluation datasets: "
                            "training on it leaks its test set (leave it out, or allow_eval_datasets=True)")
        if judged and self.rows:
            if self.judged < self.rows:
                problems.append(f"{self.rows - self.judged:,} of {self.rows:,} rows have no judge scores "
                                "(python -m tools.mine --judge_from=... writes them)")
            elif self.negatives and min(self.negatives) < num_hard_negatives:
                problems.append(f"rows with {min(self.negatives)} judged negatives, num_hard_negatives="
                                f"{num_hard_negatives} needed: mine with --num_hard_negatives={num_hard_negatives} "
                                "or more")
        if self.filled_and_cut(num_hard_negatives)[0] and (self.distinct <= num_hard_negatives or self.rows < 2):
            problems.append(f"cannot fill rows to {num_hard_negatives} hard negatives: the subset has "
                            f"{self.rows:,} rows and {self.distinct} distinct candidates")
        return problems

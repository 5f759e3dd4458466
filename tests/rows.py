"""
Training rows as train.py reads them, for the tests: the sources converted into a prepared table under a test's
own folder (readers/training.py), refused as a run would refuse them, each row read with its negatives filled
or cut (data.py).

    rows, reports = read_rows(tmp_path, "data/x.jsonl", "data", num_hard_negatives=2)
    dataset = train_dataset(tmp_path, preprocessor, "data/x.jsonl", "data", num_hard_negatives=2)
"""
import os

import data
from readers import training
from readers.reports import SourceReport


def table(folder, train_data, image_dir, num_hard_negatives=0, **options):
    """The checked prepared table of train_data, converted into folder/tables."""
    return training.checked_table(train_data, str(image_dir), os.path.join(folder, "tables"), num_hard_negatives,
                                  **options)


def read_rows(folder, train_data, image_dir, num_hard_negatives=0, seed=0, **options):
    """-> (every row as data.filled gives it, the subsets' SourceReports)."""
    found = table(folder, train_data, image_dir, num_hard_negatives, **options)
    return ([data.row_with_negatives(found, i, num_hard_negatives, seed) for i in range(len(found))],
            [SourceReport.from_dict(s) for s in found.subsets])


def train_dataset(folder, preprocessor, train_data, image_dir, num_hard_negatives=0, seed=0, skip_bad_rows=False,
                  **options):
    """The data.TrainDataset train.py would build over train_data."""
    found = table(folder, train_data, image_dir, num_hard_negatives, skip_bad_rows=skip_bad_rows, **options)
    return data.TrainDataset(found, preprocessor, num_hard_negatives, seed, skip_bad_rows)

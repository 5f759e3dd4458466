"""
bench/timing.py: how bench/bench.py takes and keeps its figures: functions timed side by side, round-robin, their
ratio the median of each round's; the rows printed and written as JSON after each, compared with an earlier run.

    times, medians = side_by_side({"step": step, "floor": floor}, device, rounds=10, warm=2)
    ratio = paired_ratio(times["step"], times["floor"])
    python -m bench.bench --out=bench/out/new.json --compare=bench/out/old.json     # its Results, compared
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import common



def clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def side_by_side(functions, device, rounds, warm):
    """{name: function} -> ({name: [seconds in each timed round]}, {name: median seconds}) over `rounds` after `warm`:
    round-robin, so each round times the functions back to back and drift in the machine's speed hits all alike."""
    times = {name: [] for name in functions}
    for i in range(warm + rounds):
        for name, function in functions.items():
            start = clock(device)
            function()
            if i >= warm:
                times[name].append(clock(device) - start)
    return times, {name: statistics.median(values) for name, values in times.items()}


def paired_ratio(numerators, denominators):
    """The median over rounds of numerator / denominator, each pair timed back to back."""
    return statistics.median(a / b for a, b in zip(numerators, denominators))




class Results:
    """The run's rows by section, plus "header"; rewritten to `path` after every row, so a run cut short keeps
    what it did. A row whose ratio is more than 10 % worse than in `before` (an earlier run's JSON) says so."""

    def __init__(self, path="", before=""):
        self.path, self.data = path, {}
        self.before = json.loads(Path(before).read_text()) if before else {}

    def add(self, section, row, line, ratio=None):
        earlier = [r for r in self.before.get(section, []) if r.get("name") == row["name"]]
        if ratio and earlier and earlier[0].get(ratio) and row[ratio] > 1.10 * earlier[0][ratio]:
            line += f"  REGRESSION (was {earlier[0][ratio]:.3f})"
        self.data.setdefault(section, []).append(row)
        print(line, flush=True)
        self.write()

    def write(self):
        if self.path:
            common.write_json(self.path, self.data)


def attempt(results, section, name, measure, *args):
    """Run one measurement; a GPU out-of-memory error becomes its row and the next measurement still runs."""
    try:
        return measure(results, *args)
    except torch.cuda.OutOfMemoryError as error:
        message = "out of memory: " + str(error).splitlines()[0][:120]
    torch.cuda.empty_cache()  # outside the except block, so the failed measurement's tensors are released first
    results.add(section, {"name": name, "error": message}, f"  {name:<32} {message}")


if __name__ == "__main__":  # a library: it says what it is and what runs it
    common.library_help(__doc__, sys.argv[1:])

"""How much of a real server start's luck its prefill speed shows.

    python bench/start_speed_real.py FOLDER [FOLDER ...]

Each FOLDER is one ``bench/search_real_llamacpp.py --folder`` keeps (``real-grid/`` and
``real-model/``: speculation off and ngram-simple, whose prefill is the target's alone, so no
configuration changes it). Per level of every kept start: its rate's deviation from the mean
over every start of its configuration (log scale; configurations measured in one start only are
left out), beside its prefill speed's deviation from its workload's mean (prompt tokens per
second of time to first token, from the requests' own figures). Printed:

    levels N; spread: prefill P%, rate R%
    correlation C (decode rate alone D); slope S; the rate's spread with the prefill's part taken out: A%

A start that runs its prefill fast runs its decode fast too where the machine, not the
configuration, sets the pace (a shared 2-core VM). The step model reads it as a start's prefill
lag (analysis/start_effect.py, docs/math.md); this bench measures the relation on its own, from the
trials' records, with no model.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np


def levels(folders: list[Path]) -> list[tuple[str, str, float, float, float]]:
    """(configuration, workload, rate, decode rate, prefill tokens/s) per kept level at one stream."""
    out = []
    for folder in folders:
        for trial in sorted(folder.glob("real-*/trials/trial-*.json")):
            data = json.loads(trial.read_text())
            for workload, measured in data.get("workloads", {}).items():
                if measured.get("error") or not measured.get("levels"):
                    continue
                level = measured["levels"][0]
                prefill = (level.get("prefill_tokens_per_s") or {}).get("mean")
                decode = (level.get("decode_tokens_per_s_per_stream") or {}).get("mean")
                if prefill and decode and level.get("output_tokens_per_s"):
                    spec = data.get("spec") or "off"
                    out.append((spec, workload, level["output_tokens_per_s"], decode, prefill))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    rows = levels(parser.parse_args().folders)
    by_config: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    prefill: dict[str, list[float]] = defaultdict(list)
    for spec, workload, rate, decode, speed in rows:
        by_config[(spec, workload)].append((math.log(rate), math.log(decode)))
        prefill[workload].append(math.log(speed))
    x, y, d = [], [], []
    for spec, workload, rate, decode, speed in rows:
        mine = by_config[(spec, workload)]
        if len(mine) < 2:
            continue
        x.append(math.log(speed) - float(np.mean(prefill[workload])))
        y.append(math.log(rate) - float(np.mean([r for r, _ in mine])))
        d.append(math.log(decode) - float(np.mean([v for _, v in mine])))
    if len(x) < 3:
        raise SystemExit("error: fewer than three levels of configurations measured in two starts or more")
    xs, ys, ds = np.array(x), np.array(y), np.array(d)
    slope = float(np.polyfit(xs, ys, 1)[0])
    print(f"levels {len(xs)}; spread: prefill {100 * xs.std():.1f}%, rate {100 * ys.std():.1f}%")
    print(
        f"correlation {np.corrcoef(xs, ys)[0, 1]:.2f} (decode rate alone {np.corrcoef(xs, ds)[0, 1]:.2f}); "
        f"slope {slope:.2f}; the rate's spread with the prefill's part taken out: {100 * (ys - slope * xs).std():.1f}%"
    )


if __name__ == "__main__":
    main()

"""The same variants by name under two builds of convtune: did a change to the generated code
move their GPU times?

Two steps, each in its own process, so that two wheels can take turns:
    python benches/winner_ab.py tune winners.json [SPEC ...]
        tunes every spec (default: the decoders and upsamplers of benches/upsample_vs_torch.py)
        in every mode at the default budget and writes the winners' names (CONVTUNE_FAMILIES
        restricts the families, as it does for any tuning);
    python benches/winner_ab.py time winners.json [more.json ...] --label new [--reps 200] >> times.jsonl
        times each winner by name (median of `--reps` timestamp-query runs) and prints one
        JSON line per (spec, mode).
Run `time` alternately with each build on PYTHONPATH (old, new, old, new, ...); then
    python benches/winner_ab.py compare times.jsonl
prints, per winner, each build's median over its rounds and new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = ("highest", "high", "float16")


def specs(given):
    if given:
        return given
    from upsample_vs_torch import DECODERS, UPSAMPLERS

    return DECODERS + UPSAMPLERS


def in_mode(shape, mode):
    """float16 data is channels-last, as the upsampling bench times it."""
    return replace(shape, dtype="float16", layout="NHWC") if mode == "float16" else shape


def precision(mode):
    return None if mode == "float16" else mode


def tune(out, given):
    import convtune
    from convtune._shapes import parse_spec

    rows = []
    for spec in specs(given):
        for mode in MODES:
            shape = in_mode(parse_spec(spec), mode)
            report = convtune.tune(*shape.args(), **shape.kwargs(), force=True, precision=precision(mode))
            rows.append({"spec": spec, "mode": mode, "variant": report.winner})
            print(f"{spec:40s} {mode:8s} {report.winner}", file=sys.stderr)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


def time_all(paths, label, reps):
    import convtune
    from convtune._shapes import parse_spec

    for row in [r for path in paths for r in json.load(open(path))]:
        shape = in_mode(parse_spec(row["spec"]), row["mode"])
        _, times = convtune.time_variant(
            *shape.args(), **shape.kwargs(), variant=row["variant"], reps=reps, precision=precision(row["mode"])
        )
        print(json.dumps(dict(row, label=label, ms=statistics.median(times) * 1e3)), flush=True)


def compare(path):
    by = {}
    for line in open(path):
        r = json.loads(line)
        by.setdefault((r["spec"], r["mode"], r["variant"]), {}).setdefault(r["label"], []).append(r["ms"])
    labels = sorted({lab for v in by.values() for lab in v})
    if len(labels) != 2:
        sys.exit(f"compare needs two labels, found {labels}")
    old, new = ("old", "new") if set(labels) == {"old", "new"} else labels
    print(f"| problem | mode | variant | {old} ms | {new} ms | {new} / {old} |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for (spec, mode, variant), v in by.items():
        a, b = statistics.median(v[old]), statistics.median(v[new])
        ratios.append(b / a)
        print(f"| {spec} | {mode} | `{variant}` | {a:.4f} | {b:.4f} | {b / a:.3f} |")
    geo = statistics.geometric_mean(ratios)
    print(f"\n{len(ratios)} winners: {new} / {old} geometric mean {geo:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune")
    t.add_argument("out")
    t.add_argument("spec", nargs="*")
    m = sub.add_parser("time")
    m.add_argument("winners", nargs="+")
    m.add_argument("--label", required=True)
    m.add_argument("--reps", type=int, default=200)
    c = sub.add_parser("compare")
    c.add_argument("times")
    a = p.parse_args()
    if a.cmd == "tune":
        tune(a.out, a.spec)
    elif a.cmd == "time":
        time_all(a.winners, a.label, a.reps)
    else:
        compare(a.times)


if __name__ == "__main__":
    main()

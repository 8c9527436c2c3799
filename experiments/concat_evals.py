"""One evaluation file from several of the same model on disjoint task sets, for `agentic-rl compare`.

    python experiments/concat_evals.py evals/plan-sft-1door.json evals/plan-sft-1door-t1.json \
        --label one-door-200 --out evals/plan-sft-200.json

Concatenates `per_task` (task ids must not repeat: the sets must be disjoint, e.g. `eval --seed 0`
and `--seed 1` on plan) and recomputes pass@1 over all tasks; the first file's other fields stay,
`ci95` is dropped (compare computes its own). Greedy (k = 1) files only. The files must name the
same model; `--model NAME` says they are one model whose path they spell differently (one evaluated
from another folder), and names it so in the output.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", help="the model's name, when the files spell its path differently")
    args = parser.parse_args()
    runs = [json.load(open(path)) for path in args.files]
    if any(run.get("k", 1) != 1 for run in runs):
        raise SystemExit(f"{args.files}: every file must be a greedy (k = 1) evaluation")
    if not args.model and any(run["model"] != runs[0]["model"] for run in runs):
        raise SystemExit(
            f"{args.files}: the files name different models ({sorted({run['model'] for run in runs})}); "
            "pass --model NAME if they are one model evaluated from different folders"
        )
    merged = {key: value for key, value in runs[0].items() if key != "ci95"}
    merged["per_task"] = {key: [v for run in runs for v in run["per_task"][key]] for key in runs[0]["per_task"]}
    ids = merged["per_task"]["id"]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{args.files}: task ids repeat; concatenate evaluations of disjoint task sets only")
    merged.update(label=args.label, n=len(ids), **{"pass@1": sum(merged["per_task"]["greedy"]) / len(ids)})
    if args.model:
        merged["model"] = args.model
    with open(args.out, "w") as handle:
        json.dump(merged, handle)


if __name__ == "__main__":
    main()

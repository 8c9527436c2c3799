"""How far a reader walks to follow a run's setup: the files a tiny GRPO run's code passes through,
call by call, from `train_grpo(cfg)` until its first rollout batch is drawn (issue 68: "followed call
by call from train_grpo, its config makes 42 stops in 19 files, climbs back up a layer 9 times and
returns 23 times to a file it had left").

    PYTHONPATH=src python experiments/setup_walk.py [--walk]

A stop is a run of consecutive frames in one file of agentic_rl (calls and the returns back to the
caller alike: the reader follows both). A return is a stop in a file the walk had already left. A
climb is a call from a file of one layer into a file of a higher one (layers in data-flow order,
LAYERS below), i.e. a lower layer calling up. Library code (torch, transformers, accelerate) is
invisible: a call into it and back is no stop. `--walk` prints the stops in order. Last, the calls from outside into the files of the run folder
(RUN_FOLDER: start, check, resume, checkpoint, finish), the number issue 68 asks to be one home
entered once.

Issue 68, measured 2026-12-08 (a tiny-qwen3 GRPO run's setup): at 272db58, before the run's life
moved into training/run_dir.py, 377 stops in 67 files, 310 returns, 26 climbs, and 5 calls into the
run folder's files (on_policy -> run_record twice, in start_run's setup; loop ->
run_dir, loop -> checkpoint, loop -> run_dir: the resume); after it, 375 stops in 68 files, 307
returns, 25 climbs, and 2 calls (on_policy -> run_dir `start_run`, loop -> run_dir `resume`); at
0105f43, with imports at the top of their modules, 365 stops in 62 files, 303 returns, 25 climbs, the
same 2 calls. The walk as a whole is about as long as before: most of its stops are config,
registry and model code.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from agentic_rl.config import load_config
from agentic_rl.training.grpo import train_grpo
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.sampler import Sampler

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentic_rl"
LAYERS = [
    ("errors", "strict_json", "config", "config_yaml", "config_extends", "config_docs", "registry", "plugins"),
    ("tools", "envs", "data"),
    ("rewards", "models"),
    ("rollout",),
    ("algorithms",),
    ("training",),
    ("evaluation", "integrations", "serving", "plugin_loading", "validation"),
    ("pipeline", "pipeline_eta", "pipeline_process", "train_commands", "cli", "cli_flags"),
]
RUN_FOLDER = (
    "training/run_dir.py",
    "training/run_record.py",
    "training/run_lock.py",
    "training/checkpoint.py",
    "strict_json.py",
)
"""The files of a run's folder: its start, check, resume, checkpoint and finish (issue 68: one home,
entered once). Their callers (the trainers, the loop) are outside it."""
TINY = [
    "model.name=tiny-qwen3",
    "model.lora.r=4",
    "rollout.batch_size=4",
    "rollout.group_size=2",
    "rollout.max_turn_tokens=8",
    "rollout.max_turns=1",
    "env.options={difficulty: 1}",
    "env.task_pool=8",
    "micro_batch_size=4",
    "train.progress=false",
    "train.steps=1",
]


def layer(file: str) -> int:
    part = Path(file).relative_to(PACKAGE).parts[0].removesuffix(".py")
    return next(index for index, names in enumerate(LAYERS) if part in names)


class FirstBatch(Exception):
    """Raised at the first `Sampler.draw`: the setup is over."""


def walk(cfg: GRPOConfig) -> list[tuple[str, str]]:
    """[(file, how it was entered: 'start', 'call', 'return')], one per stop."""
    stops: list[tuple[str, str]] = []
    package = str(PACKAGE)

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        if event == "call" and frame.f_code is Sampler.draw.__code__:
            raise FirstBatch
        file = frame.f_code.co_filename if event == "call" else (frame.f_back and frame.f_back.f_code.co_filename)
        if not file or not file.startswith(package):
            return
        if not stops or stops[-1][0] != file:
            stops.append((file, event if stops else "start"))

    sys.setprofile(profile)
    try:
        train_grpo(cfg)
    except FirstBatch:
        pass
    finally:
        sys.setprofile(None)
    return stops


def summary(stops: list[tuple[str, str]]) -> dict[str, int]:
    seen: set[str] = set()
    returns = climbs = 0
    for index, (file, how) in enumerate(stops):
        returns += file in seen
        seen.add(file)
        climbs += how == "call" and index > 0 and layer(file) > layer(stops[index - 1][0])
    return {"stops": len(stops), "files": len(seen), "returns": returns, "climbs": climbs}


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        cfg = load_config(GRPOConfig, overrides=[*TINY, f"train.output_dir={folder}/run"])
        stops = walk(cfg)
    if "--walk" in sys.argv:
        for file, how in stops:
            print(f"{how:6s} {Path(file).relative_to(PACKAGE)}")
    print(summary(stops))
    names = [(str(Path(file).relative_to(PACKAGE)), how) for file, how in stops]
    calls_in = [
        f"{names[index - 1][0]} -> {name}"
        for index, (name, how) in enumerate(names)
        if how == "call" and name in RUN_FOLDER and names[index - 1][0] not in RUN_FOLDER
    ]
    print(f"calls from outside into the run folder's files ({len(calls_in)}):", calls_in)


if __name__ == "__main__":
    main()

"""`gsm8k`: grade-school math word problems (GSM8K) with a calculator and/or python tool.

    env = make_env("gsm8k", tools=["calculator"])
    tasks = env.tasks("train", n=200)          # the first 200 training problems, in file order
    env.oracle_actions(tasks[0])               # replays the <<48/2=24>> annotations as calls

Tasks come from `agentic_rl.data.load_gsm8k` (the vendored copy by default). The env split
names "train"/"test" map to the data's splits through the `splits` option. `tasks(split, n,
seed)` keeps file order for seed 0 and applies a deterministic shuffle for any other seed.

The oracle groups the annotations by solution line: one turn per line that has annotations,
with one tool call per annotation, then `Final Answer: <the #### number>`. Lines are packed
together when there would be more turns than `max_turns` allows. With only the python tool,
each annotation becomes `print(<expr>)`.
"""

from __future__ import annotations

import dataclasses
import random

from agentic_rl.config import Config, NonNegativeInt, PositiveInt
from agentic_rl.data import GSM8KProblem, load_gsm8k, parse_annotations
from agentic_rl.envs.base import Task, register_env
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.tools.parse import format_tool_call

_ANNOTATION_TOOLS = ("calculator", "python")


@dataclasses.dataclass
class GSM8KOptions(Config):
    """Options of the `gsm8k` environment."""

    source: str = "vendored"
    """Where problems come from: "vendored", "openai/gsm8k", a directory or a JSONL/Parquet file."""
    splits: dict[str, str] = dataclasses.field(default_factory=lambda: {"train": "train", "test": "test"})
    """Env split name -> data split name, e.g. {"train": "train", "test": "test"}."""
    tools: list[str] | tuple[str, ...] = ("calculator",)
    """Tools offered to the policy: ["calculator"], ["python"] or both."""
    max_turns: PositiveInt = 10
    """Policy turns per episode (the longest oracle solution needs 10: 9 lines + the answer)."""
    tool_success_reward: float = 0.0
    """Reward per successful tool call, added to that turn's reward."""
    n: NonNegativeInt | None = None
    """Keep at most this many problems of each split (after `offset`); None keeps all."""
    offset: NonNegativeInt = 0
    """Skip this many problems at the start of each split."""
    max_steps: PositiveInt | None = None
    """Keep only the problems whose reference solution takes at most this many steps (calculations,
    as `<<...>>` annotations; solution lines where none is annotated), before `offset` and `n`: a
    curriculum of shorter problems for training. None keeps all. An evaluation that should speak
    for GSM8K leaves it unset."""

    def __post_init__(self) -> None:
        self.tools = tuple(self.tools)
        unknown = sorted(set(self.tools) - set(_ANNOTATION_TOOLS))
        if not self.tools or unknown:
            raise ValueError(
                f"gsm8k tools must be a non-empty subset of {list(_ANNOTATION_TOOLS)}, got {list(self.tools)}"
            )
        if not set(self.splits) <= {"train", "test"} or not self.splits:
            raise ValueError(f"splits maps 'train'/'test' to data splits, got {self.splits!r}")


@register_env("gsm8k", GSM8KOptions)
class GSM8KEnv(ToolEnv):
    """GSM8K problems; correct means the final answer equals the `####` number."""

    name = "gsm8k"

    def __init__(self, options: GSM8KOptions | None = None):
        self.options = options or GSM8KOptions()
        super().__init__(list(self.options.tools), self.options.max_turns, self.options.tool_success_reward)

    def problems(self, split: str) -> list[GSM8KProblem]:
        """The split's problems of at most `max_steps` steps, after `offset` and `n`, in file order."""
        if split not in self.options.splits:
            raise ValueError(f"unknown split {split!r}; this env maps {sorted(self.options.splits)}")
        problems = load_gsm8k(self.options.source, self.options.splits[split])
        if self.options.max_steps is not None:
            problems = [p for p in problems if solution_steps(p) <= self.options.max_steps]
        end = None if self.options.n is None else self.options.offset + self.options.n
        return problems[self.options.offset : end]

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        problems = self.problems(split)
        if seed != 0:
            problems = problems[:]
            random.Random(f"gsm8k:{split}:{seed}").shuffle(problems)
        return [problem_to_task(problem, split) for problem in problems[:n]]

    def oracle_actions(self, task: Task) -> list[str]:
        tool = "calculator" if "calculator" in self.options.tools else "python"
        return oracle_actions(task, tool, self.max_turns)


def solution_steps(problem: GSM8KProblem) -> int:
    """Steps of the reference solution: its calculations, or its lines where none is annotated."""
    return len(problem.annotations) or len(problem.solution_lines)


def problem_to_task(problem: GSM8KProblem, split: str) -> Task:
    solution_lines = problem.answer_text.rstrip("\n").split("\n")[:-1]  # without "#### N"
    annotated_lines = [[(a.expr, a.value) for a in parse_annotations(line)] for line in solution_lines]
    meta = {
        "index": problem.index,
        "n_steps": solution_steps(problem),
        "annotations": [(a.expr, a.value) for a in problem.annotations],
        "annotations_by_line": [line for line in annotated_lines if line],
        "solution": problem.answer_text,
    }
    return Task(f"gsm8k/{split}/{problem.index}", problem.question, problem.final_answer, meta)


def oracle_actions(task: Task, tool: str = "calculator", max_turns: int = 10) -> list[str]:
    """Replay the annotations as tool calls (one turn per solution line), then the answer."""
    groups = [list(line) for line in task.meta["annotations_by_line"]]
    tool_turns = max(1, max_turns - 1)
    while len(groups) > tool_turns:  # pack the two shortest neighbours until it fits
        position = min(range(len(groups) - 1), key=lambda i: len(groups[i]) + len(groups[i + 1]))
        groups[position : position + 2] = [groups[position] + groups[position + 1]]
    turns = []
    for number, group in enumerate(groups, start=1):
        calls = [_call(tool, expr) for expr, _value in group]
        shown = ", ".join(expr for expr, _value in group)
        turns.append(f"Step {number}: compute {shown}.\n" + "\n".join(calls))
    turns.append(f"Step {len(groups) + 1}: That gives the answer.\nFinal Answer: {task.answer}")
    return turns


def _call(tool: str, expression: str) -> str:
    if tool == "calculator":
        return format_tool_call("calculator", {"expression": expression})
    return format_tool_call("python", {"code": f"print({expression})"})

"""`reasoning_gym`: any reasoning-gym dataset (or a weighted mix of them) as an environment.

reasoning-gym (`pip install 'agentic-rl[reasoning-gym]'`) generates problems without end from
100+ procedural generators, each with a config of difficulty knobs and a `score_answer` verifier.
Here a dataset's question is the task, the policy ends with `Final Answer: <answer>`, and the
dataset's own `score_answer` grades it. Its score in [0, 1] is the last turn's reward (partial
credit kept: the `env_steps` reward pays it, `accuracy` pays only a full 1.0):

    env: {name: reasoning_gym, options: {dataset: basic_arithmetic, config: {min_terms: 2, max_terms: 3}}}
    env: {name: reasoning_gym, options: {datasets: [{name: chain_sum, weight: 2}, {name: gcd}]}}
    env: {name: reasoning_gym, options: {dataset: gsm_symbolic, tools: [calculator]}}

Splits: item i of seed s is drawn from reasoning-gym's generator seeded `base + i` (its own
rule: `Random(dataset.seed + idx)`), with base = s·2·SPLIT_SPAN for train and that plus
SPLIT_SPAN for test, so the two splits never share a generator seed for n < SPLIT_SPAN. Whether
two seeds can produce the same problem is the generator's business: a problem space smaller
than the draws (one-digit sums) repeats problems within and across splits. A dataset is built at
the split's n items: the few generators that draw every item when built (gsm_symbolic,
list_functions, acre) would never finish a billion, and acre's items depend on the size.

Tools are optional (`tools: [calculator]` or `[python]`); without them an episode is one turn.
The oracle (SFT's demonstrations, `envs oracle`) is the task's own solution: a calculator call on
the generator's recorded expression where there is one and a calculator is offered, the
generator's worked solution (`answer_cot`, gsm_symbolic's) where it has one, then the answer.
Nothing is downloaded: the generators ship their data. A dataset that fails to build or draw
(an unknown name, a bad config key, data it would fetch) fails when the env is built, before a
model loads, with reasoning-gym's own message.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from agentic_rl.config import Config, PositiveInt
from agentic_rl.envs.base import Task, register_env
from agentic_rl.envs.library_guard import missing_extra, offline, split_base
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.tools.parse import format_tool_call

SYSTEM_PROMPT = (
    "Answer the question. Reason step by step if it helps. End with a line `Final Answer: <answer>`, "
    "giving the answer in the form the question asks for."
)
TOOLS_PROMPT = (
    " To compute something, call a tool ({tool_names}) with a <tool_call>...</tool_call> block and wait for its result."
)
_FINAL_ANSWER = re.compile(r"final\s+answer\s*[:：]", re.IGNORECASE)


@dataclasses.dataclass
class ReasoningGymOptions(Config):
    dataset: str = "basic_arithmetic"
    """A reasoning-gym dataset name (`agentic-rl envs list` shows those installed); ignored by name
    when `datasets` is given, which must then be left at this default."""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The dataset's config keys, its difficulty knobs (e.g. {min_terms: 2, max_terms: 3}); checked by reasoning-gym."""
    datasets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """A weighted mix instead of one dataset: [{name, weight (default 1), config (default {})}, ...]."""
    tools: list[str] = dataclasses.field(default_factory=list)
    """Registered tools offered to the policy (e.g. [calculator]); none: one-turn episodes."""
    max_turns: PositiveInt = 4
    """Policy turns per episode (1 is enough without tools)."""
    system_prompt: str = ""
    """The system message; "": the bridge's own (answer, then `Final Answer: <answer>`; with tools,
    how to call them). Give the prompt a model was trained with to keep it (`{tool_names}` is
    filled in), e.g. the `gsm8k` env's for a GSM8K SFT model on `gsm_symbolic`."""

    def __post_init__(self) -> None:
        if self.datasets and (self.dataset != "basic_arithmetic" or self.config):
            raise ValueError("give either `dataset` (with `config`) or `datasets`, not both")
        for spec in self.datasets:
            unknown = sorted(set(spec) - {"name", "weight", "config"})
            if "name" not in spec or unknown:
                raise ValueError(f"each of `datasets` is {{name, weight, config}}; got {spec!r}")


@register_env("reasoning_gym", ReasoningGymOptions)
class ReasoningGymEnv(ToolEnv):
    """A reasoning-gym dataset: its question, its verifier, `Final Answer:` turns."""

    name = "reasoning_gym"

    def __init__(self, options: ReasoningGymOptions | None = None):
        self.options = options or ReasoningGymOptions()
        super().__init__(list(self.options.tools), self.options.max_turns)
        self._datasets: dict[tuple[int, int], Any] = {}
        self._entries: dict[tuple[str, int], dict[str, Any]] = {}
        self._dataset(0, 1)  # an unknown dataset, a bad config or a download fails here, when the config loads

    @property
    def system_prompt(self) -> str:
        if self.options.system_prompt:
            return self.options.system_prompt.replace("{tool_names}", ", ".join(self._tools_by_name))
        tools = TOOLS_PROMPT.format(tool_names=", ".join(self._tools_by_name)) if self.tools else ""
        return SYSTEM_PROMPT + tools

    @classmethod
    def catalogue(cls) -> str:
        """What the installed reasoning-gym offers, for `agentic-rl envs list`."""
        try:
            from reasoning_gym.factory import DATASETS  # local: optional extra
        except ImportError:
            return missing_extra("reasoning_gym", "reasoning-gym")
        return f"{len(DATASETS)} reasoning-gym datasets: {', '.join(sorted(DATASETS))}"

    def _dataset(self, base_seed: int, size: int) -> Any:
        """The reasoning-gym dataset of `size` items whose item i is drawn with generator seed
        base_seed + i. The size is the split's n, never more: a few generators (gsm_symbolic,
        list_functions, acre) draw all their items when built, so item i of those depends on
        the size, which `tasks` records in each task."""
        key = (base_seed, size)
        if key not in self._datasets:
            try:
                import reasoning_gym  # local: optional extra
                from reasoning_gym.composite import DatasetSpec  # local: optional extra
            except ImportError as exc:
                raise ValueError(missing_extra("reasoning_gym", "reasoning-gym")) from exc
            options = self.options
            what = options.dataset if not options.datasets else f"mix {[spec['name'] for spec in options.datasets]}"
            try:
                with offline(f"reasoning-gym dataset {what}"):
                    if options.datasets:
                        specs = [
                            DatasetSpec(spec["name"], float(spec.get("weight", 1.0)), dict(spec.get("config", {})))
                            for spec in options.datasets
                        ]
                        dataset = reasoning_gym.create_dataset("composite", datasets=specs, seed=base_seed, size=size)
                    else:
                        dataset = reasoning_gym.create_dataset(
                            options.dataset, seed=base_seed, size=size, **options.config
                        )
                    dataset[0]  # a generator that needs data it does not ship fails on its first draw
            except Exception as exc:  # noqa: BLE001 - reasoning-gym raises assorted types for a bad name or config
                raise ValueError(
                    f"reasoning-gym cannot build {what} with config {options.datasets or options.config}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._datasets[key] = dataset
        return self._datasets[key]

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        base = split_base("reasoning_gym", split, n, seed)
        if n == 0:
            return []
        dataset = self._dataset(base, n)
        out = []
        for index in range(n):
            entry = dataset[index]
            source = entry.get("metadata", {}).get("source_dataset", self.options.dataset)
            task_id = f"reasoning_gym/{source}/{split}/{seed}/{index}"
            self._entries[task_id, n] = entry
            out.append(
                Task(
                    task_id,
                    entry["question"],
                    str(entry["answer"]),
                    {"source_dataset": source, "split_base": base, "split_size": n, "index": index},
                )
            )
        return out

    def extract_answer(self, text: str) -> str | None:
        """The text after the last `Final Answer:`, as written: its first line, or every line up to
        the end of the turn when the reference answer spans lines (a grid)."""
        matches = list(_FINAL_ANSWER.finditer(text))
        if not matches:
            return None
        rest = text[matches[-1].end() :].strip()
        if not rest:
            return None
        multiline = self.task is not None and "\n" in self.task.answer.strip()
        return rest if multiline else rest.split("\n", 1)[0].strip()

    def score_answer(self, answer: str) -> float:
        """reasoning-gym's own verifier of the task's dataset, clipped to [0, 1]."""
        assert self.task is not None, "score_answer outside an episode"
        entry = self._entry(self.task)
        dataset = self._dataset(self.task.meta["split_base"], self.task.meta["split_size"])
        try:
            score = float(dataset.score_answer(answer, entry))
        except Exception:  # noqa: BLE001 - a verifier that chokes on hostile text scores it 0, never crashes a run
            return 0.0
        return min(1.0, max(0.0, score)) if score == score else 0.0

    def oracle_actions(self, task: Task) -> list[str]:
        """The task's own solution (module docstring): never a guess, and never more than the
        generator recorded."""
        metadata = self._entry(task).get("metadata", {})
        expression, worked = metadata.get("expression"), metadata.get("answer_cot")
        if expression and "calculator" in self._tools_by_name:
            return [format_tool_call("calculator", {"expression": str(expression)}), f"Final Answer: {task.answer}"]
        if worked:
            steps = str(worked).split("####")[0].strip()
            return [f"{steps}\nFinal Answer: {task.answer}"]
        return [f"Final Answer: {task.answer}"]

    def _entry(self, task: Task) -> dict[str, Any]:
        key = (task.id, task.meta["split_size"])
        if key not in self._entries:  # a task drawn by another instance: draw it again (deterministic)
            self._entries[key] = self._dataset(task.meta["split_base"], task.meta["split_size"])[task.meta["index"]]
        return self._entries[key]

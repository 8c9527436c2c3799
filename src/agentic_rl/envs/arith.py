"""`arith`: procedurally generated multi-step arithmetic word problems, solved with a calculator.

    env = make_env("arith", difficulty=[1, 2, 3], templates=list(SEEN_TEMPLATES))
    task = env.tasks("train", n=1, seed=0)[0]
    task.question  # "Maya has $48 in her wallet before going shopping. She spends $12 on a lamp.
                   #  Her aunt gives her enough money that she now has twice as much as before.
                   #  How many dollars does Maya have in her wallet now?"
    task.meta["steps"]  # [("48 - 12", "36"), ("36 * 2", "72")]

A problem is a story template plus a chain of `difficulty` operations (+, -, *, /) on one
running quantity. Operands are chosen so every intermediate result is a positive integer:
subtraction never goes below 1, division is exact.

Splits never overlap. Each problem has a canonical key (template, start value, operations),
independent of names and phrasing; train keeps only problems whose key hash is even, test
only odd ones, and a problem of the wrong parity is regenerated. So a test problem can never
appear in train, for any seeds, and task i of (split, seed) is the same on every machine.

Templates come in two groups so a demo can evaluate on stories kept out of training:
SEEN_TEMPLATES (shopping, baking, savings, sharing) and HELD_OUT_TEMPLATES (train, garden,
warehouse). Pick them with the `templates` option.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

from agentic_rl.config import Config, PositiveInt
from agentic_rl.envs.base import Task, register_env
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.tools.parse import format_tool_call

MAX_DIFFICULTY = 5
MULTIPLIERS = range(2, 7)
"""Factors used by "k times as many" steps."""
DIVISORS = range(2, 10)
"""Divisors used by "split into k equal parts" steps (only exact ones are chosen)."""
VALUE_CAP = 10**6
"""No intermediate result exceeds this; multiplication is skipped when it would."""
_MAX_ATTEMPTS = 1000

_NAMES = [
    ("Maya", "she", "her", "her", "herself"),
    ("Liam", "he", "him", "his", "himself"),
    ("Sofia", "she", "her", "her", "herself"),
    ("Noah", "he", "him", "his", "himself"),
    ("Aisha", "she", "her", "her", "herself"),
    ("Kenji", "he", "him", "his", "himself"),
    ("Elena", "she", "her", "her", "herself"),
    ("Omar", "he", "him", "his", "himself"),
]
_TIMES = {2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times"}
_FRACTION = {
    2: "half",
    3: "a third",
    4: "a quarter",
    5: "a fifth",
    6: "a sixth",
    7: "a seventh",
    8: "an eighth",
    9: "a ninth",
}
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_OP_OF_SYMBOL = {symbol: op for op, symbol in _SYMBOL.items()}
_VERB = {"add": "Add", "sub": "Subtract", "mul": "Multiply by", "div": "Divide by"}


@dataclasses.dataclass(frozen=True)
class Template:
    """One story: an intro sets the start value `{a}`; each operation has phrasings that use
    `{b}` (amount added/removed), `{k}` (factor), `{times}`, `{fraction}`, `{item}` (a fresh
    item per sentence), `{things}` (one per problem) and pronouns `{He} {he} {him} {his}`."""

    name: str
    intro: tuple[str, ...]
    add: tuple[str, ...]
    sub: tuple[str, ...]
    mul: tuple[str, ...]
    div: tuple[str, ...]
    question: str
    items: tuple[str, ...] = ("thing",)
    things: tuple[str, ...] = ("things",)


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in [
        Template(
            "shopping",
            ("{name} has ${a} in {his} wallet before going shopping.",),
            ("{He} returns a {item} and gets ${b} back.", "{He} finds ${b} in {his} coat pocket."),
            ("{He} spends ${b} on a {item}.", "{He} pays ${b} for a {item}."),
            ("{His} aunt gives {him} enough money that {he} now has {times} as much as before.",),
            ("{He} keeps only {fraction} of {his} money in the wallet and puts the rest in the bank.",),
            "How many dollars does {name} have in {his} wallet now?",
            items=("book", "scarf", "lamp", "board game", "backpack", "kite"),
        ),
        Template(
            "baking",
            ("{name} bakes {a} cookies for a school fair.",),
            ("{He} bakes another batch of {b} cookies.", "A neighbor brings over {b} more cookies."),
            ("{He} gives {b} cookies to {his} friends.", "{b} cookies break and are thrown away."),
            ("{He} keeps baking until {he} has {times} as many cookies as before.",),
            ("{He} packs the cookies equally into {k} boxes and keeps just one box.",),
            "How many cookies does {name} have now?",
        ),
        Template(
            "savings",
            ("{name} has ${a} in a piggy bank.",),
            ("{He} saves ${b} from {his} allowance.", "{He} earns ${b} walking dogs and saves all of it."),
            ("{He} takes out ${b} to buy a present.", "{He} spends ${b} of {his} savings on a concert ticket."),
            ("{His} grandparents add money so that {his} savings become {times} as large.",),
            ("{He} splits {his} savings equally among {k} children, {himself} included, and keeps {his} share.",),
            "How many dollars does {name} have in savings now?",
        ),
        Template(
            "sharing",
            ("{name} has {a} {things}.",),
            ("{He} wins {b} more {things} in a game.", "{His} cousin gives {him} {b} {things}."),
            ("{He} gives {b} {things} to a friend.", "{He} loses {b} {things} at the park."),
            ("{He} trades with friends and ends up with {times} as many {things} as before.",),
            ("{He} shares {his} {things} equally among {k} friends, {himself} included, and keeps {his} share.",),
            "How many {things} does {name} have now?",
            things=("marbles", "stickers", "trading cards", "seashells"),
        ),
        Template(
            "train",
            ("A train leaves the first station with {a} passengers.",),
            ("At the next stop, {b} people get on.", "{b} more passengers board at the next station."),
            ("At the next stop, {b} people get off.", "{b} passengers leave the train at the next station."),
            ("At a big city stop, so many people get on that there are {times} as many passengers as before.",),
            ("The train is split into {k} parts with equal numbers of passengers, and only the front part goes on.",),
            "How many passengers are on the train now?",
        ),
        Template(
            "garden",
            ("A garden has {a} tomato plants.",),
            ("The gardener plants {b} more tomato plants.",),
            ("A storm destroys {b} of the plants.", "Rabbits eat {b} of the plants."),
            ("The gardener grows cuttings until there are {times} as many plants as before.",),
            ("The gardener gives plants away and keeps only {fraction} of them.",),
            "How many tomato plants are in the garden now?",
        ),
        Template(
            "warehouse",
            ("A warehouse holds {a} boxes.",),
            ("A truck delivers {b} more boxes.",),
            ("{b} boxes are shipped to a store.", "A truck takes away {b} boxes."),
            ("Each box is unpacked into {k} smaller boxes.",),
            ("The boxes are stacked into {k} equal piles, and all piles but one are shipped out.",),
            "How many boxes are in the warehouse now?",
        ),
    ]
}
SEEN_TEMPLATES = ("shopping", "baking", "savings", "sharing")
HELD_OUT_TEMPLATES = ("train", "garden", "warehouse")


@dataclasses.dataclass
class ArithOptions(Config):
    """Options of the `arith` environment."""

    difficulty: int | list[int] | tuple[int, ...] | range = 2
    """Number of operations per problem, 1..5; a list/tuple/range mixes them uniformly."""
    min_value: int = 2
    """Smallest start value and smallest amount added or removed."""
    max_value: int = 60
    """Largest start value and largest amount added or removed."""
    templates: list[str] | tuple[str, ...] | None = None
    """Story templates to draw from (None: all). See SEEN_TEMPLATES / HELD_OUT_TEMPLATES."""
    max_turns: PositiveInt = 8
    """Policy turns per episode; the oracle needs difficulty + 1."""
    tool_success_reward: float = 0.0
    """Reward per successful tool call, added to that turn's reward."""

    def __post_init__(self) -> None:
        levels = [self.difficulty] if isinstance(self.difficulty, int) else list(self.difficulty)
        if not levels or any(
            isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_DIFFICULTY for d in levels
        ):
            raise ValueError(
                f"difficulty must be an int or a list of ints in 1..{MAX_DIFFICULTY} (operations "
                f"per problem), got {self.difficulty!r}"
            )
        self.difficulty = tuple(levels)
        if not 1 <= self.min_value <= self.max_value <= VALUE_CAP // 10:
            raise ValueError(
                f"need 1 <= min_value <= max_value <= {VALUE_CAP // 10}, got "
                f"min_value={self.min_value}, max_value={self.max_value}"
            )
        names = tuple(TEMPLATES) if self.templates is None else tuple(self.templates)
        unknown = sorted(set(names) - set(TEMPLATES))
        if unknown or not names:
            raise ValueError(f"unknown or no template(s) {unknown or names}; choose from {sorted(TEMPLATES)}")
        self.templates = names


@register_env("arith", ArithOptions)
class ArithEnv(ToolEnv):
    """Multi-step arithmetic word problems with a calculator tool."""

    name = "arith"

    def __init__(self, options: ArithOptions | None = None):
        self.options = options or ArithOptions()
        super().__init__(["calculator"], self.options.max_turns, self.options.tool_success_reward)

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; arith has 'train' and 'test'")
        if n is None:
            raise ValueError("arith generates problems without end; pass n, the number of tasks")
        return [generate_task(self.options, split, seed, index) for index in range(n)]

    def oracle_actions(self, task: Task) -> list[str]:
        return oracle_actions(task)


def generate_task(options: ArithOptions, split: str, seed: int, index: int) -> Task:
    """Task `index` of (split, seed): deterministic, and of the split's hash parity."""
    wanted_parity = 0 if split == "train" else 1
    for attempt in range(_MAX_ATTEMPTS):
        rng = random.Random(f"arith:{split}:{seed}:{index}:{attempt}")
        problem = _draw_problem(rng, options)
        if canonical_hash(problem) % 2 == wanted_parity:
            return _render(problem, rng, f"arith/{split}/{seed}/{index}")
    raise ValueError(
        f"could not draw a {split} problem in {_MAX_ATTEMPTS} tries; the option space is too "
        "small to split disjointly: widen min_value..max_value or add difficulties/templates"
    )


@dataclasses.dataclass(frozen=True)
class _Problem:
    template: str
    start: int
    operations: tuple[tuple[str, int], ...]
    """(op, operand) pairs, op in add/sub/mul/div."""


def canonical_hash(problem: _Problem) -> int:
    """A stable hash of the math of a problem (template, numbers, operations), not its wording."""
    key = f"{problem.template}|{problem.start}|{problem.operations}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def _draw_problem(rng: random.Random, options: ArithOptions) -> _Problem:
    difficulty = rng.choice(options.difficulty)
    template = rng.choice(options.templates)
    start = rng.randint(options.min_value, options.max_value)
    value, operations = start, []
    for _ in range(difficulty):
        op, operand = _draw_operation(rng, value, options)
        operations.append((op, operand))
        value = _apply(value, op, operand)
    return _Problem(template, start, tuple(operations))


def _draw_operation(rng: random.Random, value: int, options: ArithOptions) -> tuple[str, int]:
    choices: dict[str, list[int]] = {}
    if value + options.max_value <= VALUE_CAP:
        choices["add"] = list(range(options.min_value, options.max_value + 1))
    if value - options.min_value >= 1:
        choices["sub"] = list(range(options.min_value, min(options.max_value, value - 1) + 1))
    factors = [k for k in MULTIPLIERS if value * k <= VALUE_CAP]
    if factors:
        choices["mul"] = factors
    divisors = [k for k in DIVISORS if value % k == 0 and value // k >= 2]
    if divisors:
        choices["div"] = divisors
    op = rng.choice(sorted(choices))
    return op, rng.choice(choices[op])


def _apply(value: int, op: str, operand: int) -> int:
    if op == "add":
        return value + operand
    if op == "sub":
        return value - operand
    if op == "mul":
        return value * operand
    assert value % operand == 0, f"inexact division {value}/{operand} drawn"
    return value // operand


def _render(problem: _Problem, rng: random.Random, task_id: str) -> Task:
    template = TEMPLATES[problem.template]
    name, he, him, his, himself = rng.choice(_NAMES)
    words = {
        "name": name,
        "he": he,
        "He": he.capitalize(),
        "him": him,
        "his": his,
        "His": his.capitalize(),
        "himself": himself,
        "things": rng.choice(template.things),
        "a": problem.start,
    }
    sentences = [rng.choice(template.intro).format(**words)]
    value, steps = problem.start, []
    for op, operand in problem.operations:
        phrase = rng.choice(getattr(template, op))
        sentence = phrase.format(
            **words,
            b=operand,
            k=operand,
            times=_TIMES.get(operand, ""),
            fraction=_FRACTION.get(operand, ""),
            item=rng.choice(template.items),
        )
        sentences.append(sentence[0].upper() + sentence[1:])
        result = _apply(value, op, operand)
        steps.append((f"{value} {_SYMBOL[op]} {operand}", str(result)))
        value = result
    sentences.append(template.question.format(**words))
    meta: dict[str, Any] = {
        "difficulty": len(problem.operations),
        "template": problem.template,
        "steps": steps,
        "operations": [op for op, _ in problem.operations],
        "canonical_hash": canonical_hash(problem),
    }
    return Task(task_id, " ".join(sentences), str(value), meta)


def oracle_actions(task: Task) -> list[str]:
    """One calculator call per step, then a closing `Step` line and `Final Answer: N`."""
    turns = []
    for number, (expression, _value) in enumerate(task.meta["steps"], start=1):
        _left, symbol, right = expression.split(" ")
        verb = _VERB[_OP_OF_SYMBOL[symbol]]
        turns.append(
            f"Step {number}: {verb} {right}: {expression}.\n"
            + format_tool_call("calculator", {"expression": expression})
        )
    final_step = len(task.meta["steps"]) + 1
    turns.append(
        f"Step {final_step}: The last result, {task.answer}, answers the question.\nFinal Answer: {task.answer}"
    )
    return turns

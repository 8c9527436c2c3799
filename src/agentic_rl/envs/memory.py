"""`memory`: facts arrive one per turn among distractors; the agent sees only its last few turns,
so it must store what the final question needs with memory tools.

    env = make_env("memory", facts=2, distractors=8, window=2, gap=4)
    task = env.tasks("train", n=1)[0]
    task.meta["stream"]   # ["The home city of Ada is Oslo.", "The locker code of Bo is 4172.", ...]

An episode (n = facts + updates + distractors messages, then the question):

    system: the rules                    user: the task, and who the question will be about
    A: Next.                             O: Message 1 of n: The locker code of Ada is 4172.
    A: <tool_call>remember("ada locker code", "4172")</tool_call>
                                         O: Stored 'ada locker code'.  Message 2 of n: ...
    ...                                  O: Question: What is the locker code of Ada? ...
    A: <tool_call>recall("ada locker code")</tool_call>      O: 4172     (one call per turn)
    A: Final Answer: 4172

Every turn reads the next message, whatever else it does (its tool results come first, then the
message as a user turn); a turn without a tool call just reads on. Tools, per episode:

    remember(key, value)  store a value (a key already stored is overwritten; at most
                          `memory_slots` keys; each write costs a right answer `write_cost`)
    recall(key)           read a stored value back
    forget(key)           free a key

Keys are matched case- and space-insensitively ("Ada  Locker code" is "ada locker code").

The bounded context: only the last `window` turns (each policy turn with its observation) stay
in what the policy sees, plus the system prompt and the task description, which never leave, and
the question, which stays pinned after the task description once its turn has left the window.
`window` >= the turns of the whole episode gives an ordinary prefix episode (one sequence).
When a turn drops out, `step` returns the visible conversation as `StepResult.context`, so the
rollout engine starts a new token sequence (the episode's history is no longer a prefix). Memory
tool results are observations like any other: they scroll out too; the memory itself does not.

Difficulty knobs: `facts` the question asks for, `distractors` (facts about other people, and
about the same people's other attributes), `updates` (a needed fact is later corrected: the
question wants the newest value), `window`, `gap` (messages between the last needed message and
the question, at least; gap >= window means nothing needed is still visible), `memory_slots`, and
`announce` (the task description names what the question will ask; without it the agent must
guess what to keep). `oracle_stores: all` makes the oracle store every fact, not only the asked
ones (a teacher with no selection to learn).

Reward: 1 when every asked value is right (compared case-insensitively, in the order asked),
minus `write_cost` per successful remember of the episode (never below 0), paid at the answer; a
wrong or missing answer earns 0, however much was stored. The cost is charged only on a right
answer because, charged per write, storing less was the cheapest way to fail: from an SFT model
that failed most episodes, GRPO learned to store nothing, then to answer nothing (EXPERIMENTS.md,
session 13). So the cost ranks right answers (fewer writes, more reward) and nothing else.

Hostile turns never crash: an unknown tool, a bad or oversized key or value, a full memory, an
unknown key, or more than `max_calls_per_turn` calls each get an error observation. Train and test
tasks never coincide: a task's hash (its stream and question) decides its split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from typing import Any, Literal

from agentic_rl.config import Config, NonNegativeFloat
from agentic_rl.envs.base import Env, StepResult, Task, register_env
from agentic_rl.tools.base import Tool, ToolError
from agentic_rl.tools.dispatch import run_tool_call
from agentic_rl.tools.parse import format_tool_call, parse_tool_calls

PEOPLE = [
    "Ada",
    "Bo",
    "Cleo",
    "Dev",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivo",
    "Jun",
    "Kai",
    "Lena",
    "Milo",
    "Nia",
    "Otto",
    "Pia",
]
ATTRIBUTES = {
    "locker code": lambda rng: str(rng.randrange(1000, 10000)),
    "room number": lambda rng: str(rng.randrange(100, 1000)),
    "home city": lambda rng: rng.choice(
        ["Oslo", "Lima", "Pune", "Riga", "Kyoto", "Quito", "Dakar", "Perth", "Turin", "Hanoi"]
    ),
    "favourite colour": lambda rng: rng.choice(
        ["amber", "teal", "crimson", "olive", "violet", "ivory", "navy", "coral"]
    ),
    "pet's name": lambda rng: rng.choice(["Biscuit", "Pepper", "Mochi", "Ziggy", "Nutmeg", "Rufus", "Tofu", "Juniper"]),
}
MAX_KEY_CHARS = 40
MAX_VALUE_CHARS = 100
NEXT = "Next."
SYSTEM_PROMPT = (
    "You read a stream of messages, one per turn, and then answer a question about them. You only see your "
    "last few turns, so store what you will need. Tools: remember(key, value) stores a value under a key "
    "(overwriting it), recall(key) reads it back, forget(key) frees it. Every turn reads the next message; "
    "reply Next. when there is nothing to do. Answer with a line `Final Answer: <value>`, or several values "
    "separated by commas, in the order asked."
)
_FINAL = re.compile(r"final\s+answer\s*[:：]", re.IGNORECASE)


@dataclasses.dataclass
class MemoryOptions(Config):
    facts: int = 1
    """Facts the question asks for, 1..4."""
    distractors: int = 6
    """Distractor messages: facts the question does not ask for, 0..40."""
    updates: int = 0
    """Needed facts corrected by a later message (the question wants the newest value), 0..facts."""
    window: int = 2
    """Visible turns: a policy turn and its observation leave what the policy sees `window` turns later,
    facts..16 (the answer needs every recalled value in view, and a turn makes one call: the engine
    stops a turn at its first `</tool_call>`)."""
    gap: int = 3
    """At least this many messages (distractors) between the last needed message and the question, 0..distractors."""
    memory_slots: int = 8
    """Keys the memory holds at once (remember on a new key beyond this is an error), >= facts."""
    write_cost: NonNegativeFloat = 0.0
    """Reward subtracted from a right answer's 1 per successful remember of its episode (never
    below 0; a failed episode earns 0 whatever it stored): fewer writes pay among right answers, >= 0."""
    announce: bool = True
    """The task description names the facts the question will ask for (False: the agent must guess)."""
    max_turns: int | None = None
    """Policy turns per episode; None: the oracle's turns (messages + facts + 2) + 4."""
    max_calls_per_turn: int = 4
    """Calls beyond this many in one turn are not run (each gets an error observation)."""
    oracle_stores: Literal["asked", "all"] = "asked"
    """Which facts the oracle stores. asked: exactly what the question needs (the optimum);
    all: every fact of the stream, a teacher that needs no selection (memory_slots >= facts +
    distractors), for SFT that GRPO's write_cost then teaches to select. Agents are unaffected."""

    def __post_init__(self) -> None:
        if not 1 <= self.facts <= 4:
            raise ValueError(f"facts must be in 1..4, got {self.facts}")
        if not 0 <= self.distractors <= 40:
            raise ValueError(f"distractors must be in 0..40, got {self.distractors}")
        if not 0 <= self.updates <= self.facts:
            raise ValueError(f"updates must be in 0..facts ({self.facts}), got {self.updates}")
        if not self.facts <= self.window <= 16:
            raise ValueError(
                f"window must be in facts..16 = {self.facts}..16 turns, got {self.window}: the {self.facts} "
                "recall turns before the answer must all stay in view"
            )
        if not 0 <= self.gap <= self.distractors:
            raise ValueError(
                f"gap={self.gap} must be in 0..distractors ({self.distractors}): the messages between the "
                "last needed fact and the question are distractors; raise distractors or lower gap"
            )
        if self.memory_slots < self.facts or self.max_calls_per_turn < 1:
            raise ValueError(
                f"memory_slots ({self.memory_slots}) must be >= facts ({self.facts}) (the answer needs every "
                f"fact stored at once) and max_calls_per_turn ({self.max_calls_per_turn}) >= 1"
            )
        if self.oracle_stores not in ("asked", "all"):
            raise ValueError(f"oracle_stores must be asked or all, got {self.oracle_stores!r}")
        if self.oracle_stores == "all" and self.memory_slots < self.facts + self.distractors:
            raise ValueError(
                f"oracle_stores=all keeps every one of the {self.facts + self.distractors} facts, but memory_slots "
                f"is {self.memory_slots}; raise memory_slots or store only the asked facts"
            )
        if self.max_turns is not None and self.max_turns < self.oracle_turns:
            raise ValueError(
                f"max_turns={self.max_turns} is below the {self.oracle_turns} turns the messages, the recalls "
                "and the answer need; raise it or leave it None"
            )

    @property
    def messages(self) -> int:
        """Messages in the stream before the question."""
        return self.facts + self.updates + self.distractors

    @property
    def oracle_turns(self) -> int:
        """Turns the oracle takes: one per message and one for the question, a recall per fact, the answer."""
        return self.messages + 1 + self.facts + 1


def normalise_key(key: str) -> str:
    return " ".join(key.lower().split())


def _fact(person: str, attribute: str, value: str) -> str:
    return f"The {attribute} of {person} is {value}."


def _phrase(pairs: list[tuple[str, str]]) -> str:
    parts = [f"the {attribute} of {person}" for person, attribute in pairs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def build_task(options: MemoryOptions, rng: random.Random) -> dict[str, Any]:
    """One task as plain data: the message stream, the question, the answers and the oracle's keys."""
    # enough people that every distractor is about its own (person, attribute): 5 attributes each
    people = rng.sample(PEOPLE, min(len(PEOPLE), options.facts + 2 + (options.distractors + 4) // len(ATTRIBUTES)))
    pairs = [(person, attribute) for person in people for attribute in ATTRIBUTES]
    rng.shuffle(pairs)
    asked = pairs[: options.facts]
    # Distractors share a person or an attribute with an asked fact where possible (harder to tell apart).
    near = [p for p in pairs[options.facts :] if any(p[0] == a[0] or p[1] == a[1] for a in asked)]
    far = [p for p in pairs[options.facts :] if p not in near]
    others = (near + far)[: options.distractors]
    assert len(others) == options.distractors, f"{len(others)} distractor facts for {options.distractors}"
    values = {pair: ATTRIBUTES[pair[1]](rng) for pair in asked}
    needed = [_fact(person, attribute, values[(person, attribute)]) for person, attribute in asked]
    for person, attribute in asked[: options.updates]:
        new = ATTRIBUTES[attribute](rng)
        while new == values[(person, attribute)]:
            new = ATTRIBUTES[attribute](rng)
        values[(person, attribute)] = new
        needed.append(f"Update: the {attribute} of {person} is now {new}.")
    distractors = [_fact(person, attribute, ATTRIBUTES[attribute](rng)) for person, attribute in others]
    tail, head = distractors[: options.gap], distractors[options.gap :]
    body = head + needed[: options.facts]
    rng.shuffle(body)
    for update in needed[options.facts :]:  # an update comes after the fact it corrects
        person_attr = next(p for p in asked if f"the {p[1]} of {p[0]} is now" in update)
        after = next(i for i, m in enumerate(body) if m == _fact(*person_attr, _original(needed, person_attr)))
        body.insert(rng.randint(after + 1, len(body)), update)
    stream = body + tail
    question = f"Question: What is {_phrase(asked)}? Answer with a line `Final Answer: <value>`" + (
        " giving the values separated by commas, in that order." if len(asked) > 1 else "."
    )
    return {
        "stream": stream,
        "question": question,
        "asked": [list(p) for p in asked],
        "answers": [values[p] for p in asked],
        "keys": [normalise_key(f"{p[0]} {p[1]}") for p in asked],
        "needed_at": {str(i): m for i, m in enumerate(stream) if m in needed},
    }


def _original(needed: list[str], pair: tuple[str, str]) -> str:
    prefix = f"The {pair[1]} of {pair[0]} is "
    return next(m for m in needed if m.startswith(prefix))[len(prefix) : -1]


def task_split(data: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps([data["stream"], data["question"]]).encode()).digest()
    return "train" if digest[0] % 2 == 0 else "test"


def extract_values(text: str) -> list[str] | None:
    """The comma-separated values on the line after the last `Final Answer:`, normalised; None if absent."""
    matches = list(_FINAL.finditer(text))
    if not matches:
        return None
    line = text[matches[-1].end() :].strip().split("\n")[0]
    values = [" ".join(part.strip().strip(".`*'\"").lower().split()) for part in line.split(",")]
    return values if any(values) else None


@register_env("memory", MemoryOptions)
class MemoryEnv(Env):
    """Facts in a stream, a bounded context and memory tools (module docstring)."""

    name = "memory"

    def __init__(self, options: MemoryOptions | None = None):
        self.options = options or MemoryOptions()
        self.max_turns = self.options.max_turns or self.options.oracle_turns + 4
        self.tools = [
            Tool.from_function(self.remember),
            Tool.from_function(self.recall),
            Tool.from_function(self.forget),
        ]
        self._by_name = {tool.name: tool for tool in self.tools}
        self._data: dict[str, Any] | None = None

    # --- tasks ------------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; memory has 'train' and 'test'")
        if n is None:
            raise ValueError("memory generates tasks without end; pass n, the number of tasks")
        o = self.options
        rng = random.Random(f"memory/{o.facts}/{o.distractors}/{o.updates}/{o.gap}/{seed}")
        tasks = []
        for _ in range(1000 * (n + 1)):
            if len(tasks) == n:
                break
            data = build_task(o, rng)
            if task_split(data) == split:
                tasks.append(
                    Task(
                        id=f"memory/{split}/{seed}/{len(tasks)}",
                        question=data["question"],
                        answer=", ".join(data["answers"]),
                        meta=data,
                    )
                )
        if len(tasks) < n:
            raise RuntimeError(f"could not draw {n} {split} tasks from options {o}")
        return tasks

    def oracle_actions(self, task: Task) -> list[str]:
        """Read on; store each needed message (oracle_stores=all: every message) the turn after it
        arrives (an update overwrites its key); after the question, recall each asked key (one call
        per turn); then answer."""
        data = task.meta
        stored = {}
        if self.options.oracle_stores == "all":
            candidates = dict(enumerate(data["stream"]))
            pairs = [(person, attribute) for person in PEOPLE for attribute in ATTRIBUTES]
        else:
            candidates = {int(index): message for index, message in data["needed_at"].items()}
            pairs = [tuple(pair) for pair in data["asked"]]
        for index, message in candidates.items():
            for person, attribute in pairs:
                for prefix in (f"The {attribute} of {person} is ", f"Update: the {attribute} of {person} is now "):
                    if message.startswith(prefix):
                        stored[index] = (normalise_key(f"{person} {attribute}"), message[len(prefix) : -1])
        actions = [NEXT]  # turn 1 reads message 1
        for index in range(len(data["stream"])):  # turn index + 2 reads message index + 2 (or the question)
            key_value = stored.get(index)
            actions.append(
                format_tool_call("remember", {"key": key_value[0], "value": key_value[1]}) if key_value else NEXT
            )
        actions += [format_tool_call("recall", {"key": key}) for key in data["keys"]]
        actions.append("Final Answer: " + ", ".join(data["answers"]))
        return actions

    # --- episode ----------------------------------------------------------------------------

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self._task, self._data = task, task.meta
        self._memory: dict[str, str] = {}
        self._read = 0  # messages delivered (the question counts as message n + 1)
        self._turns = self._calls = self._errors = self._writes = 0
        self._done = False
        self._exchanges: list[list[dict[str, Any]]] = []
        self._question_turn: int | None = None  # the exchange that delivered the question
        self._head = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self._intro()}]
        self._visible = [dict(m) for m in self._head]
        return [dict(m) for m in self._head]

    def _intro(self) -> str:
        o, data = self.options, self._data
        about = f" The question will ask for {_phrase([tuple(p) for p in data['asked']])}." if o.announce else ""
        return (
            f"You will read {len(data['stream'])} messages, one per turn, then a question.{about} Only your last "
            f"{o.window} turn(s) stay visible. Memory holds {o.memory_slots} keys. Reply Next. to read the first message."
        )

    def step(self, action_text: str) -> StepResult:
        if self._data is None or self._done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self._turns += 1
        calls = parse_tool_calls(action_text)
        if not calls and (_FINAL.search(action_text) or self._question_turn is not None):
            return self._finish(extract_values(action_text))
        observation = []
        for index, call in enumerate(calls):
            if index >= self.options.max_calls_per_turn:
                observation.append(
                    {
                        "role": "tool",
                        "name": "error",
                        "content": f"Error: at most {self.options.max_calls_per_turn} calls per turn; this one was not run",
                    }
                )
                self._errors += 1
                continue
            name, content, ok = run_tool_call(call, self._by_name)
            self._calls += 1
            self._errors += not ok
            if ok and name == "remember":
                self._writes += 1
            observation.append({"role": "tool", "name": name, "content": content})
        if self._read < len(self._data["stream"]):
            observation.append(
                {
                    "role": "user",
                    "content": f"Message {self._read + 1} of {len(self._data['stream'])}: "
                    f"{self._data['stream'][self._read]}",
                }
            )
            self._read += 1
        elif self._question_turn is None:
            observation.append({"role": "user", "content": self._data["question"]})
            self._question_turn = self._turns
        if self._turns >= self.max_turns:
            return self._finish(None, "max_turns")
        info = {"tool_calls": self._calls, "tool_errors": self._errors, "memory_writes": self._writes}
        return StepResult(observation, 0.0, False, info, context=self._advance_window(action_text, observation))

    def _advance_window(self, action_text: str, observation: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Record this turn; return the visible conversation if it is not the old one plus this turn."""
        exchange = [{"role": "assistant", "content": action_text}, *observation]
        self._exchanges.append(exchange)
        first_visible = max(0, len(self._exchanges) - self.options.window)
        pinned = []
        if self._question_turn is not None and self._question_turn - 1 < first_visible:
            pinned = [{"role": "user", "content": self._data["question"]}]  # type: ignore[index]
        visible = self._head + pinned + [m for turn in self._exchanges[first_visible:] for m in turn]
        grown = self._visible + exchange
        self._visible = visible
        return None if visible == grown else [dict(m) for m in visible]

    def _finish(self, values: list[str] | None, finish: str | None = None) -> StepResult:
        self._done = True
        expected = [" ".join(v.lower().split()) for v in self._data["answers"]]  # type: ignore[index]
        right = sum(a == b for a, b in zip(values or [], expected))
        correct = values is not None and values == expected
        info = {
            "correct": correct,
            "final_answer": ", ".join(values) if values is not None else None,
            "reference": self._task.answer,
            "format_ok": values is not None,
            "tool_calls": self._calls,
            "tool_errors": self._errors,
            "turns": self._turns,
            "memory_writes": self._writes,
            "facts_correct": right / len(expected),
            "finish": finish or ("answer" if values is not None else "no_answer"),
        }
        paid = max(0.0, 1.0 - self.options.write_cost * self._writes) if correct else 0.0  # module docstring
        return StepResult(None, paid, True, info)

    # --- the tools (bound to this episode) ----------------------------------------------------

    def remember(self, key: str, value: str) -> str:
        """Store a value under a key in your memory (overwrites the key if it is already stored).

        Args:
            key: A short name for the fact, e.g. "ada locker code".
            value: The value to keep, e.g. "4172".
        """
        key = self._check_key(key)
        if not value.strip() or len(value) > MAX_VALUE_CHARS:
            raise ToolError(
                f"value must be 1..{MAX_VALUE_CHARS} characters, got {len(value)}; store just the fact's value"
            )
        if key not in self._memory and len(self._memory) >= self.options.memory_slots:
            raise ToolError(
                f"memory is full ({self.options.memory_slots} keys: {', '.join(sorted(self._memory))}); "
                "forget(key) one first"
            )
        old = self._memory.get(key)
        self._memory[key] = value.strip()
        return f"Stored {key!r}." + (f" (It held {old!r}.)" if old is not None else "")

    def recall(self, key: str) -> str:
        """Read back the value stored under a key.

        Args:
            key: The key it was stored under.
        """
        key = self._check_key(key)
        if key not in self._memory:
            raise ToolError(
                f"nothing is stored under {key!r}; stored keys: {', '.join(sorted(self._memory)) or 'none'}"
            )
        return self._memory[key]

    def forget(self, key: str) -> str:
        """Delete a key from your memory, freeing its slot.

        Args:
            key: The key to delete.
        """
        key = self._check_key(key)
        if self._memory.pop(key, None) is None:
            raise ToolError(
                f"nothing is stored under {key!r}; stored keys: {', '.join(sorted(self._memory)) or 'none'}"
            )
        return f"Forgot {key!r}."

    def _check_key(self, key: str) -> str:
        normal = normalise_key(key)
        if not normal or len(normal) > MAX_KEY_CHARS:
            raise ToolError(
                f"a key must be 1..{MAX_KEY_CHARS} characters, got {len(normal)}; use a short name like 'ada locker code'"
            )
        return normal

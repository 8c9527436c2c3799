"""`plan`: reach a goal room in a small house of locked doors, where the obvious way is a trap.

The prompt shows the whole map: rooms, the passages between them, which passages have a locked
door of some colour, and where each key lies. The agent acts with two tools, one action per call:

    move(room)   go through a passage from the current room (a locked door needs its key held)
    take(key)    pick up the key of that colour lying in the current room

Every action costs `step_cost`; reaching the goal pays 1 and ends the episode. Rewards come per
step, so the discounted return Σ γ^t r_t prefers short plans. A turn without a call ends the
episode and is charged the worst failure's cost of every turn left (`max_calls_per_turn` actions
each): otherwise giving up (0) would pay more than trying and failing (−step_cost per action), and
GRPO learns to give up. It did: from a 53% SFT policy, 12 steps reached 0%, every episode one
turn of text without a call (EXPERIMENTS.md, session 23). `progress_reward` adds a per-action
reward for each action that brings the goal closer (potential-based shaping: it sums to the same
for every success of a task, and ranks failures by how close they ended).

Tasks are built so that the shortest way to the goal passes a locked door whose key lies
elsewhere: walking straight at the goal (the greedy move) reaches the door empty-handed and costs
a detour back, while the optimal plan fetches the key first. The oracle is a breadth-first
search over (room, keys held), so it is optimal; `difficulty` is the number of locked doors on
the way (the horizon grows with it), `branching` adds passages beyond a spanning tree (more wrong
ways).

    system: tool instructions        user: the map and the goal
    A: <tool_call>{"name": "move", "arguments": {"room": "cellar"}}</tool_call>
    O: You are in the cellar. Passages: atrium, dock (red door). Here: the red key.

Hostile or malformed turns never crash an episode: an unknown tool, a bad room or key name, a
locked door, or a turn without a call each get an observation that says what went wrong (the
last ends the episode, as in the other tool environments); calls beyond `max_calls_per_turn`
in one turn are not run. Train and test worlds never coincide: a world's hash decides its split.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
from typing import Any

from agentic_rl.config import Config, NonNegativeFloat, PositiveInt
from agentic_rl.envs.base import Env, StepResult, Task, register_env
from agentic_rl.tools.base import Tool, ToolError
from agentic_rl.tools.dispatch import run_tool_call
from agentic_rl.tools.parse import format_tool_call, parse_tool_calls

ROOMS = [
    "atrium",
    "bakery",
    "cellar",
    "dock",
    "forge",
    "garden",
    "hangar",
    "library",
    "mill",
    "nursery",
    "office",
    "pantry",
    "quarry",
    "studio",
    "tower",
    "vault",
]
COLOURS = ["red", "blue", "green", "yellow"]
SYSTEM_PROMPT = (
    "You move through a house to reach a goal room. Act with one tool call per action: move(room) goes "
    "through a passage from the room you are in; take(key) picks up a key lying in your room. A locked "
    "door opens only while you hold its key. Plan before you move: every action costs a little."
)


@dataclasses.dataclass
class PlanOptions(Config):
    difficulty: int = 1
    """Locked doors on the shortest way to the goal, 1..4 (each needs a detour for its key)."""
    branching: int = 1
    """Passages added beyond a spanning tree of the rooms (more alternatives, more wrong turns), 0..6."""
    step_cost: NonNegativeFloat = 0.05
    """Reward per action (subtracted), so shorter plans earn more."""
    max_turns: PositiveInt = 24
    """Policy turns per episode (the oracle needs one turn per action)."""
    max_calls_per_turn: PositiveInt = 4
    """Calls beyond this many in one turn are not run (each gets an error observation, at no cost).
    A turn without a call costs this many of the worst actions (step_cost + progress_reward) for
    each turn left."""
    progress_reward: NonNegativeFloat = 0.0
    """Reward per action for each action it brings the goal closer, by the optimal plan's length from
    the new state (room, keys held); charged the same when it takes the goal farther, 0 for a refused
    action. Potential-based shaping (Ng, Harada and Russell, 1999) with potential −progress_reward ×
    (actions left): it sums to progress_reward × (actions left at the start − at the end), so every
    success of a task earns the same, and failures rank by how close they ended (exactly so for an
    undiscounted return; a reward term's γ < 1 weighs early progress a little more). 0 turns it off."""

    def __post_init__(self) -> None:
        if not 1 <= self.difficulty <= len(COLOURS):
            raise ValueError(f"difficulty must be in 1..{len(COLOURS)} (locked doors), got {self.difficulty}")
        if not 0 <= self.branching <= 6:
            raise ValueError(f"branching must be in 0..6, got {self.branching}")


@dataclasses.dataclass(frozen=True)
class World:
    rooms: tuple[str, ...]
    passages: tuple[tuple[str, str], ...]
    """Undirected, each sorted."""
    doors: tuple[tuple[tuple[str, str], str], ...]
    """(passage, colour) for every locked passage."""
    keys: tuple[tuple[str, str], ...]
    """(colour, room the key lies in)."""
    start: str
    goal: str

    def neighbours(self, room: str) -> list[str]:
        return sorted({b if a == room else a for a, b in self.passages if room in (a, b)})

    def door(self, a: str, b: str) -> str | None:
        return dict(self.doors).get(tuple(sorted((a, b))))  # type: ignore[arg-type]

    def describe(self) -> str:
        lines = ["Passages (a door's colour in brackets):"]
        for a, b in self.passages:
            colour = self.door(a, b)
            lines.append(f"- {a} - {b}" + (f" [{colour} door]" if colour else ""))
        lines += [f"The {colour} key lies in the {room}." for colour, room in self.keys]
        lines.append(f"You are in the {self.start}. Reach the {self.goal}.")
        return "\n".join(lines)


def shortest_plan(
    world: World, through_doors: bool = False, from_room: str | None = None, holding: frozenset[str] = frozenset()
) -> list[tuple[str, str]] | None:
    """The shortest action list [("move"|"take", argument)] to the goal, by BFS over (room, keys
    held), from the world's start or from `from_room` holding `holding`; with through_doors=True,
    locks are ignored (the greedy way). None: unreachable."""
    key_at = {room: colour for colour, room in world.keys}
    start = (from_room or world.start, frozenset(holding))
    parents: dict[Any, Any] = {start: None}
    queue = collections.deque([start])
    while queue:
        state = queue.popleft()
        room, held = state
        if room == world.goal:
            plan = []
            while parents[state] is not None:
                state, action = parents[state]
                plan.append(action)
            return plan[::-1]
        moves = (
            [(("take", key_at[room]), (room, held | {key_at[room]}))]
            if room in key_at and key_at[room] not in held
            else []
        )
        for nxt in world.neighbours(room):
            colour = world.door(room, nxt)
            if through_doors or colour is None or colour in held:
                moves.append((("move", nxt), (nxt, held)))
        for action, nxt_state in moves:
            if nxt_state not in parents:
                parents[nxt_state] = (state, action)
                queue.append(nxt_state)
    return None


def build_world(options: PlanOptions, rng: random.Random) -> World | None:
    """One candidate world (None when this draw cannot hold the requested traps)."""
    n_rooms = 5 + 2 * options.difficulty
    rooms = rng.sample(ROOMS, n_rooms)
    passages = set()
    for index in range(1, n_rooms):  # a random spanning tree
        passages.add(tuple(sorted((rooms[index], rooms[rng.randrange(index)]))))
    candidates = [
        tuple(sorted((a, b)))
        for i, a in enumerate(rooms)
        for b in rooms[i + 1 :]
        if tuple(sorted((a, b))) not in passages
    ]
    passages |= set(rng.sample(candidates, min(options.branching, len(candidates))))
    start, goal = rooms[0], rooms[-1]
    world = World(tuple(rooms), tuple(sorted(passages)), (), (), start, goal)
    path = shortest_plan(world, through_doors=True)
    if path is None or len(path) < options.difficulty + 1:
        return None
    route = [start] + [room for _, room in path]
    locked = (
        sorted(rng.sample(range(1, len(route) - 1), options.difficulty)) if len(route) > options.difficulty + 1 else []
    )
    if len(locked) != options.difficulty:
        return None
    colours = rng.sample(COLOURS, options.difficulty)
    doors = tuple((tuple(sorted((route[i], route[i + 1]))), colour) for i, colour in zip(locked, colours))
    off_route = [room for room in rooms if room not in route]
    keys = []
    for colour in colours:  # each key off the direct route (a detour), or behind an earlier door
        keys.append((colour, rng.choice(off_route or route[1:-1])))
    world = World(tuple(rooms), tuple(sorted(passages)), doors, tuple(keys), start, goal)
    plan = shortest_plan(world)
    if plan is None or len(plan) <= len(path):  # unsolvable, or the direct way is not a trap
        return None
    return world


def world_split(world: World) -> str:
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(world), sort_keys=True).encode()).digest()
    return "train" if digest[0] % 2 == 0 else "test"


@register_env("plan", PlanOptions)
class PlanEnv(Env):
    """Keys, doors and a goal: planning with delayed consequences (module docstring)."""

    name = "plan"
    final_answers = False  # success is reaching the goal room

    def __init__(self, options: PlanOptions | None = None):
        self.options = options or PlanOptions()
        self.max_turns = self.options.max_turns
        self.tools = [Tool.from_function(self.move), Tool.from_function(self.take)]
        self._by_name = {tool.name: tool for tool in self.tools}
        self._world: World | None = None

    # --- tasks ------------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; plan has 'train' and 'test'")
        if n is None:
            raise ValueError("plan generates worlds without end; pass n, the number of tasks")
        tasks, draw = [], 0
        rng = random.Random(f"plan/{self.options.difficulty}/{self.options.branching}/{seed}")
        while len(tasks) < n:
            world = build_world(self.options, rng)
            draw += 1
            if draw > 1000 * (n + 1):
                raise RuntimeError(f"could not build {n} {split} worlds at difficulty {self.options.difficulty}")
            if world is None or world_split(world) != split:
                continue
            plan = shortest_plan(world)
            tasks.append(
                Task(
                    id=f"plan/{split}/{seed}/{len(tasks)}",
                    question=world.describe(),
                    answer=world.goal,
                    meta={"world": dataclasses.asdict(world), "optimal_actions": len(plan)},
                )
            )
        return tasks

    def oracle_actions(self, task: Task) -> list[str]:
        plan = shortest_plan(_world_of(task))
        return [
            format_tool_call(action, {"room" if action == "move" else "key": argument}) for action, argument in plan
        ]

    # --- episode ----------------------------------------------------------------------------

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self._task, self._world = task, _world_of(task)
        self._room, self._held = self._world.start, set()
        self._turns = self._actions = self._errors = 0
        self._left = task.meta["optimal_actions"]  # actions left on the optimal plan from here
        self._done = False
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]

    def step(self, action_text: str) -> StepResult:
        if self._world is None or self._done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self._turns += 1
        calls = parse_tool_calls(action_text)
        if not calls:  # giving up: charged as the worst failure over the turns left (module docstring)
            turns_left = self.max_turns - self._turns + 1
            worst_action = self.options.step_cost + self.options.progress_reward  # one action away from the goal
            return self._finish(-worst_action * self.options.max_calls_per_turn * turns_left, "no_action")
        observation, reward = [], 0.0
        for index, call in enumerate(calls):
            if index >= self.options.max_calls_per_turn:
                observation.append(
                    {
                        "role": "tool",
                        "name": "error",
                        "content": f"Error: at most {self.options.max_calls_per_turn} actions per turn; this one was not run",
                    }
                )
                self._errors += 1
                continue
            name, content, ok = run_tool_call(call, self._by_name)
            self._actions += 1
            self._errors += not ok
            reward -= self.options.step_cost
            if ok:
                left, self._left = (
                    self._left,
                    len(shortest_plan(self._world, from_room=self._room, holding=frozenset(self._held))),
                )
                reward += self.options.progress_reward * (left - self._left)
            observation.append({"role": "tool", "name": name, "content": content})
            if self._room == self._world.goal:
                return self._finish(reward + 1.0, "goal")
        if self._turns >= self.max_turns:
            return self._finish(reward, "max_turns")
        return StepResult(observation, reward, False, {"tool_calls": self._actions, "tool_errors": self._errors})

    def _finish(self, reward: float, finish: str) -> StepResult:
        self._done = True
        reached = self._room == self._world.goal  # type: ignore[union-attr]
        info = {
            "correct": reached,
            "final_answer": None,
            "reference": self._world.goal,  # type: ignore[union-attr]
            "format_ok": finish != "no_action",
            "tool_calls": self._actions,
            "tool_errors": self._errors,
            "turns": self._turns,
            "finish": finish,
            "optimal_actions": self._task.meta["optimal_actions"],
            "actions_left": self._left,
        }
        return StepResult(None, reward, True, info)

    # --- the tools (bound to this episode) ----------------------------------------------------

    def move(self, room: str) -> str:
        """Go through a passage from the room you are in to a neighbouring room.

        Args:
            room: The neighbouring room to go to.
        """
        world = self._world
        if room not in world.rooms:
            raise ToolError(f"there is no room {room!r}; rooms: {', '.join(sorted(world.rooms))}")
        if room not in world.neighbours(self._room):
            raise ToolError(
                f"no passage from the {self._room} to the {room}; passages: {', '.join(world.neighbours(self._room))}"
            )
        colour = world.door(self._room, room)
        if colour is not None and colour not in self._held:
            raise ToolError(f"the door to the {room} is locked; it needs the {colour} key")
        self._room = room
        return self._look()

    def take(self, key: str) -> str:
        """Pick up the key of this colour lying in the room you are in.

        Args:
            key: The key's colour, e.g. red.
        """
        colour = key.removesuffix(" key").strip()
        where = dict(self._world.keys).get(colour)
        if where is None:
            raise ToolError(f"there is no {colour!r} key; keys: {', '.join(c for c, _ in self._world.keys)}")
        if colour in self._held:
            raise ToolError(f"you already hold the {colour} key")
        if where != self._room:
            raise ToolError(f"the {colour} key is not here; it lies in the {where}")
        self._held.add(colour)
        return f"You take the {colour} key. " + self._look()

    def _look(self) -> str:
        world = self._world
        exits = [
            f"{room} ({world.door(self._room, room)} door)" if world.door(self._room, room) else room
            for room in world.neighbours(self._room)
        ]
        here = [f"the {colour} key" for colour, room in world.keys if room == self._room and colour not in self._held]
        held = ", ".join(sorted(self._held)) or "no keys"
        return (
            f"You are in the {self._room}. Passages: {', '.join(exits)}. "
            f"Here: {', '.join(here) or 'nothing'}. You hold: {held}."
        )


def _world_of(task: Task) -> World:
    w = task.meta["world"]
    return World(
        tuple(w["rooms"]),
        tuple(tuple(p) for p in w["passages"]),
        tuple((tuple(p), c) for p, c in w["doors"]),
        tuple(tuple(k) for k in w["keys"]),
        w["start"],
        w["goal"],
    )

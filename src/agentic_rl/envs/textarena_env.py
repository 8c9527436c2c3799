"""`textarena`: textarena's single-player games as multi-turn environments, rules untouched.

textarena (`pip install 'agentic-rl[textarena]'`) ships text games: GuessTheNumber, Mastermind,
FrozenLake, TowerOfHanoi, Minesweeper, Sokoban, ... The bridge plays one game per episode:

    reset  ──► the game's prompt and board (its opening observations) as the user message
    step   ──► the whole policy turn goes to the game's `step`, which parses the move itself
               (e.g. `[A C]`, `[5]`); what the game says back (the move's effect, the new
               board, an invalid-move warning) is the next user message
    done   ──► the game's reward for player 0 is the last turn's reward; a win (reward >= 1)
               is `correct`

An invalid move is the game's business: textarena warns and lets the player retry (its
`error_allowance`, 1 in these games: a second invalid move in a row ends the game with the
game's own reward). Counted in `info["invalid_moves"]`. The game's own turn limit ends it as the
game says; `max_turns` here is only a cap on policy turns (finish "max_turns", reward 0 unless
the game already paid one).

    env: {name: textarena, options: {game: TowerOfHanoi-v0}}
    env: {name: textarena, options: {game: GuessTheNumber-v0, game_options: {max_number: 50}}}

Splits: task i of seed s plays the game seeded base + i, base = s·2·SPLIT_SPAN for train and
that plus SPLIT_SPAN for test. textarena seeds Python's global `random` and draws from it during
play; the bridge gives each episode its own random state and restores the process's around every
call (one call at a time), so games replay exactly and nothing else in the process is reseeded.
A game that needs data it would download (Hangman, Wordle, WordLadder fetch NLTK corpora) fails
when the env is built, naming the game and the resource. Oracles (for SFT and `envs oracle`)
exist where a game has a short exact solution: GuessTheNumber (binary search), TowerOfHanoi
(the recursive plan) and FrozenLake (a breadth-first path around the holes).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import random
import re
import threading
from pathlib import Path
from typing import Any, Callable

from agentic_rl.config import Config, PositiveInt
from agentic_rl.envs.base import Env, StepResult, Task, register_env
from agentic_rl.envs.library_guard import missing_extra, offline, split_base

SYSTEM_PROMPT = (
    "You are playing a text game. Follow its rules, and write one move per turn in the form the game asks for."
)
_GAME_LOCK = threading.Lock()


@dataclasses.dataclass
class TextArenaOptions(Config):
    game: str = "GuessTheNumber-v0"
    """A textarena game id (`agentic-rl envs list` shows the single-player ones installed), without a
    wrapper suffix: the bridge plays the raw game and renders its observations itself."""
    game_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the game's constructor, over its registered ones (e.g. {num_disks: 4})."""
    max_turns: PositiveInt = 40
    """Cap on policy turns per episode; the game's own turn limit normally ends it first."""

    def __post_init__(self) -> None:
        if self.game.endswith(("-raw", "-train")):
            raise ValueError(
                f"give the game's id without a wrapper suffix (e.g. {self.game.rsplit('-', 1)[0]!r}), got {self.game!r}"
            )


@register_env("textarena", TextArenaOptions)
class TextArenaEnv(Env):
    """One textarena single-player game per episode."""

    name = "textarena"
    final_answers = False  # success is winning the game

    def __init__(self, options: TextArenaOptions | None = None):
        self.options = options or TextArenaOptions()
        self.max_turns = self.options.max_turns
        self.tools = []
        _probe(self.options.game, tuple(sorted(self.options.game_options.items())))  # fails here, when the config loads
        self._game: Any = None
        self._rng_state: Any = None

    @classmethod
    def catalogue(cls) -> str:
        """The installed textarena's single-player games, for `agentic-rl envs list`."""
        try:
            import textarena  # noqa: F401  # local: optional extra
        except ImportError:
            return missing_extra("textarena", "textarena")
        return f"textarena single-player games: {', '.join(single_player_games())}"

    # --- tasks ------------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        base = split_base("textarena", split, n, seed)
        game = self.options.game
        return [
            Task(
                f"textarena/{game}/{split}/{seed}/{i}", f"{game}, game seed {base + i}", "win", {"game_seed": base + i}
            )
            for i in range(n)
        ]

    # --- episode ----------------------------------------------------------------------------

    def reset(self, task: Task) -> list[dict[str, Any]]:
        import textarena  # local: optional extra

        self._game = textarena.make(f"{self.options.game}-raw", **self.options.game_options)
        self._rng_state = random.Random(task.meta["game_seed"]).getstate()
        self._call(self._game.reset, num_players=1, seed=task.meta["game_seed"])
        self._turns, self._invalid = 0, 0
        self._done = False
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self._observation()}]

    def step(self, action_text: str) -> StepResult:
        if self._game is None or self._done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self._turns += 1
        done, _step_info = self._call(self._game.step, action=action_text)
        text, invalid = self._observation_and_invalid()
        self._invalid += invalid
        info = {"invalid_moves": self._invalid, "turns": self._turns}
        if done:
            return self._finish("game_over", info)
        if self._turns >= self.max_turns:
            return self._finish("max_turns", info)
        return StepResult([{"role": "user", "content": text}], 0.0, False, info)

    def oracle_actions(self, task: Task) -> list[str]:
        """A solution for the game of the running episode (call after `reset(task)`, as
        `envs.oracle.play_oracle` does): it reads the game's state, so it needs no observation."""
        game = self.options.game.split("-")[0]
        if game not in ORACLES or self._game is None:
            raise NotImplementedError(
                f"textarena game {self.options.game!r} has no oracle here; games with one: {sorted(ORACLES)}"
            )
        return ORACLES[game](self._game)

    # --- helpers ------------------------------------------------------------------------------

    def _finish(self, finish: str, info: dict[str, Any]) -> StepResult:
        self._done = True
        rewards, game_info = self._call(self._game.close)
        reward = float((rewards or {}).get(0, 0.0))
        if game_info.get(0, {}).get("invalid_move", False):  # the invalid move that ended the game: no warning came
            info["invalid_moves"] += 1
        info = {
            **info,
            "correct": reward >= 1.0,
            "format_ok": not game_info.get(0, {}).get("invalid_move", False),
            "finish": finish if finish == "max_turns" else ("won" if reward >= 1.0 else "lost"),
            "game_reward": reward,
            "reason": str(game_info.get(0, {}).get("reason", "")),
            "tool_calls": 0,
            "tool_errors": 0,
        }
        return StepResult(None, reward, True, info)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn` with this episode's random state in Python's global `random` (module docstring)."""
        with _GAME_LOCK:
            outer = random.getstate()
            random.setstate(self._rng_state)
            try:
                return fn(*args, **kwargs)
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def _observation(self) -> str:
        return self._observation_and_invalid()[0]

    def _observation_and_invalid(self) -> tuple[str, int]:
        """What the game told the player since the last turn (not the echo of the player's own
        move), and how many invalid-move warnings are in it."""
        import textarena  # local: optional extra

        _player, observations = self._call(self._game.get_observation)
        kinds = textarena.ObservationType
        messages = [message for _from, message, kind in observations if kind != kinds.PLAYER_ACTION]
        invalid = sum(
            1 for _from, message, kind in observations if kind == kinds.GAME_ADMIN and "invalid move" in message.lower()
        )
        return "\n".join(messages).strip() or "(the game said nothing)", invalid


@functools.lru_cache(maxsize=None)
def _probe(game: str, game_options: tuple[tuple[str, Any], ...]) -> None:
    """Build and reset `game` once with the network refused: a missing extra, an unknown or
    multi-player game, a bad option or data it would download fails here, named."""
    try:
        import textarena  # local: optional extra
    except ImportError as exc:
        raise ValueError(missing_extra("textarena", "textarena")) from exc
    if f"{game}-raw" not in textarena.envs.registration.ENV_REGISTRY:
        raise ValueError(f"unknown textarena game {game!r}; single-player games: {', '.join(single_player_games())}")
    outer = random.getstate()
    try:
        with offline(f"textarena game {game}"):
            instance = textarena.make(f"{game}-raw", **dict(game_options))
            instance.reset(num_players=1, seed=0)
    except ValueError:
        raise
    except AssertionError as exc:
        raise ValueError(
            f"textarena game {game!r} is not a single-player game ({exc}); the bridge plays single-player games"
        ) from exc
    except LookupError as exc:  # NLTK's "Resource words not found."
        missing = re.search(r"Resource \S+ not found", str(exc))
        raise ValueError(
            f"textarena game {game!r} needs data it would download at run time, which agentic-rl never does: "
            f"{missing.group(0) if missing else exc!r}. Install that data first (NLTK corpora: "
            f"python -m nltk.downloader <name>) or pick another game"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a bad option or a game bug, named
        raise ValueError(
            f"textarena cannot start game {game!r} with {dict(game_options)}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        random.setstate(outer)
    if type(instance.state).__name__ != "SinglePlayerState":
        raise ValueError(f"textarena game {game!r} is for several players; the bridge plays single-player games")


@functools.lru_cache(maxsize=1)
def single_player_games() -> list[str]:
    """Ids of the installed textarena's games whose state is single-player, read from each game's
    source file without importing it (some of textarena's modules do not import on every Python)."""
    import textarena  # local: optional extra

    root = Path(importlib.util.find_spec("textarena").origin).parent  # type: ignore[union-attr, arg-type]
    games = []
    for game_id, spec in textarena.envs.registration.ENV_REGISTRY.items():
        if game_id.endswith(("-raw", "-train")) or not isinstance(spec.entry_point, str):
            continue
        source = root.joinpath(*spec.entry_point.split(":")[0].split(".")[1:]).with_suffix(".py")
        if source.is_file() and "SinglePlayerState" in source.read_text(encoding="utf-8", errors="replace"):
            games.append(game_id)
    return sorted(games)


# ---------------------------------------------------------------------- oracles


def _guess_the_number(game: Any) -> list[str]:
    low, high, secret, moves = game.min_number, game.max_number, game.game_number, []
    while not moves or moves[-1] != secret:
        moves.append((low + high) // 2)
        low, high = (moves[-1] + 1, high) if moves[-1] < secret else (low, moves[-1] - 1)
    return [f"[{move}]" for move in moves]


def _tower_of_hanoi(game: Any) -> list[str]:
    def plan(disks: int, source: str, target: str, spare: str) -> list[str]:
        if disks == 0:
            return []
        return (
            plan(disks - 1, source, spare, target) + [f"[{source} {target}]"] + plan(disks - 1, spare, target, source)
        )

    return plan(game.num_disks, "A", "C", "B")


def _frozen_lake(game: Any) -> list[str]:
    grid, start, goal = game.state.game_state["grid"], tuple(game.player_pos), tuple(game.goal_pos)
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    previous: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        for move, (dr, dc) in steps.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < len(grid)
                and 0 <= nxt[1] < len(grid[0])
                and nxt not in previous
                and grid[nxt[0]][nxt[1]] != "H"
            ):
                previous[nxt] = (cell, move)
                queue.append(nxt)
    if goal not in previous:
        raise NotImplementedError("this FrozenLake board has no path to the goal")
    moves, cell = [], goal
    while previous[cell] is not None:
        cell, move = previous[cell]
        moves.append(f"[{move}]")
    return moves[::-1]


ORACLES: dict[str, Callable[[Any], list[str]]] = {
    "GuessTheNumber": _guess_the_number,
    "TowerOfHanoi": _tower_of_hanoi,
    "FrozenLake": _frozen_lake,
}

"""Tiny verifiers environments for the verifiers bridge's tests (tests/test_bridges.py), written the
way an environment package of the verifiers ecosystem is: a module whose `load_environment(**args)`
returns a `vf.Environment`. The bridge loads it by module name (`env_id: vf_tiny_envs`), so this file
must stay importable from tests/ (pytest puts tests/ on sys.path; CLI tests add it to PYTHONPATH).

    single    SingleTurnEnv: "What is a + b?", a system prompt and one few-shot pair; rubric
              correct_answer (weight 1) + short_answer (weight 0.5) + length metric (weight 0);
              pass_threshold 1.0 (a short wrong answer's 0.5 does not pass)
    guess     MultiTurnEnv: guess a secret from 1 to 8; env_response says higher/lower and reads the
              guess with a bare int() (a naive env: hostile text makes it raise; `lenient: true` asks
              again instead); a right guess is its final_env_response (the episode ends); rubric
              found_secret (1) + guesses (-0.1); max_turns 6
    tool      ToolEnv: an `add(a, b)` tool, then the answer
    judge     SingleTurnEnv with a JudgeRubric (a judge model behind an OpenAI client): refused
    group     SingleTurnEnv whose rubric scores a group of rollouts together: refused
    own_model an env that overrides get_model_response (asks a model itself): refused
    group_env an EnvGroup routing tasks to member envs: refused by kind (as SandboxEnv, MCPEnv, ... are)
    download  load_environment fetches a hub dataset: fails offline, naming it

Rows carry a reference `completion` (the verifiers convention for SFT data) on the train split of
`single`, `guess` and `tool`; the test split of `single` has none.
"""

from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Add the two numbers. Reply with the sum only."
FEW_SHOT = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]


def _last_number(text: str) -> str:
    numbers = re.findall(r"-?\d+", text or "")
    return numbers[-1] if numbers else ""


def correct_answer(completion, answer, parser) -> float:
    return 1.0 if parser.parse_answer(completion) == str(answer) else 0.0


def short_answer(completion) -> float:
    return 1.0 if len(completion[-1]["content"] or "") <= 12 else 0.0


def length(completion) -> float:
    return float(len(completion[-1]["content"] or ""))


def _sums(rows: range, with_completion: bool, first: int = 3) -> Dataset:
    records = []
    for i in rows:
        a, b = first + i % 7, 11 + (5 * i) % 13
        record = {"question": f"What is {a} + {b}?", "answer": str(a + b)}
        if with_completion:
            record["completion"] = [{"role": "assistant", "content": str(a + b)}]
        records.append(record)
    return Dataset.from_list(records)


def _single(rubric: vf.Rubric | None = None, train_rows: int = 12, eval_rows: int = 6) -> vf.Environment:
    parser = vf.Parser(extract_fn=_last_number)
    rubric = rubric or vf.Rubric(funcs=[correct_answer, short_answer, length], weights=[1.0, 0.5, 0.0], parser=parser)
    return vf.SingleTurnEnv(
        dataset=_sums(range(train_rows), True),
        eval_dataset=_sums(range(eval_rows), False, first=30),
        system_prompt=SYSTEM_PROMPT,
        few_shot=FEW_SHOT,
        parser=parser,
        rubric=rubric,
        pass_threshold=1.0,
    )


class GuessEnv(vf.MultiTurnEnv):
    """Guess the secret (info["secret"]) from 1 to 8; each reply says higher, lower or correct."""

    def __init__(self, lenient: bool, **kwargs):
        super().__init__(**kwargs)
        self.lenient = lenient

    async def env_response(self, messages, state, **kwargs):
        text = messages[-1]["content"].strip()
        if self.lenient and not text.isdigit():
            return [vf.UserMessage(content="Reply with one number from 1 to 8.")]
        guess = int(text)  # naive on purpose (unless lenient): a non-number raises ValueError
        secret = state["info"]["secret"]
        if guess == secret:
            state["found"] = True
            state["final_env_response"] = [vf.UserMessage(content="correct")]  # ends the episode after this reply
            return state["final_env_response"]
        return [vf.UserMessage(content="higher" if guess < secret else "lower")]


def found_secret(state) -> float:
    return 1.0 if state.get("found") else 0.0


def guesses(completion) -> float:
    return float(sum(1 for message in completion if message["role"] == "assistant"))


def _binary_search(secret: int) -> list[dict]:
    low, high, turns = 1, 8, []
    while True:
        guess = (low + high) // 2
        turns.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            return turns
        turns.append({"role": "user", "content": "higher" if guess < secret else "lower"})
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def _guess(max_turns: int = 6, lenient: bool = False) -> vf.Environment:
    def rows(secrets: list[int]) -> Dataset:
        return Dataset.from_list(
            [
                {
                    "question": "I picked a whole number from 1 to 8. Guess it: reply with one number per turn.",
                    "answer": str(s),
                    "info": {"secret": s},
                    "completion": _binary_search(s),
                }
                for s in secrets
            ]
        )

    rubric = vf.Rubric(funcs=[found_secret, guesses], weights=[1.0, -0.1])
    return GuessEnv(
        lenient,
        dataset=rows([1, 2, 3, 4, 5, 6, 7, 8]),
        eval_dataset=rows([6, 3, 8, 1]),
        rubric=rubric,
        max_turns=max_turns,
        pass_threshold=0.5,
    )


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _tool() -> vf.Environment:
    records = [
        {
            "question": f"Use the add tool: what is {a} + {b}?",
            "answer": str(a + b),
            "completion": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "call_0", "name": "add", "arguments": f'{{"a": {a}, "b": {b}}}'}],
                },
                {"role": "tool", "tool_call_id": "call_0", "content": str(a + b)},
                {"role": "assistant", "content": str(a + b)},
            ],
        }
        for a, b in [(17, 25), (40, 2), (9, 99), (120, 7)]
    ]
    parser = vf.Parser(extract_fn=_last_number)
    rubric = vf.Rubric(funcs=[correct_answer], parser=parser)
    return vf.ToolEnv(
        tools=[add],
        max_turns=3,
        dataset=Dataset.from_list(records),
        eval_dataset=Dataset.from_list(records),
        parser=parser,
        rubric=rubric,
    )


def _judge() -> vf.Environment:
    from openai import AsyncOpenAI

    judge = vf.JudgeRubric(judge_client=AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1"))
    return _single(rubric=judge)


def relative_length(completions) -> list[float]:
    lengths = [len(completion[-1]["content"] or "") for completion in completions]
    return [float(length == min(lengths)) for length in lengths]


class AskingEnv(vf.SingleTurnEnv):
    """Asks its model through its own client (as a user-simulator env would)."""

    async def get_model_response(self, state, prompt, **kwargs):
        return await super().get_model_response(state, prompt, **kwargs)


def _download() -> vf.Environment:
    from datasets import load_dataset

    dataset = load_dataset("agentic-rl-tests/no-such-dataset", split="train")
    return vf.SingleTurnEnv(dataset=dataset)


def load_environment(kind: str = "single", **kwargs) -> vf.Environment:
    if kind == "single":
        return _single(**kwargs)
    if kind == "guess":
        return _guess(**kwargs)
    if kind == "tool":
        return _tool()
    if kind == "judge":
        return _judge()
    if kind == "group":
        return _single(rubric=vf.Rubric(funcs=[correct_answer, relative_length]))
    if kind == "own_model":
        return AskingEnv(dataset=_sums(range(4), False))
    if kind == "group_env":
        return vf.EnvGroup(envs=[_single(), _guess()], env_names=["sums", "guess"])
    if kind == "download":
        return _download()
    raise ValueError(f"unknown kind {kind!r}")

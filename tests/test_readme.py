"""The README's tutorial code runs as written: a custom environment, tool and reward."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    """The tutorial's blocks (the serving section's `openai` client block runs in tests/test_serve.py, against a server)."""
    return [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL) if "OpenAI(" not in block]


def test_readme_tutorial_blocks_register_a_working_env_tool_and_reward():
    """Guards against a README that drifted from the API (the tutorial is many users' first contact)."""
    blocks = _python_blocks()
    assert len(blocks) == 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)

    from agentic_rl.envs.base import make_env
    from agentic_rl.rewards.base import RewardComposer, RewardSpec
    from agentic_rl.tools.base import get_tool
    from agentic_rl.tools.parse import format_tool_call

    env = make_env("squares", max_base=10)
    task = env.tasks("test", n=3)[1]
    messages = env.reset(task)
    assert messages[-1]["content"] == task.question
    assert any(schema["function"]["name"] == "calculator" for schema in env.tool_schemas)
    base = int(task.question.split()[2])
    observation = env.step(format_tool_call("calculator", {"expression": f"{base}**2"}))
    assert observation.observation[0]["content"] == str(base**2)
    done = env.step(f"Final Answer: {base**2}")
    assert done.done and done.info["correct"]

    assert get_tool("unit_price").call({"total": 10.0, "count": 4}) == "2.50"
    import pytest
    from agentic_rl.tools.base import ToolError

    with pytest.raises(ToolError, match="count must be positive"):
        get_tool("unit_price").call({"total": 10.0, "count": 0})

    from agentic_rl.rollout.trajectory import Span, Trajectory

    traj = Trajectory([1, 2, 3], [0, 1, 1], [0.0] * 3, [Span("prompt", 0, 1), Span("policy", 1, 3)], info={"correct": True})
    composer = RewardComposer([RewardSpec("accuracy"), RewardSpec("short_and_right", weight=0.5, params={"budget": 150})])
    assert composer([traj]) == [1.5]


def test_readme_is_a_users_document_short_and_free_of_lab_labels():
    """Guards against the README growing back into a lab notebook: measurements and their history
    belong in EXPERIMENTS.md and BENCHMARKS.md; a user cannot use internal work labels or dates."""
    text = README.read_text()
    assert len(text.encode()) < 16_000, f"README.md is {len(text.encode())} bytes; move measurements to EXPERIMENTS.md"
    for label in ("issue ", "Issue ", "session ", "Session ", "work item"):
        assert label not in text, f"README.md names an internal label {label!r}: {text[text.index(label) - 60:text.index(label) + 40]!r}"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md carries a date; dated results go to EXPERIMENTS.md"

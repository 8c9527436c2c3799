"""Plugins: a user's env, tool and reward written outside the package, loaded by `--plugin` / `plugins:`
or by an installed distribution's entry points, through the CLI (subprocesses, as a user runs it),
in the pipeline's spawned stages and in each rank of a launch; and the errors of a broken plugin.

The plugin below offers env `cubes` (its own tool `cube`, an oracle for SFT demonstrations) and
reward `few_tokens`. In-process tests use other names (each test its own), since a registration
lasts as long as the test process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

TOOLS = '''
from agentic_rl.tools.base import register_tool


@register_tool("cube")
def cube(x: int) -> str:
    """The cube of an integer.

    Args:
        x: The number to cube.
    """
    return str(x ** 3)
'''

ENVS = '''
import dataclasses

from agentic_rl.envs.base import Task, register_env
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.tools.parse import format_tool_call


@dataclasses.dataclass
class CubesOptions:
    max_base: int = 9
    """Largest number to cube."""


@register_env("cubes", CubesOptions)
class CubesEnv(ToolEnv):
    name = "cubes"

    def __init__(self, options):
        super().__init__(tools=["cube"], max_turns=2)
        self.options = options

    def tasks(self, split, n=None, seed=0):
        offset = 0 if split == "train" else 1000
        bases = [(i + offset + seed) % self.options.max_base + 2 for i in range(n or 50)]
        return [Task(id=f"cubes/{split}/{i}", question=f"What is {b} cubed?", answer=str(b ** 3)) for i, b in enumerate(bases)]

    def oracle_actions(self, task):
        base = int(task.question.split()[2])
        return [format_tool_call("cube", {"x": base}), f"Final Answer: {task.answer}"]
'''

REWARDS = '''
from agentic_rl.rewards.base import register_reward


@register_reward("few_tokens")
def few_tokens(traj, budget: int = 8) -> float:
    """1 when the episode has at most `budget` policy tokens."""
    return float(traj.num_policy_tokens <= budget)
'''

TINY_GRPO = """
model: {{name: tiny-qwen3, lora: {{r: 4}}}}
env: {{name: cubes, options: {{max_base: 5}}, task_pool: 4}}
rewards: [{{name: accuracy}}, {{name: few_tokens, params: {{budget: 6}}}}]
rollout: {{batch_size: 4, group_size: 2, max_turn_tokens: 4, max_turns: 1}}
micro_batch_size: 4
train: {{steps: 1, progress: false, output_dir: {out}}}
"""


def _write_plugin(folder: Path, name: str = "cubes_plugin") -> Path:
    path = folder / f"{name}.py"
    path.write_text(TOOLS + ENVS + REWARDS)
    return path


def _cli(
    *args: str, cwd: Path | None = None, pythonpath: Path | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    paths = [str(pythonpath)] if pythonpath else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(REPO / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "agentic_rl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_plugin_file_registers_its_env_and_tool_for_the_cli(tmp_path):
    """Guards against a user's task that needs agentic_rl/ edited to be seen (issue 33: no --plugin)."""
    plugin = _write_plugin(tmp_path)
    listed = _cli("envs", "list", "-v", "--plugin", str(plugin))
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.splitlines()
    assert "arith" in lines and "cubes" in lines  # the built-ins and the plugin's
    assert lines[lines.index("cubes") + 1].strip() == "max_base (int, default 9): Largest number to cube."
    ran = _cli(
        "tools", "run", "cube", "--arg", "x=3", "--plugin", "cubes_plugin.py", cwd=tmp_path
    )  # a path relative to the cwd
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout.splitlines()[-1]) == {"tool": "cube", "ok": True, "result": "27"}


def _readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_example_runs_as_a_plugin_file_through_the_cli(tmp_path):
    """The README's env, tool and reward, saved as `my_tasks.py`, listed by the README's command and
    evaluated on tiny-qwen3 with the README's config (guards against a tutorial that works only
    in-process, or a plugin config shown in the README that does not load)."""
    blocks = [
        block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL) if "OpenAI(" not in block
    ]
    (tmp_path / "my_tasks.py").write_text("\n\n".join(blocks))
    section = _readme_section("Add your own environment")
    (command,) = [
        line
        for line in re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).splitlines()
        if " envs list " in line
    ]
    listed = _cli(*command.split()[1:], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "squares" in listed.stdout.splitlines()
    (tmp_path / "eval.yaml").write_text(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    done = _cli(
        "eval",
        "--config",
        "eval.yaml",
        "--model",
        "tiny-qwen3",
        "--n",
        "2",
        "--max-turn-tokens",
        "4",
        "--max-turns",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["env"], result["n"], result["mean_tokens"]) == ("squares", 2, 4.0)


def _install_distribution(site: Path, broken: bool = False) -> None:
    """A distribution as pip would leave it in site-packages: its modules and a .dist-info with
    entry points in all three groups (the env module does not import the tool's: the tools group
    alone must register `cube`)."""
    site.mkdir()
    (site / "cubes_envs.py").write_text(ENVS)
    (site / "cubes_tools.py").write_text(TOOLS)
    (site / "cubes_rewards.py").write_text(REWARDS)
    info = site / "cubes_tasks-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cubes-tasks\nVersion: 0.1\n")
    envs_module = "cubes_envs_missing" if broken else "cubes_envs"
    (info / "entry_points.txt").write_text(
        f"[agentic_rl.envs]\ncubes = {envs_module}\n\n[agentic_rl.tools]\ncube = cubes_tools\n\n"
        "[agentic_rl.rewards]\nfew_tokens = cubes_rewards\n"
    )


def test_an_installed_distributions_entry_points_register_without_any_setting(tmp_path):
    """Guards against a plugin package that registers only when imported by hand."""
    _install_distribution(tmp_path / "site")
    listed = _cli("envs", "list", pythonpath=tmp_path / "site")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "cubes" in listed.stdout.splitlines()


def test_an_entry_point_that_fails_to_import_stops_naming_it_and_its_distribution(tmp_path):
    """Guards against a broken installed plugin being skipped silently (its tasks missing) or failing without
    naming the entry point and distribution."""
    _install_distribution(tmp_path / "site", broken=True)
    listed = _cli("envs", "list", pythonpath=tmp_path / "site")
    assert listed.returncode == 2
    assert (
        "error: entry point 'cubes = cubes_envs_missing' (group agentic_rl.envs, distribution cubes-tasks) failed to import: "
        "ModuleNotFoundError: No module named 'cubes_envs_missing'"
    ) in listed.stderr


def test_grpo_trains_on_an_installed_distributions_env_tool_and_reward(tmp_path):
    """A short GRPO run on tiny-qwen3 whose env, tool and reward all come from entry points."""
    _install_distribution(tmp_path / "site")
    config = tmp_path / "grpo.yaml"
    config.write_text(TINY_GRPO.format(out=tmp_path / "run"))
    done = _cli("grpo", "--config", str(config), pythonpath=tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and row["reward/few_tokens/mean"] == 1.0  # 4 tokens each, within the budget of 6


def test_a_plugin_that_fails_to_import_stops_the_command_naming_it_and_the_error(tmp_path):
    """Guards against a --plugin file whose import fails being skipped, or reported without the file, the error
    and its line."""
    broken = tmp_path / "broken_tasks.py"
    broken.write_text("import dataclasses\nimport no_such_package_for_tasks\n")
    done = _cli("envs", "list", "--plugin", str(broken))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"plugin {broken}: importing {broken} (named by --plugin)",
        f"error: plugin '{broken}' failed to import: ModuleNotFoundError: No module named 'no_such_package_for_tasks' "
        f"(at {broken}:2)",
    ]


def test_a_plugin_inherited_through_extends_is_announced_with_its_file_and_the_configs_that_named_it(tmp_path, capsys):
    """Guards against a `plugins:` entry in a base file running a .py file the user never opened, with
    nothing printed."""
    from agentic_rl.evaluation.config import EvalCommandConfig
    from agentic_rl.validation import load_and_validate

    plugin = tmp_path / "inherited_plugin.py"
    plugin.write_text("RAN = True\n")
    (tmp_path / "base.yaml").write_text(f"plugins: [{plugin}]\n")
    (tmp_path / "mine.yaml").write_text("extends: base.yaml\nmodel: tiny-qwen3\n")
    load_and_validate(EvalCommandConfig, tmp_path / "mine.yaml")
    assert sys.modules["inherited_plugin"].RAN
    assert (
        f"plugin {plugin}: importing {plugin} (named by {tmp_path / 'mine.yaml'}, extending "
        f"{(tmp_path / 'base.yaml').resolve()})"
    ) in capsys.readouterr().err


def test_a_plugin_that_exits_on_import_is_an_error_naming_it_not_a_success(tmp_path):
    """Guards against a plugin's sys.exit(0) on import making the command exit 0 having done nothing."""
    quitter = tmp_path / "quitter.py"
    quitter.write_text("import sys\nsys.exit(0)\n")
    done = _cli("envs", "oracle", "arith", "--n", "2", "--plugin", str(quitter))
    assert done.returncode == 2
    assert f"error: plugin '{quitter}' called sys.exit(0) while it was imported" in done.stderr


@pytest.mark.parametrize("n", ["0", "-1"])
def test_envs_oracle_refuses_fewer_than_one_task(n):
    """Guards against `envs oracle arith --n 0` reporting accuracy 0.0 and exiting 1, as if the oracle had failed."""
    done = _cli("envs", "oracle", "arith", "--n", n)
    assert done.returncode == 2 and f"argument --n: {n} tasks: give at least 1" in done.stderr


def test_a_missing_plugin_file_or_module_is_named(tmp_path):
    """Guards against a typo'd plugin path or module being ignored, and against a name that is neither a module
    nor a .py path being guessed at."""
    from agentic_rl.plugin_loading import load_plugins
    from agentic_rl.plugins import PluginError

    missing = tmp_path / "nowhere" / "tasks.py"
    with pytest.raises(PluginError, match=re.escape(f"plugin file '{missing}' does not exist")):
        load_plugins([str(missing)])
    with pytest.raises(
        PluginError,
        match=re.escape(
            "plugin 'no_such_tasks_module' failed to import: ModuleNotFoundError: "
            "No module named 'no_such_tasks_module'"
        ),
    ):
        load_plugins(["no_such_tasks_module"])
    with pytest.raises(PluginError, match="neither a module name"):
        load_plugins(["my-tasks"])


_DUPLICATES = {
    "environment": 'from agentic_rl.envs.base import Env, register_env\n\nregister_env("{name}")(type("E", (Env,), {{"name": "{name}"}}))\n',
    "tool": 'from agentic_rl.tools.base import register_tool\n\n\n@register_tool("{name}")\ndef t(x: int) -> str:\n'
    '    """T.\n\n    Args:\n        x: X.\n    """\n    return str(x)\n',
    "reward": 'from agentic_rl.rewards.base import register_reward\n\n\n@register_reward("{name}")\ndef r(traj) -> float:\n'
    "    return 0.0\n",
}


@pytest.mark.parametrize("kind", sorted(_DUPLICATES))
def test_two_plugins_registering_one_name_is_an_error_naming_both(kind, tmp_path):
    """Guards against a second registration that silently replaces the first (or a message that
    leaves the user to find which two modules clash)."""
    from agentic_rl.plugin_loading import load_plugins
    from agentic_rl.plugins import PluginError

    name = f"dup_{kind}_name"
    first, second = tmp_path / f"first_{kind}s.py", tmp_path / f"second_{kind}s.py"
    for path in (first, second):
        path.write_text(_DUPLICATES[kind].format(name=name))
    with pytest.raises(PluginError) as error:
        load_plugins([str(first), str(second)])
    assert str(error.value).startswith(
        f"{kind} '{name}' is registered twice: first by first_{kind}s ({first}), again by second_{kind}s ({second})"
    )


def test_a_plugin_reusing_a_built_in_name_is_named_second(tmp_path):
    """Guards against a plugin silently replacing a built-in env: registering 'arith' twice names both modules
    and files."""
    from agentic_rl.envs import arith
    from agentic_rl.plugin_loading import load_plugins
    from agentic_rl.plugins import PluginError

    plugin = tmp_path / "my_arith.py"
    plugin.write_text(_DUPLICATES["environment"].format(name="arith"))
    with pytest.raises(
        PluginError,
        match=re.escape(
            f"environment 'arith' is registered twice: first by agentic_rl.envs.arith "
            f"({arith.__file__}), again by my_arith ({plugin})"
        ),
    ):
        load_plugins([str(plugin)])


def test_a_configs_plugins_are_imported_before_its_env_is_checked_and_flags_append(tmp_path):
    """Guards against validating `env.name` before the plugin that registers it is imported."""
    from agentic_rl.evaluation.config import EvalCommandConfig
    from agentic_rl.validation import load_and_validate

    plugin = tmp_path / "config_tasks.py"
    plugin.write_text(
        _DUPLICATES["environment"].format(name="config_env") + _DUPLICATES["reward"].format(name="config_reward")
    )
    config = tmp_path / "eval.yaml"
    config.write_text(f"model: tiny-qwen3\nplugins: [{plugin}]\nenv: {{name: config_env}}\n")
    cfg = load_and_validate(
        EvalCommandConfig, config, plugins=["json"]
    )  # a module name, appended after the file's list
    assert cfg.plugins == [str(plugin), "json"] and cfg.env.make().name == "config_env"


def test_plugins_belong_at_the_pipelines_top_level():
    """Guards against plugins listed under one pipeline stage, which the other stages (and their env builders)
    would not import."""
    from agentic_rl.config import ConfigError, load_config
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(
        ConfigError,
        match=re.escape("grpo.plugins: list plugins at the top level (`plugins:`), where every stage imports them"),
    ):
        load_config(PipelineConfig, None, ["grpo.plugins=[json]"])


def test_a_spawned_pipeline_stage_imports_the_configs_plugins(tmp_path):
    """The stage's process starts with none of its parent's imports (spawn); the plugin's env must
    be registered there again before the stage builds it (guards against `-c`-style imports that
    reach only the parent, issue 33)."""
    import multiprocessing

    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig, _run_stage

    plugin = _write_plugin(tmp_path, "stage_tasks")
    plugin.write_text(
        plugin.read_text()
        .replace('"cubes"', '"stage_cubes"')
        .replace('"cube"', '"stage_cube"')
        .replace('"few_tokens"', '"stage_few_tokens"')
    )
    cfg = load_config(
        PipelineConfig,
        None,
        [
            "model=tiny-qwen3",
            f"output_dir={tmp_path / 'run'}",
            "evals=[{label: cubes, env: {name: stage_cubes}, n: 2, max_concurrent: 2, rollout: {max_turn_tokens: 4, max_turns: 1}}]",
        ],
        plugins=[str(plugin)],
    )
    worker = multiprocessing.get_context("spawn").Process(target=_run_stage, args=(cfg, "eval_base", os.getpid()))
    worker.start()
    worker.join(timeout=240)
    assert worker.exitcode == 0
    done = json.loads((tmp_path / "run" / "eval_base" / "DONE.json").read_text())
    assert done["evals"]["cubes"]["n"] == 2


PIPELINE = """
model: tiny-qwen3
plugins: [{plugin}]
output_dir: {out}
evals:
  - {{label: cubes, env: {{name: cubes, options: {{max_base: 5}}}}, n: 2, max_concurrent: 2, rollout: {{max_turn_tokens: 8, max_turns: 2}}}}
sft:
  sources: [{{kind: oracle, env: {{name: cubes}}, n: 4}}]
  batch_size: 4
  micro_batch_size: 4
  train: {{steps: 1, progress: false}}
rm:
  pairs: {{source: corrupted, env: {{name: cubes}}, tasks: 4, heldout_tasks: 2}}
  batch_size: 4
  train: {{steps: 1, progress: false}}
grpo:
  env: {{name: cubes, options: {{max_base: 5}}, task_pool: 4}}
  rewards: [{{name: accuracy}}, {{name: few_tokens}}]
  rollout: {{batch_size: 4, group_size: 2, max_turn_tokens: 8, max_turns: 2}}
  micro_batch_size: 4
  train: {{steps: 1, progress: false}}
"""


@pytest.mark.e2e
def test_the_pipeline_runs_every_stage_on_a_plugin_env(tmp_path):
    """`agentic-rl pipeline` on the plugin's env, tool and reward: SFT on its oracle, the reward
    model on its pairs, GRPO with its reward, each stage in its own spawned process."""
    plugin = _write_plugin(tmp_path)
    config = tmp_path / "pipeline.yaml"
    config.write_text(PIPELINE.format(plugin=plugin, out=tmp_path / "run"))
    done = _cli("pipeline", "--config", str(config), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results) == {"eval_base", "sft", "eval_sft", "rm", "grpo", "eval_grpo"}
    assert results["sft"]["num_demos"] == 4
    rows = (tmp_path / "run" / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert "reward/few_tokens/mean" in json.loads(rows[0])


@pytest.mark.e2e
def test_every_rank_of_a_two_process_launch_imports_the_plugin(tmp_path):
    """`accelerate launch -m agentic_rl.cli`: each rank reads the same command line, so each imports
    the plugin before it reads the config (gloo, 2 CPU processes)."""
    plugin = _write_plugin(tmp_path)
    config = tmp_path / "grpo.yaml"
    config.write_text(TINY_GRPO.format(out=tmp_path / "run"))
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    # --multi_gpu, not --cpu: with --cpu accelerate starts one process; without GPUs the two ranks run on gloo.
    command = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        "0",
        "-m",
        "agentic_rl.cli",
        "grpo",
        "--config",
        str(config),
        "--plugin",
        str(plugin),
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count('{"final": ') == 2, "each rank reads its config (plugin env and reward) and finishes"
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and "reward/few_tokens/mean" in row

"""configs/accelerate/: each file goes through `accelerate launch` exactly as a user's command
would, up to the point where processes start (a dry run), and the loop's side of DeepSpeed.

DeepSpeed itself is not installed here (it needs GPUs and a CUDA toolchain), so the ZeRO files
are checked as far as accelerate takes them without it: the launcher's environment and the
DeepSpeedPlugin it builds, then what `fit_deepspeed_to_loop` writes into the engine config.
The FSDP file also runs for real, on 2 CPU processes: tests/test_fsdp.py.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from agentic_rl.training.common import fit_deepspeed_to_loop, make_accelerator
from agentic_rl.training.loop import BatchObjective, LoopConfig, OptimConfig, run_training
from agentic_rl.training.run_dir import RunDir
from agentic_rl.training.scoring import require_replicated_weights, shards_weights

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "accelerate"


def _dry_launch(name: str, monkeypatch) -> tuple[str, dict[str, str]]:
    """(launcher, environment) `accelerate launch --config_file <name> x.py` would start with."""
    from accelerate.commands import launch
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    started = {}
    monkeypatch.setattr(
        launch,
        "deepspeed_launcher",
        lambda args: started.update(kind="deepspeed", env=prepare_deepspeed_cmd_env(args)[1]),
    )
    monkeypatch.setattr(
        launch, "multi_gpu_launcher", lambda args: started.update(kind="multi_gpu", env=prepare_multi_gpu_env(args))
    )
    args = launch.launch_command_parser().parse_args(
        ["--config_file", str(CONFIGS / name), "--main_process_port", "0", "x.py"]
    )
    launch.launch_command(args)
    return started["kind"], started["env"]


@pytest.mark.parametrize("name, stage", [("deepspeed_zero2.yaml", 2), ("deepspeed_zero3.yaml", 3)])
def test_deepspeed_configs_launch_zero_with_the_loop_owning_clipping_and_accumulation(name, stage, monkeypatch):
    """Guards against a ZeRO file that accelerate reads differently than its comments say, and
    against DeepSpeed stepping once per micro-batch or clipping at its own default while
    optim.max_grad_norm says otherwise."""
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    kind, env = _dry_launch(name, monkeypatch)
    assert kind == "deepspeed"
    assert (
        env["ACCELERATE_USE_DEEPSPEED"],
        env["ACCELERATE_DEEPSPEED_ZERO_STAGE"],
        env["ACCELERATE_MIXED_PRECISION"],
    ) == ("true", str(stage), "bf16")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == stage and plugin.zero3_save_16bit_model == (stage == 3)
    assert plugin.deepspeed_config["zero_optimization"]["offload_optimizer"]["device"] == "none"
    accelerator = types.SimpleNamespace(
        distributed_type=DistributedType.DEEPSPEED,
        num_processes=2,
        state=types.SimpleNamespace(deepspeed_plugin=plugin),
    )
    fit_deepspeed_to_loop(accelerator, OptimConfig(max_grad_norm=0.5))
    config = plugin.deepspeed_config
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (1, 0.5)
    assert (config["train_micro_batch_size_per_gpu"], config["train_batch_size"]) == (1, 2)
    assert shards_weights(accelerator) == (stage == 3)


def test_a_deepspeed_setting_the_loop_owns_is_refused_not_ignored():
    """Guards against invariant 6 (every setting used or rejected): gradient_clipping 1.0 in a
    DeepSpeed file while optim.max_grad_norm is 0.3 would silently clip at 1.0."""
    from accelerate.utils import DistributedType

    plugin = types.SimpleNamespace(deepspeed_config={"gradient_clipping": 1.0, "gradient_accumulation_steps": "auto"})
    accelerator = types.SimpleNamespace(
        distributed_type=DistributedType.DEEPSPEED,
        num_processes=2,
        state=types.SimpleNamespace(deepspeed_plugin=plugin),
    )
    with pytest.raises(
        ValueError, match=r"sets gradient_clipping: 1.0, but the loop needs 0.3 \(set optim.max_grad_norm instead\)"
    ):
        fit_deepspeed_to_loop(accelerator, OptimConfig(max_grad_norm=0.3))


def test_fsdp_config_launches_fsdp2_with_per_layer_wrapping(monkeypatch):
    """Guards against an FSDP file that launches FSDP1 (which needs a GPU device_id and
    use_orig_params for LoRA) or wraps only the root."""
    kind, env = _dry_launch("fsdp.yaml", monkeypatch)
    assert kind == "multi_gpu"
    assert (env["ACCELERATE_USE_FSDP"], env["FSDP_VERSION"], env["FSDP_AUTO_WRAP_POLICY"]) == (
        "true",
        "2",
        "TRANSFORMER_BASED_WRAP",
    )
    assert "FSDP_TRANSFORMER_CLS_TO_WRAP" not in env  # taken from the model (TokenScorer._no_split_modules)


@pytest.mark.parametrize("command", ["grpo", "rm"])
def test_commands_that_need_whole_weights_refuse_a_sharded_launch(command):
    """Guards against GRPO rolling out from one rank's shard of the weights under FSDP/ZeRO-3."""
    from accelerate.utils import DistributedType

    fsdp = types.SimpleNamespace(distributed_type=DistributedType.FSDP)
    with pytest.raises(
        ValueError, match=rf"`agentic-rl {command}` needs whole weights on every rank.*deepspeed_zero2.yaml"
    ):
        require_replicated_weights(fsdp, command)
    require_replicated_weights(types.SimpleNamespace(distributed_type=DistributedType.MULTI_GPU), command)


def test_only_the_last_micro_batch_is_an_accumulation_boundary(tmp_path):
    """Guards against DeepSpeed stepping its engine after every micro-batch: accelerate passes
    `sync_gradients` to the engine's backward, so it must be False until the last one."""
    from accelerate.utils import DistributedType

    class ThreeMicroBatches(BatchObjective):
        def bind(self, model, accelerator):
            self.accelerator, self.seen = accelerator, []

        def next_batch(self, step):
            return torch.ones(3, 2)

        def micro_batches(self, batch):
            return list(batch.split(1))

        def loss(self, model, micro):
            self.seen.append(self.accelerator.sync_gradients)
            return model(micro).sum(), {}

    accelerator = make_accelerator("no", seed=0)
    assert accelerator.distributed_type == DistributedType.NO
    objective = ThreeMicroBatches()
    loop = LoopConfig(steps=2, output_dir=str(tmp_path), progress=False)
    run_training(
        objective, torch.nn.Linear(2, 1), loop, OptimConfig(), accelerator, RunDir(tmp_path, loop, tensorboard=False)
    )
    assert objective.seen == [False, False, True] * 2
    assert accelerator.sync_gradients

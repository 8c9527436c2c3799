"""Every metric key a trainer writes to metrics.jsonl (and TensorBoard), defined once.

`RunDir.log` refuses a key that is not here, so a new metric arrives with its definition. The
report and `agentic-rl metrics` read the definitions from here. Keys are namespaced:
`loss/` the objective, `optim/` the optimizer, `reward/` the reward terms, `rollout/` the
sampled episodes, `train/` what a step trained on, `value/` PPO's value model, `time/` seconds,
`memory/` GPU memory, `sft/` and `rm/` their trainers. `{term}` and `{reason}` stand for one path segment, `{part}` for a number.
All values are floats; rollout and reward statistics are over the whole batch (every process).
"""

from __future__ import annotations

import re

from agentic_rl.config_docs import markdown_text

GLOSSARY: dict[str, str] = {
    # the training loop (every trainer)
    "loss/total": "The step's loss: the sum of its micro-batch losses, each weighted by its share, so the full-batch objective.",
    "optim/lr": "Learning rate after the step's scheduler update.",
    "optim/grad_norm": "Gradient norm before clipping (over all trainable parameters, all processes).",
    "time/data": "Seconds to build the step's batch (GRPO: rollouts, rewards, advantages, π_old/π_ref passes).",
    "time/forward_backward": "Seconds in forward and backward passes over the step's micro-batches.",
    "time/optimizer": "Seconds in the optimizer step and the trainer's after-step work (GRPO: weight sync).",
    "memory/max_allocated_gb": "Peak GPU memory allocated so far, GiB (CUDA only).",
    # the GRPO objective (algorithms/grpo.py): per micro-batch, averaged over the step's micro-batches
    "loss/ratio_mean": "Mean importance ratio π_θ/π_old over trained tokens (1 on-policy).",
    "loss/clip_ratio_low": "Share of trained tokens with A < 0 whose ratio is clipped at 1 − ε.",
    "loss/clip_ratio_high": "Share of trained tokens with A > 0 whose ratio is clipped at 1 + ε_high.",
    "loss/clip_ratio_region": "Share of trained tokens whose ratio lies outside [1 − ε, 1 + ε_high].",
    "loss/kl": "Mean k3 estimate of KL(π_θ ‖ π_ref) per trained token (only with β > 0).",
    "loss/entropy": "Mean entropy (nats) of the policy's next-token distribution at trained tokens, at the rollout temperature.",
    # the PPO objective (algorithms/ppo.py) and its value model
    "loss/policy": "PPO: the clipped surrogate (plus β·k3 with kl_mode: loss, minus the entropy bonus), mean over policy tokens.",
    "loss/value": "PPO: ½ · the clipped squared error of V against the GAE returns, mean over policy tokens.",
    "value/mean": "PPO: mean V_old over the batch's policy tokens (values at sampling time).",
    "value/returns_mean": "PPO: mean GAE return (the value target) over the batch's policy tokens.",
    "value/explained_variance": "PPO: 1 − Var(R − V_old) / Var(R) over policy tokens: 1 a perfect critic, 0 no better than a constant, < 0 worse; null when every return is equal (undefined).",
    "value/kl_in_reward": "PPO, kl_mode reward: mean β·(log π_old − log π_ref) subtracted from each policy token's reward.",
    # GRPO rewards
    "reward/total/mean": "Mean composed reward (the weighted sum of the terms) over the batch's episodes.",
    "reward/total/std": "Standard deviation of the composed reward over the batch's episodes.",
    "reward/{term}/mean": "Mean of one reward term (unweighted) over the batch's episodes.",
    "reward/{term}/std": "Standard deviation of one reward term over the batch's episodes.",
    # GRPO rollouts
    "rollout/accuracy": "Share of the batch's episodes graded correct by the environment.",
    "rollout/completion_tokens/mean": "Policy (generated) tokens per episode, mean.",
    "rollout/completion_tokens/max": "Policy tokens of the longest episode.",
    "rollout/turns/mean": "Policy turns per episode, mean.",
    "rollout/sequences_per_episode": "Token sequences (training rows) per episode of this process, mean: 1 when every history is a prefix; more when an env changes the context (memory's window).",
    "rollout/tool_calls/mean": "Tool calls per episode, mean.",
    "rollout/tool_errors/mean": "Failed tool calls per episode, mean.",
    "rollout/failed": "Episodes that ended in an error (env or rendering); logged, never trained on.",
    "rollout/finish/{reason}": "Share of episodes that ended for this reason (answered, env_done, max_turns, max_turn_tokens, max_episode_tokens, error).",
    "rollout/tokens_per_second": "Generated tokens of the batch over the rollout's wall time.",
    "rollout/groups_with_variance": "Share of the first draw's groups whose G rewards differ (the groups that carry a gradient), before dynamic sampling replaced any.",
    "rollout/mix{part}/accuracy": "env.mix: share of the trained batch's episodes of mix part {part} graded correct (absent when the batch drew none of it).",
    "rollout/mix{part}/groups_with_variance": "env.mix: share of the trained batch's groups of mix part {part} whose G rewards differ.",
    "rollout/rounds": "Rollout rounds of the step (1, plus dynamic sampling's extra rounds).",
    "rollout/band_fallbacks": "Prompts drawn outside the success-rate band because too few qualified (cumulative).",
    "rollout/staleness": "Optimizer steps between the weights that sampled the batch and the weights it trains (0 on-policy; up to μ − 1).",
    "rollout/weights_version": "Weights version after the step's sync (the version the next rollouts sample from).",
    "time/rollout": "Seconds spent generating the step's episodes (all rounds).",
    # the sampler/trainer mismatch (algorithms/rollout_correction.py): per micro-batch, like the loss's
    # metrics, over its trained tokens (GRPO: not guided oracle rows); w = π_old/π_sampler, exactly 1
    # with old_logprobs: sampling (π_old is then the sampler's record)
    "rollout/mismatch_kl": "Mean k3 estimate (w − 1 − log w) of KL(π_sampler ‖ π_old) per trained token: the sampler/trainer numerics mismatch; ~0 with the same numerics on both sides.",
    "rollout/is_weight_mean": "Mean importance weight w = π_old/π_sampler before truncation or masking, over trained tokens (rows at rollout_correction.level sequence); 1 with no mismatch.",
    "rollout/is_weight_max": "Largest importance weight w = π_old/π_sampler of the step's trained tokens (rows at level sequence), before truncation or masking.",
    "rollout/is_truncated_frac": "rollout_correction.mode tis: share of trained tokens (rows at level sequence) whose weight exceeded the cap and was truncated to it.",
    "rollout/is_masked_frac": "rollout_correction.mode mis: share of trained tokens (rows at level sequence) whose weight fell outside [low, high] and was masked out of the policy loss.",
    # the audit of the first batch (training/start_audit.py, audit.on_start): the step that first trains on it
    "rollout/logprob_drift_max": "Audit on start: largest |log π_sampler − log π_θ| over the first trained batch's trained tokens, π_θ the weights that sampled it (float32 on both sides: within 1e-3).",
    "rollout/logprob_drift_mean": "Audit on start: mean |log π_sampler − log π_θ| over the first trained batch's trained tokens, π_θ the weights that sampled it.",
    "time/audit": "Audit on start: seconds of its prefix and mask checks and its log-prob drift (logged once, at the step that first trains).",
    "time/reference": "Seconds spent on the passes a rollout batch needs before its first update: π_ref (β > 0) and PPO's value pass, which also re-scores π_old (GRPO takes π_old from its first update's forward); 0 when none runs.",
    # what a GRPO step trained on
    "train/groups_with_variance": "Share of the trained batch's groups whose rewards differ, after dynamic sampling and guidance.",
    "train/guided_groups": "Groups in which an oracle demonstration replaced an episode (guidance).",
    "train/episodes_trained": "Rows (token sequences; one per episode unless an env changes the context) of this process that ran forward/backward (the rest had zero advantage and no gradient).",
    # SFT
    "sft/tokens": "Trained (assistant) tokens per micro-batch, averaged over the step's micro-batches.",
    "sft/padding_fraction": "Share of a micro-batch's token positions that are padding, averaged over the step's micro-batches.",
    "sft/epoch": "Epochs over the demonstrations completed at this step (fractional).",
    # reward model
    "rm/train_accuracy": "Share of the step's pairs where the chosen trajectory scores higher.",
    "rm/margin": "Mean score(chosen) − score(rejected) over the step's pairs.",
    "rm/heldout_accuracy": "Pairwise accuracy on held-out (test-split) pairs after training.",
    "rm/heldout_accuracy_before": "Pairwise accuracy on the same held-out pairs before training.",
}

_PATTERNS = [
    (
        re.compile(
            "^"
            + re.escape(key)
            .replace(r"\{term\}", "[^/]+")
            .replace(r"\{reason\}", "[^/]+")
            .replace(r"\{part\}", "[0-9]+")
            + "$"
        ),
        key,
    )
    for key in GLOSSARY
    if "{" in key
]


def glossary_key(key: str) -> str | None:
    """The glossary entry that defines `key` (itself, or a pattern such as reward/{term}/mean), or None."""
    if key in GLOSSARY:
        return key
    return next((pattern for regex, pattern in _PATTERNS if regex.match(key)), None)


def describe_metric(key: str) -> str:
    """The definition of `key`; KeyError naming the glossary when there is none."""
    entry = glossary_key(key)
    if entry is None:
        raise KeyError(
            f"metric {key!r} is not defined in agentic_rl/training/metric_keys.py; add it to GLOSSARY with its meaning"
        )
    return GLOSSARY[entry]


def glossary_markdown() -> str:
    """Every metric key as a Markdown page (`agentic-rl metrics --markdown`, docs/metrics.md)."""
    rows = [f"| `{key}` | {markdown_text(meaning).replace('|', '&#124;')} |" for key, meaning in GLOSSARY.items()]
    return "\n".join(
        [
            "# Metrics reference",
            "",
            "Every key a trainer writes to `metrics.jsonl` and TensorBoard, generated from the code by",
            "`agentic-rl metrics --markdown`. `{term}`, `{reason}` and `{part}` stand for one path segment.",
            "",
            "| key | meaning |",
            "|---|---|",
            *rows,
            "",
        ]
    )

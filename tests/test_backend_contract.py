"""The Backend contract (rollout/backend.py), run over every backend present.

A new backend (vLLM, llama.cpp, a remote server) joins `BACKENDS` and must pass every test here:
token ids in and out, raw sampling log-probs that a plain forward pass reproduces, finish
reasons, per-episode determinism, weight sync with a version, and slot bookkeeping.
"""

import pytest
import torch

from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.backend import RunnerBackend, TurnRequest
from agentic_rl.rollout.fast_runner import FastRunner
from agentic_rl.rollout.hf_runner import HFRunner
from agentic_rl.rollout.sampling import SamplingParams

BACKENDS = {
    "hf": lambda model, chat_format, slots: RunnerBackend(HFRunner(model, max_slots=slots, max_len=256), chat_format),
    "fast": lambda model, chat_format, slots: RunnerBackend(
        FastRunner(model, max_slots=slots, max_len=256), chat_format
    ),
}

PROMPTS = [list(range(100, 130)), list(range(200, 221)), list(range(300, 341)), list(range(400, 417))]
"""Token contexts of four episodes (ids well inside tiny-qwen3's vocabulary)."""


@pytest.fixture(scope="module")
def tiny(new_tiny_qwen3, qwen3_tokenizer):
    """A private tiny-qwen3 (the weight-sync test changes it and puts it back)."""
    return new_tiny_qwen3().eval(), ChatFormat.for_tokenizer(qwen3_tokenizer)


@pytest.fixture(params=sorted(BACKENDS))
def make_backend(request, tiny):
    model, chat_format = tiny
    return lambda slots=4: BACKENDS[request.param](model, chat_format, slots)


def _generate(backend, requests, seed=0, sampling=SamplingParams(temperature=0.9)):
    """Run `requests` (one turn each) to completion; {key: TurnOutput}, then release every key."""
    backend.begin(seed, sampling)
    for request in requests:
        backend.submit(request)
    outputs = {}
    while backend.has_work():
        outputs.update({turn.key: turn for turn in backend.step()})
    for request in requests:
        backend.release(request.key)
    return outputs


def _plain_logprobs(model, context, turn_ids, temperature):
    """float64 log-probs of each turn token under one plain forward over context + turn."""
    ids = torch.tensor([context + turn_ids])
    with torch.no_grad():
        logits = (
            model(input_ids=ids).logits[0, len(context) - 1 : -1].double()
        )  # (n, V): position i predicts turn_ids[i]
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(turn_ids)[:, None]).squeeze(1)


def test_turns_carry_the_sampled_ids_and_raw_logprobs_of_a_plain_forward(make_backend, tiny):
    """Guards against log-probs from the wrong position, temperature or weights (π_old must be exact)."""
    model, _ = tiny
    backend = make_backend()
    outputs = _generate(backend, [TurnRequest(key, prompt, 6) for key, prompt in enumerate(PROMPTS)])
    assert sorted(outputs) == [0, 1, 2, 3]
    for key, turn in outputs.items():
        assert len(turn.token_ids) == len(turn.logprobs) >= 1
        expected = _plain_logprobs(model, PROMPTS[key], turn.token_ids, 0.9)
        assert torch.allclose(torch.tensor(turn.logprobs, dtype=torch.float64), expected, atol=1e-4), key


def test_a_continuing_episode_sees_its_whole_context(make_backend, tiny):
    """Guards against a backend that drops the generated turn or re-encodes the prefix of a continuation."""
    model, _ = tiny
    backend = make_backend()
    backend.begin(3, SamplingParams(temperature=0.9))
    backend.submit(TurnRequest(0, PROMPTS[0], 4))
    (first,) = _drain(backend)
    observation = list(range(500, 509))
    backend.submit(TurnRequest(0, observation, 4))
    (second,) = _drain(backend)
    backend.release(0)
    context = PROMPTS[0] + first.token_ids + observation
    expected = _plain_logprobs(model, context, second.token_ids, 0.9)
    assert torch.allclose(torch.tensor(second.logprobs, dtype=torch.float64), expected, atol=1e-4)


def _drain(backend):
    outputs = []
    while backend.has_work():
        outputs.extend(backend.step())
    return outputs


def test_finish_reasons_follow_the_tokens(make_backend, tiny):
    """Guards against turns that run past a stop, or stop reasons that disagree with the tokens."""
    _, chat_format = tiny
    backend = make_backend()
    outputs = _generate(
        backend,
        [TurnRequest(key, prompt, 3 + key) for key, prompt in enumerate(PROMPTS)],
        seed=11,
        sampling=SamplingParams(temperature=1.5),
    )
    for key, turn in outputs.items():
        assert not any(chat_format.ends_turn(turn.token_ids[:i]) for i in range(1, len(turn.token_ids)))
        if turn.stop == "length":
            assert len(turn.token_ids) == 3 + key and not chat_format.ends_turn(turn.token_ids)
        elif turn.stop == "stop_token":
            assert turn.token_ids[-1] in chat_format.stop_token_ids
        else:
            assert turn.stop == "tool_call" and chat_format.ends_turn(turn.token_ids)


def test_an_episode_samples_the_same_turn_alone_or_in_a_batch(make_backend):
    """Guards against randomness shared across episodes: determinism must not depend on the batch, and
    the episodes of one prompt must not draw the same numbers."""
    together = _generate(make_backend(), [TurnRequest(key, prompt, 6) for key, prompt in enumerate(PROMPTS)], seed=5)
    alone = _generate(make_backend(), [TurnRequest(2, PROMPTS[2], 6)], seed=5)
    assert alone[2].token_ids == together[2].token_ids
    again = _generate(make_backend(), [TurnRequest(key, prompt, 6) for key, prompt in enumerate(PROMPTS)], seed=5)
    assert {k: t.token_ids for k, t in again.items()} == {k: t.token_ids for k, t in together.items()}
    group = _generate(
        make_backend(), [TurnRequest(key, PROMPTS[0], 6) for key in range(4)], seed=5
    )  # one prompt, G = 4
    assert len({tuple(turn.token_ids) for turn in group.values()}) > 1, "a group's episodes must draw their own samples"


def test_sync_weights_samples_from_the_new_weights_and_bumps_the_version(make_backend, tiny):
    """Guards against sampling from stale weights after an update (a peer shipped this for months)."""
    model, _ = tiny
    backend = make_backend()
    assert backend.weights_version == 0
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)  # an "optimizer step" that changes every logit
        assert backend.sync_weights() == 1
        outputs = _generate(backend, [TurnRequest(0, PROMPTS[0], 5)])
        expected = _plain_logprobs(model, PROMPTS[0], outputs[0].token_ids, 0.9)
        assert torch.allclose(torch.tensor(outputs[0].logprobs, dtype=torch.float64), expected, atol=1e-4)
        assert backend.sync_weights(version=7) == 7 == backend.weights_version  # a restored checkpoint's version
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        backend.sync_weights()


def test_capacity_counts_new_episodes_and_release_frees_them(make_backend):
    """Guards against leaked slots (a long run would stall) and runs that begin over live episodes."""
    backend = make_backend(slots=2)
    backend.begin(0, SamplingParams(temperature=0.9))
    assert backend.capacity() == 2
    backend.submit(TurnRequest(0, PROMPTS[0], 2))
    backend.submit(TurnRequest(1, PROMPTS[1], 2))
    assert backend.capacity() == 0
    _drain(backend)
    with pytest.raises(RuntimeError, match="not released"):
        backend.begin(1, SamplingParams())
    with pytest.raises(RuntimeError, match="during a run"):
        backend.sync_weights()
    backend.release(0)
    assert backend.capacity() == 1
    backend.release(1)
    backend.begin(1, SamplingParams())
    assert backend.capacity() == 2


def test_an_episode_with_its_own_sampling_samples_the_same_turn_whatever_shares_its_batch(make_backend, tiny):
    """Guards against per-request sampling that leaks across a served batch: a request's seed must give
    the same reply whichever requests (other temperatures, other seeds, greedy) share its batch."""
    model, _ = tiny
    own = SamplingParams(temperature=0.8, seed=123)
    alone = _generate(make_backend(), [TurnRequest(0, PROMPTS[2], 6, sampling=own)], seed=1)
    mixed = [
        TurnRequest(0, PROMPTS[0], 6, sampling=SamplingParams(temperature=0.0, seed=9)),
        TurnRequest(1, PROMPTS[1], 6),  # the run's sampling
        TurnRequest(2, PROMPTS[2], 6, sampling=own),
        TurnRequest(3, PROMPTS[3], 6, sampling=SamplingParams(temperature=1.3, seed=123)),
    ]
    together = _generate(make_backend(), mixed, seed=77, sampling=SamplingParams(temperature=0.9))
    assert together[2].token_ids == alone[0].token_ids, "the seed alone decides, not the run seed or the key"
    expected = _plain_logprobs(model, PROMPTS[2], together[2].token_ids, 0.8)
    assert torch.allclose(torch.tensor(together[2].logprobs, dtype=torch.float64), expected, atol=1e-4)
    greedy = together[0]  # greedy in a sampled batch: the argmax at every step, T = 1 log-probs
    context = PROMPTS[0] + greedy.token_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context])).logits[0, len(PROMPTS[0]) - 1 : -1]
    assert logits.argmax(-1).tolist() == greedy.token_ids
    run_default = _generate(
        make_backend(), [TurnRequest(1, PROMPTS[1], 6)], seed=77, sampling=SamplingParams(temperature=0.9)
    )
    assert together[1].token_ids == run_default[1].token_ids


def test_a_turn_stops_at_the_first_stop_string(make_backend, tiny):
    """Guards against stop strings that are missed, or that end a turn after the text went past them."""
    _, chat_format = tiny
    free = _generate(make_backend(), [TurnRequest(0, PROMPTS[1], 10)], seed=4)[0]
    texts = [chat_format.decode_turn(free.token_ids[: i + 1]) for i in range(len(free.token_ids))]
    stop_text = next(
        chat_format.decode_turn([token]) for token in free.token_ids[2:] if chat_format.decode_turn([token]).strip()
    )
    first = next(i for i, text in enumerate(texts) if stop_text in text)
    stopped = _generate(
        make_backend(), [TurnRequest(0, PROMPTS[1], 10, stop_strings=("never appears \u2983", stop_text))], seed=4
    )[0]
    assert stopped.stop == "stop_string" and stopped.token_ids == free.token_ids[: first + 1]
    assert stop_text in chat_format.decode_turn(stopped.token_ids)

import os

# Tests never reach a hub: every model comes from the package, the cache, or is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gc

import pytest


def pytest_collection_finish(session):
    """Freeze what importing the test modules built (torch, transformers, trl: ~370k objects).

    A full gc.collect() walks every tracked object: 0.15-0.25 s each with these libraries loaded,
    which made the per-test collection below 80 of the 95 s of the 348 tensor-only tests. Frozen
    objects are never walked again; they are module-level and live as long as the session anyway.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test():
    """Models, runners and KV caches often sit in reference cycles; free them between tests."""
    yield
    gc.collect()

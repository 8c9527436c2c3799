"""Other trainers as backends for our configs: TRL's GRPOTrainer (trl_backend.py); the caller picks one.

TRL_EXPERIMENTAL_SILENCE is set here, before trl_backend.py imports trl at its top: importing TRL's
GRPOTrainer imports `trl.experimental`, which warns on import, and the trainer warns again when it is
given our environment_factory or rollout_func, unless the variable is set."""

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

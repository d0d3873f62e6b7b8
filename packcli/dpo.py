"""Kept for existing users: the code lives in ``packcli.train.dpo``."""

from packcli.train.dpo import *  # noqa: F403

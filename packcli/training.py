"""Kept for existing users: the code lives in ``packcli.train.checks``."""

from packcli.train.checks import *  # noqa: F403

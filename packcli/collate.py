"""Kept for existing users: the code lives in ``packcli.train.collate``."""

from packcli.train.collate import *  # noqa: F403

"""packcli: turn raw fine-tuning data into packed, trainer-ready shards."""

__version__ = "0.1.0"

"""The Ray engine: tokenizing and writing on a Ray cluster, the driver moving metadata only."""

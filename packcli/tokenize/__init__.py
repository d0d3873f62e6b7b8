"""Records to token ids and label masks.

The encoder, chat templates, assistant spans, splitting, the worker and the tokenize stage.
"""

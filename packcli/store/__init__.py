"""The token store on disk (segments read by offset) and the tokenization cache around it."""

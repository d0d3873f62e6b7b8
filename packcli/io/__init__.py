"""Finding and reading the inputs: paths, globs, streams and the Hub; the readers of each file kind; URIs."""

"""Command-line interface (``jaxdistill ...``); thin wrappers over library calls."""

"""gpudeck's face: the Textual console and the `gpudeck` command line."""

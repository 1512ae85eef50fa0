"""One module per CLI subcommand, each a thin parser plus a callable function."""

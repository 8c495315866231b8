"""The `trnf` command line: thin Typer functions over one library module each."""

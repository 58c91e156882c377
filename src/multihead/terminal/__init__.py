"""What the commands print: language choice, line breaking and help texts (the CLI's, not the core's)."""

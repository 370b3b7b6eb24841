"""`python -m hydrant.cli` runs the `hydrant` command (tests start servers this way)."""

from hydrant.cli.main import main

main()

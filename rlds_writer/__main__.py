"""`python -m rlds_writer`: the command-line tool."""

from rlds_writer.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m packtool` runs the CLI."""

from packtool.cli import entry

if __name__ == "__main__":
    entry()

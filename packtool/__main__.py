"""`python -m packtool` runs the CLI."""

from packtool.cli import main

if __name__ == "__main__":
    main()

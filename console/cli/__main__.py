"""``python -m console.cli``: the ``schedtui`` command."""

from console.cli.main import run

if __name__ == "__main__":
    run()

"""Small command-line helpers."""

import os


def print_user_dir() -> None:
    """Print the directory to pass as ``--user-dir`` (``fairseq-train --user-dir $(deepnmt-user-dir)``)."""
    print(os.path.dirname(os.path.abspath(__file__)))

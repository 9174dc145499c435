"""The command line (`kops`): app.py holds the commands' map."""

from knowledgeops.cli.app import main

__all__ = ["main"]

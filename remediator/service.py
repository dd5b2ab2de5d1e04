"""Placeholder: filled in by the remediator work (issue 4)."""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise SystemExit("not implemented yet")

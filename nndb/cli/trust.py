"""``nndb trust DIR``: nndb then reads DIR/.nndbrc at start (gdb's auto-load safe-path)."""
from __future__ import annotations

import click

from ..errors import NndbError
from .common import fail


@click.command("trust")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Trust even the filesystem root, a top-level directory, "
                                            "a mount point or the home directory.")
def trust(directory, force):
    """Trust DIR (and the directories under it): nndb then reads DIR/.nndbrc
    at start (gdb's auto-load safe-path)."""
    from ..commands.trust import trust as add_trusted, trust_file
    try:
        d = add_trusted(directory, force=force, warn=lambda m: click.echo(m, err=True))
    except NndbError as e:
        fail(e)
    click.echo(f"nndb: trusted {d} (listed in {trust_file()})")

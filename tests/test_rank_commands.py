"""``rank [N]``, ``--ranks all|LIST`` and the trailing ``rank N`` of the
points are in the one command table (help, completion, docs/commands.md's
reference); in one process they say plainly that there is one process."""
import pytest

from conftest import example, nndb
from nndb.commands import TABLE
from nndb.commands.rankspec import OnRanks, chosen, split_ranks, split_suffix
from nndb.errors import CommandError


@pytest.fixture
def one_process(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)


def test_the_table_parses_ranks_options_and_suffixes():
    cmd, value = TABLE.parse("p --ranks all $step * 10")
    assert cmd.name == "print" and isinstance(value, OnRanks) and value.spec == "all"
    assert TABLE.parse("where --ranks 0,1")[1] == OnRanks("0,1", None)
    assert TABLE.parse("stats grad --ranks=all")[1] == OnRanks("all", ("grad", None))
    assert TABLE.parse("list --ranks 1")[1].spec == "1"
    cmd, value = TABLE.parse("watch loss > 0.7 rank 1")
    assert cmd.name == "watch" and value.spec == "1"
    assert TABLE.parse("break step 3 rank 0")[1].spec == "0"
    assert not isinstance(TABLE.parse("break step 3")[1], OnRanks)
    assert not isinstance(TABLE.parse("p rank")[1], OnRanks)          # (a variable named rank)
    with pytest.raises(CommandError, match="--ranks takes all or a list of ranks"):
        TABLE.parse("where --ranks")
    assert split_ranks("x --ranks all") == ("all", "x") and split_suffix("loss > 0 rank 12") == ("12", "loss > 0")
    assert chosen("all", [0, 1]) == [0, 1] and chosen("1", [0, 1]) == [1]
    with pytest.raises(CommandError, match=r"no rank 2 \(ranks: 0, 1\)"):
        chosen("0,2", [0, 1])
    with pytest.raises(CommandError, match="--ranks takes all or a list of ranks"):
        chosen("x", [0, 1])


def test_rank_in_one_process_says_there_is_one(one_process):
    assert TABLE.dispatch(None, "rank") == "one process: rank 0 of 1"
    assert TABLE.dispatch(None, "rank 0") == "one process: rank 0 of 1"
    with pytest.raises(CommandError, match="^no rank 1: one process: rank 0 of 1$"):
        TABLE.dispatch(None, "rank 1")
    with pytest.raises(CommandError, match="rank takes a rank number"):
        TABLE.parse("rank x")


def test_a_rank_on_its_own_says_whose_launcher_it_runs_under(monkeypatch):
    """A rank of ``nndb run --nproc-per-node N --batch`` (nndb's own launcher, its front's
    socket in the environment) runs the -e commands by itself: it said "plain torchrun:
    no prompt holds the other ranks", which it was not under."""
    from nndb.commands.rankspec import one_process as said
    for k, v in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(k, v)
    for k in ("NNDB_FRONT_SOCKET", "NNDB_FRONT_PUBLISH", "NNDB_FRONT_FROM_STORE"):
        monkeypatch.delenv(k, raising=False)
    assert "plain torchrun" in said()
    monkeypatch.setenv("NNDB_FRONT_SOCKET", "/tmp/nndb-x/front.sock")
    assert said() == ("rank 1 of 2, on its own (--batch: each rank runs the -e/-x commands by itself; "
                      "without --batch, nndb run --nproc-per-node N holds one prompt for all)")


def test_help_names_rank_and_the_ranks_options():
    rows = TABLE.help().rows
    assert ("ranks", "rank", "Show the rank you look at, or switch to rank N (several ranks).") in rows
    assert TABLE.help("p")[0] == "usage: print[/full] [--ranks all|LIST] EXPR"
    assert TABLE.help("where")[0] == "usage: where [--ranks all|LIST]"
    for word in ("watch", "break"):
        assert 'a trailing "rank N"' in " ".join(TABLE.help(word)).replace("\n", " ")
    assert {c.name for c in TABLE.commands if c.ranks == "option"} == {"print", "stats", "where", "list"}


def test_in_a_run_of_one_process_ranks_mean_rank_0(tmp_path):
    r = nndb("run", "--batch", "-q", "--trace", str(tmp_path / "t.h5"),
             "-e", "break step 1 rank 0", "-e", "continue", "-e", "rank", "-e", "p --ranks all $step * 10",
             "-e", "where --ranks 0", "-e", "help rank", "-e", "p --ranks 1 $step",
             example("mlp.py"), "--steps", "3", cwd=str(tmp_path))
    out = r.stdout
    assert "Breakpoint 1, step 1 finished" in out
    assert "one process: rank 0 of 1\n10\n" in out          # rank; p --ranks all: this process's answer
    assert "mlp.py(51)main()" in out.split("\n10\n", 1)[1]  # where --ranks 0
    assert "usage: rank [N]" in out
    # a rank that is not there: one line, batch mode's exit code for a bad command
    assert r.stderr.strip() == "-e 'p --ranks 1 $step': no rank 1 (ranks: 0): this session is one process: rank 0 of 1"
    assert r.returncode == 2

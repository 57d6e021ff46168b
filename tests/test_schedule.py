"""tests/schedule.py: the suite's work goes out slowest unit first, a group's
tests together, and a module-scoped fixture's tests in one group."""
import pytest

import schedule


class _Def:
    def __init__(self, scope):
        self.scope = scope


class _Info:
    def __init__(self, scopes):
        self.name2fixturedefs = {f"f{i}": [_Def(s)] for i, s in enumerate(scopes)}


class _Item:
    def __init__(self, nodeid, group=None, scopes=()):
        self._nid = nodeid
        self.marks = [pytest.mark.xdist_group(group).mark] if group else []
        self._fixtureinfo = _Info(scopes)

    nodeid = property(lambda self: self._nid)

    def iter_markers(self, name):
        return iter([m for m in self.marks if m.name == name])

    def add_marker(self, mark):
        self.marks.append(mark.mark)


def test_the_slowest_unit_goes_first_and_a_group_stays_together():
    items = [_Item("a.py::t1"), _Item("m.py::g1", group="m"), _Item("b.py::t2"), _Item("m.py::g2", group="m"),
             _Item("c.py::new")]
    seconds = {"a.py::t1": 5.0, "m.py::g1": 3.0, "m.py::g2": 3.5, "b.py::t2": 20.0}
    schedule.order(items, seconds, pytest.mark.xdist_group)
    # b (20 s), the group m (6.5 s), a (5 s), then the unknown test (UNKNOWN: 1 s)
    assert [i.nodeid for i in items] == ["b.py::t2", "m.py::g1", "m.py::g2", "a.py::t1", "c.py::new"]


def test_a_module_fixtures_tests_share_one_group():
    items = [_Item("x.py::a", scopes=("function", "module")), _Item("x.py::b", scopes=("module",)),
             _Item("x.py::c", scopes=("function",)), _Item("y.py::d", group="mine", scopes=("module",))]
    schedule.order(items, {}, pytest.mark.xdist_group)
    groups = {i.nodeid: [m.args[0] for m in i.iter_markers("xdist_group")] for i in items}
    assert groups == {"x.py::a": ["x.py"], "x.py::b": ["x.py"], "x.py::c": [], "y.py::d": ["mine"]}


def test_durations_are_read_from_pytests_report():
    text = ("============ slowest durations ============\n"
            "12.50s setup    tests/test_x.py::test_a[p@q]\n"
            "3.00s call     tests/test_x.py::test_a[p@q]\n"
            "0.20s teardown tests/test_x.py::test_b@grp\n"
            "0.40s call     tests/test_x.py::test_b@grp\n"
            "0.10s call     tests/test_x.py::test_c\n")
    assert schedule.from_report(text) == {"tests/test_x.py::test_a[p@q]": 15.5, "tests/test_x.py::test_b": 0.6}


def test_a_groups_node_ids_carry_the_group_where_pytest_reads_them_from_id():
    nodeid = pytest.importorskip("_pytest.nodeid", reason="pytest < 9.2: xdist tags node ids itself")

    class _Real(_Item):
        def __init__(self, nid, **kw):
            super().__init__(nid, **kw)
            self._id = nodeid.NodeId.parse(nid)

        nodeid = property(lambda self: str(self._id))      # (as pytest >= 9.2 has it)

    items = [_Real("x.py::t[1]", group="g"), _Real("x.py::u")]
    schedule.order(items, {}, pytest.mark.xdist_group)
    assert sorted(i.nodeid for i in items) == ["x.py::t[1]@g", "x.py::u"]

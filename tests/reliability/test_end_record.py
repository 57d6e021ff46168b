"""The run's end record (the trace's status, the exit code, the --report)
says what happened whatever the script did to the exception printer:
stderr closed or gone, an excepthook that raises, a SystemExit whose
message cannot be printed."""
import json
import textwrap

import pytest

from conftest import nndb, python
from nndb.store.reader import TraceReader

STEPS = textwrap.dedent('''
    import sys, torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')

CASES = {
    "stderr closed, then raise": "sys.stderr.close()\nraise ValueError('boom')\n",
    "stderr None, then raise": "sys.stderr = None\nraise ValueError('boom')\n",
    "fd 2 closed, then raise": "import os\nos.close(2)\nraise ValueError('boom')\n",
    "an excepthook that raises": "def hook(*a):\n    raise RuntimeError('hook')\nsys.excepthook = hook\n"
                                 "raise ValueError('boom')\n",
    "stderr closed, then sys.exit(message)": "sys.stderr.close()\nsys.exit('bye')\n",
    "stderr closed, then Ctrl-C": "sys.stderr.close()\nraise KeyboardInterrupt\n",
}
EXPECT = {"stderr closed, then sys.exit(message)": ("failed", 1),
          "stderr closed, then Ctrl-C": ("interrupted", 1)}         # (Python: 1 when it cannot print it)


@pytest.mark.parametrize("case", list(CASES))
def test_the_end_record_says_what_happened(tmp_path, case):
    script = tmp_path / "s.py"
    script.write_text(STEPS + CASES[case])
    trace, report = tmp_path / "t.h5", tmp_path / "r.json"
    r = nndb("run", "--batch", "--nx", "--rules", "none", "--trace", str(trace), "--report", str(report),
             str(script), cwd=str(tmp_path))
    status, code = EXPECT.get(case, ("failed", 1))
    assert r.returncode == code, (r.returncode, r.stderr)
    assert python(str(script), cwd=str(tmp_path)).returncode == code      # as plain Python
    with TraceReader(str(trace)) as reader:
        assert reader.status == status, reader.end
        assert reader.n_steps == 3
    assert report.exists(), r.stderr
    assert json.loads(report.read_text())["exit"]["code"] == code

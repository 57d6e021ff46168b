"""python -m nndb"""
from .run.safepath import drop_start_dir

drop_start_dir()        # (first: before click, torch or numpy can be looked up there)
from .cli import main   # noqa: E402

main()

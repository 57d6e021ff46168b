"""python -m nndb"""
from .cli import main

main()

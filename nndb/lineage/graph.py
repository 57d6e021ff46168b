"""Questions asked of one step's lineage (the dict ``StepLineage.as_dict``
gives and the trace stores): who made a tensor (``backward_trace``), who used
it (``consumers``), and the module- or op-level graph of the step (text or
Graphviz dot).  Plain functions over plain data: they return lines."""
from __future__ import annotations

import os
from typing import Optional

from .oprecord import (DTYPES, FILE, INS, LINE, MODULE, NODE, OP, OP_STATS, OUTS,  # noqa: F401
                       PHASE, SHAPES, op_name)


class StepGraph:
    def __init__(self, data: dict):
        self.step = data.get("step")
        self.ops = data["ops"]
        self.labels = {int(k): v for k, v in data.get("labels", {}).items()}
        self.stats = {int(k): v for k, v in data.get("stats", {}).items()}
        self.producer: dict = {}
        self.consumers: dict = {}
        for i, op in enumerate(self.ops):
            for t in op[OUTS]:
                self.producer[t] = i
            for t in op[INS]:
                self.consumers.setdefault(t, []).append(i)

    # -- names ---------------------------------------------------------------------------
    def resolve(self, name: str) -> Optional[int]:
        """A tensor id from a recorded name: t12, loss, a parameter, a module (its last output)."""
        if name.startswith("t") and name[1:].isdigit():
            return int(name[1:]) if int(name[1:]) in self.producer or int(name[1:]) in self.labels else None
        for want in (name, f"param {name}", f"act {name}"):
            hits = [t for t, lab in self.labels.items() if lab == want]
            if hits:
                return max(hits)
        return None

    def names(self) -> list:
        return sorted({lab.split(" ", 1)[-1] for lab in self.labels.values() if lab != "input"})

    def label(self, tid: int) -> str:
        lab = self.labels.get(tid)
        return f"t{tid}" + (f" ({lab})" if lab else "")

    @staticmethod
    def where(op) -> str:
        parts = []
        if op[MODULE]:
            parts.append(f"module {op[MODULE]}")
        if op[NODE]:
            parts.append(op[NODE])
        if op[FILE]:
            parts.append(f"{os.path.relpath(op[FILE]) if os.path.isabs(op[FILE]) else op[FILE]}:{op[LINE]}")
        return ", ".join(parts)

    def describe_op(self, i: int) -> str:
        op = self.ops[i]
        args = ", ".join(self.label(t) for t in op[INS])
        shape = "x".join(map(str, op[SHAPES][0])) if op[SHAPES] else ""
        st = self.stats.get(i)
        if st:
            st = dict(zip(OP_STATS, st))
        stats = f"  min {st['min']:.4g} max {st['max']:.4g} mean {st['mean']:.4g}" + \
            (f" nan {st['nan']} inf {st['inf']}" if st['nan'] or st['inf'] else "") if st else ""
        return f"{op_name(op)}({args}) [{op[PHASE]}] {shape or 'scalar'} {op[DTYPES][0] if op[DTYPES] else ''}"\
            f"  {self.where(op)}{stats}".rstrip()

    # -- traces ------------------------------------------------------------------------------
    def backward_trace(self, tid: int, depth: int = 6) -> list:
        lines, seen = [], set()

        def walk(t: int, level: int) -> None:
            pad = "  " * level
            i = self.producer.get(t)
            if i is None:
                lab = self.labels.get(t, "leaf: made before this step or outside nndb's view")
                lines.append(f"{pad}t{t} = {lab}")
                return
            if t in seen:
                lines.append(f"{pad}{self.label(t)} (shown above)")
                return
            seen.add(t)
            lines.append(f"{pad}{self.label(t)} = {self.describe_op(i)}")
            if level + 1 >= depth:
                if self.ops[i][INS]:
                    lines.append(f"{pad}  ... (--depth {depth} reached)")
                return
            for a in self.ops[i][INS]:
                walk(a, level + 1)

        walk(tid, 0)
        return lines

    def consumer_trace(self, tid: int, depth: int = 6) -> list:
        lines, seen = [self.label(tid)], set()

        def walk(t: int, level: int) -> None:
            for i in self.consumers.get(t, []):
                pad = "  " * level
                if i in seen:
                    lines.append(f"{pad}-> op {i} {op_name(self.ops[i])} (shown above)")
                    continue
                seen.add(i)
                outs = ", ".join(self.label(o) for o in self.ops[i][OUTS]) or "nothing"
                lines.append(f"{pad}-> {outs} = {self.describe_op(i)}")
                if level + 1 >= depth:
                    continue
                for o in self.ops[i][OUTS]:
                    walk(o, level + 1)

        walk(tid, 1)
        if len(lines) == 1:
            lines.append("  (no operation of this step used it)")
        return lines

    # -- graphs ------------------------------------------------------------------------------
    def module_edges(self, phase: str = "forward") -> tuple:
        """(modules in order of first use, [(from, to)] in order): data flow between modules."""
        order, edges = [], []

        def node_of(t: int) -> Optional[str]:
            if self.labels.get(t) == "input":
                return "input"             # the batch, however the script made it
            i = self.producer.get(t)
            if i is None:
                return None
            op = self.ops[i]
            return op[MODULE] if op[PHASE] == phase else None

        for op in self.ops:
            if op[PHASE] != phase or not op[MODULE]:
                continue                   # the script's own code: not a module of the graph
            m = op[MODULE]
            if m not in order:
                order.append(m)
            for t in op[INS]:
                src = node_of(t)
                if src is not None and src != m and (src, m) not in edges:
                    if src == "input" and src not in order:
                        order.insert(0, src)
                    edges.append((src, m))
        return order, edges

    def module_graph(self) -> list:
        order, edges = self.module_edges()
        lines = [f"step {self.step}: {len(order)} node(s), {len(edges)} edge(s) (forward data flow between modules)"]
        lines += [f"  {a} -> {b}" for a, b in edges]
        return lines

    def op_graph(self) -> list:
        lines = [f"step {self.step}: {len(self.ops)} operation(s)"]
        for i, op in enumerate(self.ops):
            srcs = sorted({self.producer[t] for t in op[INS] if t in self.producer})
            lines.append(f"  {i:4d} {op_name(op):<24} {op[PHASE]:<9} {op[MODULE] or '-':<16} "
                         f"<- {', '.join(map(str, srcs)) or '-'}")
        return lines

    def dot(self, ops: bool = False) -> str:
        out = [f'digraph "step {self.step}" {{', "  rankdir=TB;", "  node [shape=box];"]
        if ops:
            for i, op in enumerate(self.ops):
                out.append(f'  op{i} [label="{op_name(op)}\\n{op[MODULE] or ""}"];')
                for t in op[INS]:
                    if t in self.producer:
                        out.append(f"  op{self.producer[t]} -> op{i};")
        else:
            order, edges = self.module_edges()
            for m in order:
                out.append(f'  "{m}";')
            for a, b in edges:
                out.append(f'  "{a}" -> "{b}";')
        out.append("}")
        return "\n".join(out) + "\n"

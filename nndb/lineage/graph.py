"""Questions asked of one step's lineage (the dict ``StepLineage.as_dict``
gives and the trace stores): who made a tensor (``backward_trace``), who used
it (``consumers``), and the module- or op-level graph of the step (text or
Graphviz dot).  Plain functions over plain data: they return lines."""
from __future__ import annotations

import os
from typing import Optional

from ..text import fmt
from .oprecord import (DTYPES, FILE, INS, LINE, MODULE, NODE, OP, OP_STATS, OUTS,  # noqa: F401
                       PHASE, SHAPES, op_name)

DOT_STAMP = "// nndb lineage graph"    # a dot file's first line: nndb.run.paths lets nndb write over it


# Of this many inputs made the same way (or more), one is followed, the others counted.
GROUP_AT = 3


class StepGraph:
    def __init__(self, data: dict):
        self.step = data.get("step")
        self.ops = data["ops"]
        self.labels = {int(k): v for k, v in data.get("labels", {}).items()}
        self.stats = {int(k): v for k, v in data.get("stats", {}).items()}
        # modules whose forward ran other modules: their own ops are functional
        # code (F.relu between two layers), of no child module
        self.containers = set(data.get("containers", ()))
        self._structures: Optional[dict] = None     # structure -> tensors made so (made_like)
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

    def namesakes(self, tid: int) -> list:
        """The step's tensors labelled as ``tid`` is, in order: the loss of each ``backward()`` of
        a step of several (gradient accumulation's micro-batches), each call's output of a module
        called more than once; ``resolve`` gives the last."""
        lab = self.labels.get(tid)
        return sorted(t for t, other in self.labels.items() if other == lab) if lab else [tid]

    def names(self) -> list:
        return sorted({lab.split(" ", 1)[-1] for lab in self.labels.values()
                       if lab != "input" and not lab.endswith(" (view)")})

    def functional(self, op) -> bool:
        """An op of a module's own forward code, outside its child modules."""
        return op[MODULE] in self.containers

    def module_of(self, op) -> str:
        """How an op's module is shown: the module, or 'functional in M'."""
        if not op[MODULE]:
            return "-"
        return f"functional in {op[MODULE]}" if self.functional(op) else op[MODULE]

    def label(self, tid: int) -> str:
        lab = self.labels.get(tid)
        return f"t{tid}" + (f" ({lab})" if lab else "")

    def where(self, op) -> str:
        parts = []
        if op[MODULE]:
            parts.append(f"functional, in {op[MODULE]}'s forward" if self.functional(op) else f"module {op[MODULE]}")
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
        stats = f"  min {fmt(st['min'])} max {fmt(st['max'])} mean {fmt(st['mean'])}" + \
            (f" nan {st['nan']} inf {st['inf']}" if st['nan'] or st['inf'] else "") if st else ""
        return f"{op_name(op)}({args}) [{op[PHASE]}] {shape or 'scalar'} {op[DTYPES][0] if op[DTYPES] else ''}"\
            f"  {self.where(op)}{stats}".rstrip()

    # -- traces ------------------------------------------------------------------------------
    def _op_key(self, t: int):
        i = self.producer.get(t)
        if i is None:
            return ("leaf", self.labels.get(t))
        op = self.ops[i]
        return (op[OP], op[MODULE], op[FILE], op[LINE])

    def structure(self, t: int):
        """What makes two tensors "the same structure": the op, module and
        line that made them and those that made its inputs (the time steps of
        a recurrent layer; a ReLU module reused after two different layers is
        not)."""
        i = self.producer.get(t)
        if i is None:
            return None
        return (self._op_key(t), tuple(self._op_key(a) for a in self.ops[i][INS]))

    def made_like(self, key) -> int:
        """How many tensors of the step have this structure."""
        if self._structures is None:
            self._structures = {}
            for t in self.producer:
                k = self.structure(t)
                self._structures[k] = self._structures.get(k, 0) + 1
        return self._structures.get(key, 0)

    def backward_trace(self, tid: int, depth: int = 6) -> list:
        """The ops that made ``tid``, as an indented tree.  Repeated structure
        is grouped: of GROUP_AT or more inputs made the same way (a recurrent
        layer's time steps stacked), the first is followed and one line counts the
        others; a tensor made the same way as one of its descendants already
        shown on the way here (a recurrence: h[t] from h[t-1]) is one line."""
        lines, seen = [], set()

        def walk(t: int, level: int, path: dict) -> None:
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
            key = self.structure(t)
            if key in path:
                lines.append(f"{pad}{self.label(t)} = {self.describe_op(i)}")
                lines.append(f"{pad}  ... repeats the structure of t{path[key]} above (a recurrence: "
                             f"{self.made_like(key)} tensors of this step are made so), not followed")
                return
            lines.append(f"{pad}{self.label(t)} = {self.describe_op(i)}")
            ins = self.ops[i][INS]
            if level + 1 >= depth:
                if ins:
                    lines.append(f"{pad}  ... (--depth {depth} reached)")
                return
            groups: dict = {}
            for a in ins:
                k = self.structure(a)
                if k is not None and a not in seen:
                    groups.setdefault(k, []).append(a)
            groups = {k: v for k, v in groups.items() if len(v) >= GROUP_AT}
            inner = {**path, key: t}
            for a in ins:
                k = self.structure(a)
                same = groups.get(k, [a]) if k is not None else [a]
                if a not in same or same[0] != a:
                    continue           # one of a group: counted below its first
                walk(a, level + 1, inner)
                if len(same) > 1:
                    op = self.ops[self.producer[a]]
                    lines.append(f"{pad}  ... and {len(same) - 1} more made the same way "
                                 f"({_ids(same[1:])}: {op_name(op)}, {self.where(op)})")

        walk(tid, 0, {})
        return lines

    def consumer_trace(self, tid: int, depth: int = 6) -> list:
        """The ops that used ``tid``, and theirs, ``depth`` levels of them (as
        backward_trace's: depth 1 is the ops that took ``tid`` itself; the levels
        were counted from 2, and --depth 1 and 2 both showed one)."""
        lines, seen = [self.label(tid)], set()

        def walk(t: int, level: int) -> None:
            for i in self.consumers.get(t, []):
                pad = "  " * (level + 1)
                if i in seen:
                    lines.append(f"{pad}-> op {i} {op_name(self.ops[i])} (shown above)")
                    continue
                seen.add(i)
                outs = ", ".join(self.label(o) for o in self.ops[i][OUTS]) or "nothing"
                lines.append(f"{pad}-> {outs} = {self.describe_op(i)}")
                if level + 1 >= depth:
                    if any(self.consumers.get(o) for o in self.ops[i][OUTS]):
                        lines.append(f"{pad}  ... (--depth {depth} reached)")
                    continue
                for o in self.ops[i][OUTS]:
                    walk(o, level + 1)

        walk(tid, 0)
        if len(lines) == 1:
            lines.append("  (no operation of this step used it)")
        return lines

    # -- graphs ------------------------------------------------------------------------------
    def module_edges(self, phase: str = "forward") -> tuple:
        """(modules in order of first use, [(from, to)] in order): data flow
        between modules.  A functional op (of a container's own forward, such
        as ``F.relu`` between two layers) is no node: data passes through it
        from the modules that made its inputs (``edge_via`` names such ops)."""
        order, edges = [], []
        self.edge_via: dict = {}       # (from, to) -> [functional ops on the way, in order]
        sources: dict = {}             # tensor id -> [(module, [functional op indices])]

        def sources_of(t: int) -> list:
            if t in sources:
                return sources[t]
            sources[t] = []            # (a cycle cannot happen; this guards a corrupt record)
            if self.labels.get(t) == "input":
                out = [("input", [])]  # the batch, however the script made it
            else:
                i = self.producer.get(t)
                if i is None or self.ops[i][PHASE] != phase or not self.ops[i][MODULE]:
                    out = []           # the script's own code, or made before the step
                elif self.functional(self.ops[i]):
                    out, seen = [], set()
                    for a in self.ops[i][INS]:
                        for m, via in sources_of(a):
                            if m not in seen:
                                seen.add(m)
                                out.append((m, via + [i]))
                else:
                    out = [(self.ops[i][MODULE], [])]
            sources[t] = out
            return out

        for op in self.ops:
            if op[PHASE] != phase or not op[MODULE] or self.functional(op):
                continue               # the script's own code and functional ops: no node
            m = op[MODULE]
            if m not in order:
                order.append(m)
            for t in op[INS]:
                for src, via in sources_of(t):
                    if src == m:
                        continue
                    if (src, m) not in edges:
                        if src == "input" and src not in order:
                            order.insert(0, src)
                        edges.append((src, m))
                    names = self.edge_via.setdefault((src, m), [])
                    for i in via:
                        if i not in names:
                            names.append(i)
        return order, edges

    def via_names(self, edge) -> list:
        """The functional ops data passes through on a module edge (after module_edges)."""
        names = []
        for i in getattr(self, "edge_via", {}).get(edge) or ():
            n = op_name(self.ops[i])
            if n not in names:
                names.append(n)
        return names

    def via_text(self, edge) -> str:
        names = self.via_names(edge)
        if not names:
            return ""
        containers = []
        for i in self.edge_via[edge]:
            if self.ops[i][MODULE] not in containers:
                containers.append(self.ops[i][MODULE])
        return f"via {', '.join(names)} (functional, in {' and '.join(containers)}'s forward)"

    def module_graph(self) -> list:
        order, edges = self.module_edges()
        lines = [f"step {self.step}: {len(order)} node(s), {len(edges)} edge(s) (forward data flow between modules)"]
        for e in edges:
            via = self.via_text(e)
            lines.append(f"  {e[0]} -> {e[1]}" + (f"  {via}" if via else ""))
        return lines

    def op_graph(self) -> list:
        lines = [f"step {self.step}: {len(self.ops)} operation(s)"]
        for i, op in enumerate(self.ops):
            srcs = sorted({self.producer[t] for t in op[INS] if t in self.producer})
            lines.append(f"  {i:4d} {op_name(op):<24} {op[PHASE]:<9} {self.module_of(op):<20} "
                         f"<- {', '.join(map(str, srcs)) or '-'}")
        return lines

    def dot(self, ops: bool = False) -> str:
        out = [f"{DOT_STAMP} of step {self.step}", f'digraph "step {self.step}" {{', "  rankdir=TB;", "  node [shape=box];"]
        if ops:
            for i, op in enumerate(self.ops):
                out.append(f'  op{i} [label="{op_name(op)}\\n{self.module_of(op) if op[MODULE] else ""}"];')
                for t in op[INS]:
                    if t in self.producer:
                        out.append(f"  op{self.producer[t]} -> op{i};")
        else:
            order, edges = self.module_edges()
            for m in order:
                out.append(f'  "{m}";')
            for a, b in edges:
                via = self.via_text((a, b))
                out.append(f'  "{a}" -> "{b}"' + (f' [label="{", ".join(self.via_names((a, b)))}"]' if via else "") + ";")
        out.append("}")
        return "\n".join(out) + "\n"


def _ids(tids: list, most: int = 4) -> str:
    shown = ", ".join(f"t{t}" for t in tids[:most])
    return shown + (f", ... t{tids[-1]}" if len(tids) > most else "")

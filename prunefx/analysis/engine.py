"""Walk an fx graph in topological order and let op rules label, couple and freeze channels.

The engine owns the atom table and the records a rewrite needs later:
- module members: (module, role) -> atoms, e.g. ("layer1.0.conv1", OUT);
- parameter slices: (parameter, dim) -> atoms, the single truth of what gets sliced;
- graph constants: literal ints in the graph that count channels (``view(b, 512, -1)``);
- equal-count ties: channel segments that must keep equally many channels (``chunk(2)``);
- inside: parameter dims whose channels exist only inside a leaf's forward (attention heads), masked by the oracle
  in the weights.
"""

from __future__ import annotations

import linecache
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.atoms import AtomTable
from prunefx.analysis.divisions import Division, Where
from prunefx.analysis.divisions import resolve as resolve_divisions
from prunefx.analysis.inferred import Inference, infer
from prunefx.analysis.labels import Lab, ScalarRef, SizeRef, size_sources
from prunefx.analysis.outputs import drop_keys
from prunefx.analysis.parametrized import parametrization_problem, read_problem
from prunefx.analysis.products import Product, resolve
from prunefx.analysis.roles import Kind, Literal, ModuleRole, ParamDim, RecordKey, Role
from prunefx.analysis.rules._registry import RULES, OpRegistry
from prunefx.capture.concrete import SizeDecision
from prunefx.capture.record import capture_info
from prunefx.capture.trace import SOURCE_KEY
from prunefx.capture.values import VALUE_KEY


@dataclass
class Record:
    """Atoms along one sliceable thing: a module role, a parameter dim, or a graph constant."""

    kind: Kind
    name: str  # module / parameter qualified name, or fx node name for constants
    role: Role  # OUT, IN, CHANNEL, Normalized(j) / ParamDim(d) / Literal(path)
    atoms: np.ndarray
    module_type: str = ""
    owner: str = ""  # module whose forward contains a graph constant
    source: object = field(default=None, repr=False)  # the label array a constant was recorded for (identity)


@dataclass
class EqualCount:
    segments: list[np.ndarray]
    why: str


@dataclass
class EngineState:
    atoms: AtomTable = field(default_factory=AtomTable)
    records: dict[RecordKey, Record] = field(default_factory=dict)
    ties: list[EqualCount] = field(default_factory=list)
    notes: list[tuple[np.ndarray, str]] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)  # node name -> description of the op without a rule
    inferred: dict[str, str] = field(default_factory=dict)  # node name -> op and its probed channel map
    products: list[Product] = field(default_factory=list)  # reshapes splitting / merging channel dims
    batch_tags: list[np.ndarray] = field(default_factory=list)  # channels that index slices of a contraction
    inside: set[RecordKey] = field(default_factory=set)  # parameter dims whose channels no graph edge carries
    decisions: list[Decision] = field(default_factory=list)  # Python decisions on sizes, checked by build_groups
    divisions: list[Division] = field(default_factory=list)  # ``c // heads`` sizes, decided after the walk
    followers: dict[Where, list[Where]] = field(default_factory=dict)  # ``heads * (c // heads)``


@dataclass
class Decision:
    """A Python decision the trace took on sizes (see prunefx.capture.concrete), with the labels of what it read."""

    size: SizeDecision
    record: dict[str, Any]  # the tracer's entry: node, use, at ("file:line"), code, value
    labels: dict[fx.Node, Lab]  # label of each tensor the decision reads


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _flatten(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in _flatten(item)]
    if isinstance(x, slice):
        return _flatten([x.start, x.stop, x.step])
    return [x]


def describe_target(node: fx.Node, module: nn.Module | None) -> str:
    if node.op == "call_module":
        return f"{type(module).__module__}.{type(module).__qualname__} (module '{node.target}')"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    target = node.target
    mod = getattr(target, "__module__", None) or ""
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', repr(target)))}".lstrip(".")


class Ctx:
    """What a rule sees: its node, argument values and labels, and the operations it may perform."""

    def __init__(self, engine: Engine, node: fx.Node, module: nn.Module | None) -> None:
        self.engine = engine
        self.state = engine.state
        self.node = node
        self.module = module
        self.args = node.args
        self.kwargs = node.kwargs

    # ---- reading -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.node.target if self.node.op == "call_module" else self.node.name

    @property
    def out(self) -> Any:
        """The node's recorded output value (meta tensors, ints, tuples)."""
        return self.node.meta.get(VALUE_KEY)

    def value(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            return a.meta.get(VALUE_KEY)
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def aval(self, a: Any) -> Any:
        """Analysis value of an argument: Lab for tensors, SizeRef/int for sizes, tuples recursively."""
        if isinstance(a, fx.Node):
            return self.engine.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.aval(x) for x in a)
        if isinstance(a, dict):
            return {k: self.aval(v) for k, v in a.items()}
        return a

    def lab(self, a: Any) -> Lab:
        v = self.aval(a)
        if isinstance(v, Lab):
            return v
        t = self.value(a)
        return Lab.none(t.dim() if isinstance(t, torch.Tensor) else 0)

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        """Argument ``i`` (or keyword ``key``); a traced integer (``dim=boxes.dim()``) as its recorded value."""
        a = self.args[i] if len(self.args) > i else self.kwargs.get(key, default)
        if isinstance(a, fx.Node) and type(a.meta.get(VALUE_KEY)) is int:
            return a.meta[VALUE_KEY]
        return a

    def is_tensor(self, a: Any) -> bool:
        return isinstance(self.value(a), torch.Tensor)

    def shape(self, a: Any) -> tuple[int, ...]:
        return tuple(self.value(a).shape)

    def owner(self) -> str:
        stack = self.node.meta.get("nn_module_stack") or {}
        return next(reversed(stack.values()))[0] if stack else ""

    # ---- acting --------------------------------------------------------------------------------
    def fresh(self, n: int) -> np.ndarray:
        return self.state.atoms.new(n)

    def union(self, a: np.ndarray, b: np.ndarray, reason: str | None = None) -> None:
        self.state.atoms.union(a, b, reason or f"coupled with channels that are kept at {self.where()}")

    def freeze(self, what: Any, reason: str) -> None:
        """Freeze the classes of an atom array, a Lab, or every Lab inside a structure."""
        for x in _flatten(what) if not isinstance(what, np.ndarray) else [what]:
            if isinstance(x, Lab):
                x = x.atoms()
            elif isinstance(x, (SizeRef, ScalarRef)) and x.sources:  # a channel count flowing into an opaque op
                x = np.concatenate(x.sources)
            if isinstance(x, np.ndarray):
                self.state.atoms.freeze(x, f"{reason} ({self.where()})")

    def freeze_values(self, operands: Any, only_floats: bool = False) -> None:
        """Scalars in ``operands`` computed from channel counts are used as numbers (``x * (c ** -0.5)``, a fill
        value): pruning would change them and no rule rewrites them, so the channels they were read from are frozen.
        ``only_floats``: freeze only for non-int scalars (ints may be sizes the op's rule has checked)."""
        self.freeze_numbers_read([a for a in _flatten((operands,)) if isinstance(a, fx.Node)], only_floats)

    def freeze_numbers_read(self, nodes: list[fx.Node], only_floats: bool) -> None:
        """:meth:`freeze_values` for the values of these nodes."""
        for a in nodes:
            held = self.engine.env.get(a)
            if type(held) is Lab:  # a tensor's labels: no number in it (most operands: checked once per node)
                continue
            for v in _flatten(held):
                if isinstance(v, ScalarRef if only_floats else (SizeRef, ScalarRef)) and v.sources:
                    self.state.atoms.freeze(
                        np.concatenate(v.sources),
                        f"a number computed from this channel count (node '{a.name}') is used as a value by "
                        f"node '{self.node.name}'{self.source()}: pruning would change it",
                    )

    def source(self) -> str:
        """`` at file:line: `code` `` of the model line that made this node ('' when unknown)."""
        src = self.node.meta.get(SOURCE_KEY)
        if not src:
            return ""
        code = linecache.getline(src[0], src[1]).strip()
        return f" at {src[0]}:{src[1]}" + (f": `{code}`" if code else "")

    def inexact(self, atoms: np.ndarray, reason: str) -> None:
        self.state.atoms.mark_inexact(atoms, f"{reason} ({self.where()})")

    def where(self) -> str:
        return f"node '{self.node.name}'"

    def member(self, role: ModuleRole, atoms: np.ndarray, name: str | None = None) -> None:
        """Record that ``role`` (OUT, IN, CHANNEL, Normalized(j)) of a module (this node's, by default) has these
        channels."""
        name = name or self.name
        module = self.module if self.module is not None and name == self.name else self.engine.modules.get(name)
        self._record(Kind.MODULE, name, role, atoms, module_type=type(module).__name__ if module is not None else "")

    def product(self, grid: np.ndarray, factors: list[tuple[int, np.ndarray]], literal: list[bool]) -> None:
        """Positions ``grid`` of a flat dim go when any factor dim's index goes; one factor becomes the unit after
        the walk (see :mod:`prunefx.analysis.products`)."""
        self.state.products.append(Product(grid, tuple(factors), tuple(literal), f"reshape at {self.where()}"))

    def divide(self, blocks: np.ndarray, out: np.ndarray, at: Where) -> None:
        """``out``'s count is a width // k, laid out as ``blocks`` (k, len(out)), k the literal at ``at``: per-block
        offsets or whole blocks, decided after the walk (:mod:`prunefx.analysis.divisions`)."""
        self.state.divisions.append(Division(blocks, out, at, f"size at {self.where()}"))

    def tag_batch(self, atoms: np.ndarray | None) -> None:
        """These channels index independent slices of a contraction (attention heads of q.k^T)."""
        if atoms is not None:
            self.state.batch_tags.append(np.asarray(atoms))

    def param(self, qualname: str, dim: int, atoms: np.ndarray) -> None:
        """Record that dim ``dim`` of parameter/buffer ``qualname`` is indexed by these channels."""
        owner, _, attr = qualname.rpartition(".")
        problem = parametrization_problem(self.engine.modules.get(owner), attr)
        if problem is not None:  # the rewrite could not slice it and keep what it computes
            self.freeze(atoms, f"{qualname}: {problem}")
        self._record(Kind.PARAM, qualname, ParamDim(dim), atoms)

    def inside(self, qualname: str, dim: int, atoms: np.ndarray) -> None:
        """As :meth:`param`, for channels that live only inside a leaf module's forward (the heads of
        nn.MultiheadAttention): no graph edge carries them, so the oracle masks them by zeroing these positions of
        the original's parameter."""
        self.param(qualname, dim, atoms)
        self.state.inside.add(RecordKey(Kind.PARAM, qualname, ParamDim(dim)))

    def constant(self, path: tuple, atoms: np.ndarray, at: tuple[str, str] | None = None) -> None:
        """A literal at ``("args", i, j...)`` in this node's arguments that equals the number of kept positions;
        ``at``: (node name, owner) of an earlier node holding it instead (``b * num_heads`` feeding a reshape)."""
        if not path or path[0] != "args" or not all(isinstance(p, int) for p in path[1:]):
            raise ValueError(f"a graph literal is addressed as ('args', i, ...), got {path!r}")
        name, owner = at or (self.node.name, self.owner())
        self._record(Kind.CONST, name, Literal(tuple(path[1:])), atoms, owner=owner)

    def equal_count(self, segments: list[np.ndarray], why: str) -> None:
        self.state.ties.append(EqualCount([np.asarray(s) for s in segments], f"{why} ({self.where()})"))

    def note(self, atoms: np.ndarray, text: str) -> None:
        self.state.notes.append((np.asarray(atoms), text))

    def _record(
        self, kind: Kind, name: str, role: Role, atoms: np.ndarray, *, explain: bool = True, **extra: str
    ) -> None:
        key = RecordKey(kind, name, role)
        source = atoms
        atoms = np.asarray(atoms, dtype=np.int64)
        if explain:
            self.state.atoms.explain(atoms)
        rec = self.state.records.get(key)
        if rec is None:
            self.state.records[key] = Record(kind, name, role, atoms, source=source, **extra)
        elif len(rec.atoms) != len(atoms):
            self.state.atoms.freeze(np.concatenate([rec.atoms, atoms]), f"{name} {role} used with different widths")
        else:  # a module called at several places: the same weight slice serves every call
            self.state.atoms.union(rec.atoms, atoms, f"coupled with channels that are kept at {self.where()}",
                                   explain=explain)


class Engine:
    """Runs the rules over a shape-annotated GraphModule."""

    def __init__(
        self,
        gm: fx.GraphModule,
        registry: OpRegistry = RULES,
        free_outputs: tuple[str, ...] = (),
        modules: dict[str, nn.Module] | None = None,
    ) -> None:
        self.gm = gm
        self.free_outputs = free_outputs
        self.registry = registry
        self.state = EngineState()
        self.env: dict[fx.Node, Any] = {}
        # The user's modules by name: a GraphModule holds only the leaves it calls (inside plain containers), and
        # a torch.export graph none; owners of functional layers and of literals are looked up here.
        self.modules = {**dict(gm.named_modules()), **(modules or {})}
        self._read_params: dict[RecordKey, str] = {}  # param dims labelled by a get_attr, and the node that read them
        lifted = set(capture_info(gm).lifted_constants)
        self.auto_leaves = set(capture_info(gm).auto_leaves)  # leaves made because their code is data-dependent
        self.tensors = {
            n for n, _ in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False))
        } - lifted

    def run(self) -> EngineState:
        for node in self.gm.graph.nodes:
            self.env[node] = self._visit(node)
        self._collect_decisions()
        self._resolve_divisions()  # its unions explain channels too
        self._freeze_unexplained()
        self._resolve_products()
        self._drop_lone_literals()
        return self.state

    def _resolve_divisions(self) -> None:
        nodes = {n.name: n for n in self.gm.graph.nodes}

        def constant(at: Where, atoms: np.ndarray) -> None:
            name, path, owner = at
            Ctx(self, nodes[name], None).constant(path, atoms, at=(name, owner))

        resolve_divisions(self.state.atoms, self.state.divisions, self.state.followers, constant)

    def _resolve_products(self) -> None:
        records = self.state.records
        consts = [r.atoms for r in records.values() if r.kind is Kind.CONST]
        done = resolve(self.state.atoms, self.state.products, self.state.batch_tags, consts)
        # A literal that sized a factor which did not become the unit never changes: it belongs to no group.
        dropped = {id(a) for p, k in done for j, (_, a) in enumerate(p.factors) if j != k}
        for key in [k for k, r in records.items() if r.kind is Kind.CONST and id(r.source) in dropped]:
            del records[key]

    def _drop_lone_literals(self) -> None:
        """Drop the literals whose channels no layer or parameter shares."""
        # such a literal (a mask's ones(n, n), a zero state's batch dim) never changes: it belongs to no group
        records, atoms = self.state.records, self.state.atoms
        literals = [k for k, r in records.items() if r.kind is Kind.CONST]
        if not literals:
            return
        root_of = atoms.find(np.arange(atoms.size, dtype=np.int64))
        held = np.zeros(atoms.size, dtype=bool)  # per class root: some layer or parameter holds it
        for arr in {id(r.atoms): r.atoms for r in records.values() if r.kind is not Kind.CONST}.values():
            held[root_of[arr[arr >= 0]]] = True
        for key in literals:
            arr = records[key].atoms
            if not held[root_of[arr[arr >= 0]]].any():
                del records[key]

    def _collect_decisions(self) -> None:
        """The tracer's size decisions that read a labelled dim: whether pruning flips them is known per group."""
        nodes = {n.name: n for n in self.gm.graph.nodes}
        for rec in capture_info(self.gm).decisions:
            node = nodes.get(rec["node"])
            if node is None:  # removed by a pass after tracing: nothing reads it any more
                continue
            size = SizeDecision(node, rec["use"], lambda n: n.meta.get(VALUE_KEY))
            labels = {n: lab for n in size.reads if isinstance(lab := self.env.get(n), Lab) and lab.labeled()}
            if labels:
                self.state.decisions.append(Decision(size, rec, labels))

    def _freeze_unexplained(self) -> None:
        """A parameter dim read in forward that no rule related to anything is not a channel: freeze it."""
        atoms = self.state.atoms
        for key, node_name in self._read_params.items():
            rec = self.state.records[key]
            lost = atoms.unexplained(rec.atoms)
            if lost.any():
                atoms.freeze(
                    rec.atoms[lost],
                    f"dim {key.role.dim} of '{key.name}' is read in forward (node '{node_name}') but no op rule "
                    "says how its positions are used",
                )

    def _visit(self, node: fx.Node) -> Any:
        val = node.meta.get(VALUE_KEY)
        if node.op == "placeholder":
            return _unlabeled(val)
        if node.op == "get_attr":
            return self._get_attr(node, val)
        if node.op == "output":
            ctx = Ctx(self, node, None)
            ctx.freeze(drop_keys(ctx.aval(node.args[0]), self.free_outputs), "model output")
            return None
        module = self.modules.get(node.target) if node.op == "call_module" else None
        if node.op == "call_module":
            rule = self.registry.for_module(module)
        elif node.op == "call_function":
            rule = self.registry.for_function(node.target)
        else:
            rule = self.registry.for_method(node.target)
        ctx = Ctx(self, node, module)
        if rule is None and isinstance(node.target, type) and issubclass(node.target, (tuple, list, dict)):
            return _container(ctx)  # tuple(...) / NamedTuple(...) / dict(...) built in forward
        if rule is None:
            return self._unknown(ctx, val)
        try:
            out = rule(ctx)
        except Exception as exc:  # noqa: BLE001 - a rule that crashes on an input freezes what it touches
            return self._rule_failed(ctx, val, exc)
        if any(isinstance(v, torch.Tensor) for v in _flatten(val)):
            # unknown means loud: a float/bool computed from a channel count can only be a value here
            ctx.freeze_numbers_read(node.all_input_nodes, only_floats=True)
        return out

    def _get_attr(self, node: fx.Node, val: Any) -> Any:
        if not isinstance(val, torch.Tensor):
            return val
        if str(node.target) not in self.tensors:  # a constant fx lifted out of forward (torch.tensor(...))
            return Lab.none(val.dim())
        # A parameter/buffer read in forward is a producer along each of its dims: its positions are
        # sliced exactly when the channels it meets are (a learned pos-embedding, a layer scale).
        dims = []
        ctx = Ctx(self, node, None)
        problem = read_problem(self.modules, str(node.target))  # export reads spectral_norm's weight and u, v
        for d, n in enumerate(val.shape):
            if n > 1:
                atoms = self.state.atoms.new(n)
                if problem is not None:
                    self.state.atoms.freeze(atoms, f"{node.target}: {problem}")
                # Recorded, not explained: only the ops that read the tensor can say what its positions are.
                ctx._record(Kind.PARAM, str(node.target), ParamDim(d), atoms, explain=False)
                self._read_params.setdefault(RecordKey(Kind.PARAM, str(node.target), ParamDim(d)), node.name)
                dims.append(atoms)
            else:
                dims.append(None)
        return Lab(tuple(dims))

    def _rule_failed(self, ctx: Ctx, val: Any, exc: Exception) -> Any:
        """As for an op without a rule: every channel the node's inputs carry frozen, its output unlabeled."""
        # unions the rule made before raising stay: they are relations it had established, and freezing the
        # inputs freezes their groups whole
        inputs = [a for a in _flatten((ctx.args, dict(ctx.kwargs))) if isinstance(a, fx.Node)]
        desc = describe_target(ctx.node, ctx.module)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        self.state.unknown[ctx.node.name] = f"{desc} (its rule raised {type(exc).__name__})"
        ctx.freeze([self.env[a] for a in inputs], f"the rule for {desc} raised {why}")
        return _unlabeled(val)

    def _unknown(self, ctx: Ctx, val: Any) -> Any:
        inputs = [a for a in _flatten((ctx.args, dict(ctx.kwargs))) if isinstance(a, fx.Node)]
        labs = [self.env[a] for a in inputs]
        touches = any(isinstance(x, Lab) for x in _flatten(labs))
        touches = touches or any(isinstance(x, torch.Tensor) for x in _flatten(val))
        if not touches:  # pure Python arithmetic on sizes and the like
            return size_arith(ctx, val, labs)
        desc = describe_target(ctx.node, ctx.module)
        # an automatic leaf's code branches on values: a probe on random ones says nothing about the model's
        probe = ctx.node.op != "call_module" or ctx.node.target not in self.auto_leaves
        # a size read from channels passed in (op(x, x.size(1))): after the cut the op gets another number than the
        # probe gave it, so what it does with it is unknown
        probe = probe and not any(size_sources(x) for x in _flatten(labs))
        if probe and isinstance(val, torch.Tensor) and any(isinstance(x, Lab) and x.labeled() for x in _flatten(labs)):
            try:
                lab, found = infer(ctx, desc)  # probed on real values; the oracle still checks every plan
            except Exception as exc:  # noqa: BLE001 - a probe that crashes is a refusal, never the analysis' end
                lab, found = None, Inference((), failure=f"the probe raised {type(exc).__name__}: {exc}")
            if lab is not None:
                self.state.inferred[ctx.node.name] = f"{desc}: {found.describe()}"
                return lab
            finding = found.failure or "; ".join(f"input {i} dim {d}: {why}" for i, d, why in found.refused)
            desc_why = f"no rule for {desc} (probed: {finding})" if finding else f"no rule for {desc}"
        else:
            desc_why = f"no rule for {desc}"
        self.state.unknown[ctx.node.name] = desc
        ctx.freeze(labs, desc_why)
        return _unlabeled(val)


def _container(ctx: Ctx) -> Any:
    cls = ctx.node.target
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return cls(*(ctx.aval(a) for a in ctx.args), **{k: ctx.aval(v) for k, v in ctx.kwargs.items()})
    if issubclass(cls, dict):
        return cls(*(ctx.aval(a) for a in ctx.args), **{k: ctx.aval(v) for k, v in ctx.kwargs.items()})
    return cls(*(ctx.aval(a) for a in ctx.args))


def _unlabeled(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return Lab.none(val.dim())
    if isinstance(val, torch.Size):
        return tuple(val)
    if isinstance(val, tuple) and hasattr(val, "_fields"):  # namedtuple outputs (GoogLeNetOutputs)
        return type(val)(*(_unlabeled(v) for v in val))
    if isinstance(val, (list, tuple)):
        return type(val)(_unlabeled(v) for v in val)
    return val


def size_arith(ctx: Ctx, val: Any, labs: list[Any]) -> Any:
    """Ints computed from sizes keep their provenance (``c // 2`` stays tied to ``c``'s channels)."""
    if isinstance(val, tuple) and len(labs) == 2 and all(isinstance(x, (tuple, list)) for x in labs):
        if ctx.node.target in (operator.add, operator.iadd):  # (b,) + window + (-1,): keep each size's origin
            return (*labs[0], *labs[1])
    refs = [x for x in _flatten(labs) if isinstance(x, SizeRef)]
    scalars = [x for x in _flatten(labs) if isinstance(x, ScalarRef)]
    if isinstance(val, int) and not isinstance(val, bool) and (refs or scalars):
        same = _identity_operand(ctx, labs)
        if same is not None:  # 1 * c, c // 1, c + 0 (einops seeds its products with 1): c, whatever form it has
            return same
        sources = tuple(s for r in (*refs, *scalars) for s in r.sources)
        if scalars:  # int(math.sqrt(c)): no form a rule can follow
            return SizeRef(val, sources)
        whole = _undivided(ctx, labs)
        if whole is not None:  # heads * (c // heads) is c again, whether heads stays or follows the kept blocks
            return whole
        exact = ctx.node.target in (operator.pos, int) and len(refs) == 1 and refs[0].exact
        return SizeRef(val, sources, exact, **({} if exact else _arith_form(ctx, val, labs)))
    if isinstance(val, (float, bool, complex)):  # math.sqrt(c), c ** -0.5, c > 8: provenance kept
        sources = tuple(s for r in (*refs, *scalars) for s in size_sources(r))
        if sources:
            return ScalarRef(val, sources)
    return val


_NEUTRAL = {operator.mul: 1, operator.imul: 1, operator.add: 0, operator.iadd: 0}
_RIGHT_NEUTRAL = {**_NEUTRAL, operator.floordiv: 1, operator.sub: 0, operator.isub: 0}


def _identity_operand(ctx: Ctx, labs: list[Any]) -> SizeRef | None:
    """The SizeRef operand of an op with a literal neutral element (``1 * c``, ``c // 1``), which returns it as is."""
    raw = ctx.args
    if len(labs) != 2 or len(raw) != 2 or ctx.kwargs:
        return None
    for i, table in ((0, _NEUTRAL), (1, _RIGHT_NEUTRAL)):  # raw[i] the literal, the other operand the size
        other = labs[1 - i]
        if _is_literal_int(raw[i]) and table.get(ctx.node.target) == raw[i] and isinstance(other, SizeRef):
            return other
    return None


def _arith_form(ctx: Ctx, val: int, labs: list[Any]) -> dict[str, Any]:
    """How ``val`` follows its operands' sizes, where a rule can keep it valid after pruning (see SizeRef)."""
    target, raw = ctx.node.target, ctx.args
    if len(labs) != 2 or len(raw) != 2:
        return {}
    a, b = labs
    if target in (operator.mul, operator.imul):
        if all(isinstance(x, SizeRef) and x.sources and (x.exact or x.product) for x in labs):
            if val == int(np.prod([len(s) for x in labs for s in x.sources])):
                return {"product": True}
        for i, (lit, other) in enumerate(((a, b), (b, a))):
            if _is_literal_int(raw[i]) and lit > 0 and isinstance(other, SizeRef) and not other.sources:
                return {"literal": (ctx.node.name, ("args", i), ctx.owner(), lit)}
    if target is operator.floordiv and isinstance(a, SizeRef) and a.exact and len(a.sources) == 1:
        if _is_literal_int(raw[1]) and b > 0 and len(a.sources[0]) % b == 0:
            return {"div": b, "div_at": (ctx.node.name, ("args", 1), ctx.owner())}
    return {}


def _undivided(ctx: Ctx, labs: list[Any]) -> SizeRef | None:
    """``k * (c // k)`` with both ``k`` literals: exactly ``c``; the factor is recorded to follow the divisor."""
    if ctx.node.target not in (operator.mul, operator.imul) or len(labs) != 2 or len(ctx.args) != 2 or ctx.kwargs:
        return None
    for i in (0, 1):
        lit, ref = ctx.args[i], labs[1 - i]
        if _is_literal_int(lit) and isinstance(ref, SizeRef) and ref.div == lit and ref.div_at is not None:
            ctx.state.followers.setdefault(ref.div_at, []).append((ctx.node.name, ("args", i), ctx.owner()))
            return SizeRef(lit * ref.value, ref.sources, exact=True)
    return None


def _is_literal_int(a: Any) -> bool:
    return isinstance(a, int) and not isinstance(a, bool)

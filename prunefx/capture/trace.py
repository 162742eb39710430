"""Capture a model as a torch.fx GraphModule, robustly.

    gm = prunefx.trace(model, (torch.randn(1, 3, 224, 224),))

What plain ``torch.fx.symbolic_trace`` lacks and this tracer adds:
- only as many placeholders as example inputs; later parameters keep their defaults (``mask=None``), and
  ``forward(self, x, *args, **kwargs)`` gets empty ``*args``/``**kwargs``;
- structured example inputs (a list of images, a dict of tensors): one placeholder per leaf, the structure rebuilt
  around them, so ``for img in images`` iterates a Python list; the GraphModule takes the same structure;
- ``len()`` / ``list()`` / iteration over ``chunk(n)`` and ``split([sizes])`` results (known arity);
- leaf modules: a registry users extend by type (:func:`register_leaf`), and an automatic fallback that
  makes a submodule whose forward cannot be traced a leaf, retries, and records which and why;
- Python decisions on sizes (``if x.size(1) != c:``, ``range(x.shape[1])``) follow the example inputs
  (:mod:`prunefx.capture.concrete`); those that read a size into Python are recorded with the node they read
  (``capture_info(gm).decisions``), so the analysis freezes the channels whose pruning would change them;
- submodule names that are no Python identifiers (``a"b``, ``if``) are quoted in the generated code;
- a failure that no leaf can fix (tensor-valued control flow in the root forward) raises
  :class:`TraceFailure` naming the source line and the fixes.
The model is never modified; ``training`` flags changed for tracing are restored.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import linecache
import operator
import sys
import traceback
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx import graph as fx_graph
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo
from torch.utils._pytree import tree_flatten, tree_unflatten

from prunefx import _plugins
from prunefx._state import attributes_kept, submodules
from prunefx.capture.concrete import ConcreteValues, NoConcreteValue, as_number
from prunefx.capture.inputs import positional, structured
from prunefx.capture.record import CaptureInfo, set_capture_info
from prunefx.errors import TraceFailure

_LEAF_TYPES: set[type[nn.Module]] = set()
_MAX_AUTO_LEAVES = 64
SOURCE_KEY = "prunefx_source"  # node.meta: (file, line, function) of the model code that made the node
_TORCH_DIR = str(torch.__file__).rsplit("/", 1)[0] + "/"


# torch.nn modules that fx keeps as leaves (it never enters torch.nn) but whose forward is plain calls of layers
# the analysis knows: the Transformer layers, built on nn.MultiheadAttention, Linear and LayerNorm. Traced in
# training mode, their inference fast paths are never taken in the graph.
_TRACED_TORCH_TYPES: frozenset[type[nn.Module]] = frozenset({
    nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder, nn.TransformerDecoder,
    nn.Transformer,
})


def register_leaf(*types: type[nn.Module]) -> None:
    """Treat modules of these types as opaque leaves when tracing (their channels are frozen
    unless an op rule for the type is registered with :func:`prunefx.register_rule`)."""
    for t in types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"register_leaf expects nn.Module subclasses, got {t!r}")
        _LEAF_TYPES.add(t)


_CAPTURE_SETTINGS: list[Callable[[nn.Module], AbstractContextManager]] = []


def register_capture_setting(setting: Callable[[nn.Module], AbstractContextManager]) -> None:
    """Enter ``setting(model)`` around every capture of a model, fx and export alike (a plugin's switch of what the
    forward builds, e.g. transformers' KV cache off); it must leave the model as it found it."""
    _CAPTURE_SETTINGS.append(setting)


@contextmanager
def capture_settings(model: nn.Module) -> Iterator[None]:
    """The registered capture settings of ``model``, all entered while the block runs."""
    with ExitStack() as stack:
        for setting in _CAPTURE_SETTINGS:
            stack.enter_context(setting(model))
        yield


_LEAF_FUNCTIONS: set[tuple[ModuleType, str]] = set()


def register_leaf_function(module: ModuleType, name: str) -> None:
    """Record calls of ``module.name`` as one graph node while tracing (like ``torch.fx.wrap``, for a library's
    function reached as a module attribute, e.g. ``box_ops.batched_nms``: its Python loops over data stay out)."""
    if not callable(getattr(module, name, None)):
        raise TypeError(f"{module.__name__}.{name} is not a function")
    _LEAF_FUNCTIONS.add((module, name))


@contextmanager
def _leaf_functions_recorded() -> Iterator[None]:
    originals = [(mod, name, getattr(mod, name)) for mod, name in _LEAF_FUNCTIONS]

    def recording(fn):
        def call(*args, **kwargs):
            proxy = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, fx.Proxy)), None)
            if proxy is None:
                return fn(*args, **kwargs)
            return proxy.tracer.create_proxy("call_function", fn, args, kwargs)

        return call

    try:
        for mod, name, fn in originals:
            setattr(mod, name, recording(fn))
        yield
    finally:
        for mod, name, fn in originals:
            setattr(mod, name, fn)


_FUNCTION_APPLY = torch.autograd.Function.__dict__["apply"]  # the classmethod every custom autograd.Function calls


@contextmanager
def _autograd_functions_recorded() -> Iterator[None]:
    """A custom ``torch.autograd.Function`` applied to a traced value becomes one call_function node (the analysis
    freezes it as an op without a rule): handed an fx Proxy, its native ``apply`` crashes the interpreter."""
    applies: dict[type, Any] = {}

    def apply(cls, *args, **kwargs):
        proxy = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, fx.Proxy)), None)
        if proxy is None:
            return _FUNCTION_APPLY.__get__(None, cls)(*args, **kwargs)
        if cls not in applies:
            applies[cls] = _applied(cls)
        return proxy.tracer.create_proxy("call_function", applies[cls], args, kwargs)

    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = _FUNCTION_APPLY


def _applied(cls: type) -> Any:
    """``cls.apply`` as a plain function named after the class (a graph's target, run after tracing too)."""

    def fn(*args, **kwargs):
        return _FUNCTION_APPLY.__get__(None, cls)(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = f"{cls.__qualname__.replace('.', '_')}_apply"
    fn.__module__ = cls.__module__
    return fn


def _arity(node: fx.Node) -> int | None:
    """Number of outputs of chunk/split/unbind-like nodes when it is known statically."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if node.op not in ("call_method", "call_function") or name not in (
        "chunk",
        "split",
        "split_with_sizes",
        "tensor_split",
    ):
        return None
    rest = node.args[1:]
    if name == "chunk":
        n = rest[0] if rest else node.kwargs.get("chunks")
        return n if isinstance(n, int) else None
    sizes = rest[0] if rest else node.kwargs.get("split_size_or_sections", node.kwargs.get("split_size"))
    if isinstance(sizes, (list, tuple)):  # one piece per listed size, traced sizes included
        return len(sizes) + (1 if name == "tensor_split" else 0)
    return None


class _Sizes:
    """What Python asks of a traced value: len(), int(), float(), an index; answered from the example inputs."""

    def __len__(self) -> int:
        n = _arity(self.node)
        if n is None:
            n = self.tracer.concrete_len(self)
        if n is None:
            raise fx.proxy.TraceError(
                f"len() of '{self.node.format_node()}' is not known while tracing "
                "(only chunk(n), split([sizes]) and values computed from shapes have a static length)"
            )
        return n

    def __int__(self) -> int:  # int(x.shape[1] / 2) on sizes: the example inputs decide
        return int(self.tracer.concrete_number(self, "int()"))

    def __float__(self) -> float:  # math.sqrt(num_tokens), math.ceil(...)
        return float(self.tracer.concrete_number(self, "float()", "float"))

    def __index__(self) -> int:  # range(x.shape[0]), a size used as a list index
        return int(self.tracer.concrete_number(self, "an index", "index"))

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # ``isinstance(rel_codes, torch.Tensor)`` in model code (torchvision's box coder asserts it): a traced
        # tensor says it is one. isinstance falls back to __class__ only after type(); torch's own code (fx
        # included) sees the proxy type, so fx never mistakes a proxy for a tensor constant.
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(_TORCH_DIR) or caller == __file__:
            return type(self)
        return self.tracer.concrete_class(self)


class _Proxy(_Sizes, fx.Proxy):
    def __getattr__(self, k: str) -> Any:
        if k == "ndim":  # einops' Rearrange looks its recipe up in a dict keyed by input.ndim: it must be an int
            rank = self.tracer.concrete_ndim(self)
            if rank is not None:
                return rank
        return _Attribute(self, k)  # list(img.shape): the attribute answers len() like any traced value

    def __setitem__(self, index: Any, value: Any) -> None:
        # ``boxes[:, 0] = x0``: an in-place write, recorded as operator.setitem (the graph runs it in order; the
        # analysis has no rule for it, so whatever channels it touches are frozen)
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})


class _Attribute(_Sizes, fx.proxy.Attribute):
    pass


class PrunefxTracer(fx.Tracer):
    """fx.Tracer with known-arity iteration, varargs roots, a leaf registry and failure bookkeeping."""

    def __init__(
        self, num_inputs: int | None = None, leaf_names: Sequence[str] = (), example_inputs: Sequence[Any] = ()
    ) -> None:
        super().__init__()
        self.num_inputs = num_inputs
        self.example_inputs = tuple(example_inputs)
        self._concrete: ConcreteValues | None = None
        self.specialised: dict[str, Any] = {}  # "file:line" -> the value a Python decision on sizes took
        # the decisions that read a traced value into Python, with the node read (concrete.USES names the uses)
        self.decisions: list[dict[str, Any]] = []
        self.leaf_names = set(leaf_names)
        self._stack: list[str] = []
        self.failed_in: str | None = None  # innermost traced (non-leaf) module whose forward raised
        self._entry: Any = None  # frame of trace(): the walk for a node's source line stops there

    def trace(self, root: Any, concrete_args: Any = None) -> fx.Graph:
        self._entry = sys._getframe()
        return super().trace(root, concrete_args)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        # The innermost frame outside torch and this file is the model line that made the node. A walk up
        # the live frames (not fx's record_stack_traces, which formats a whole traceback per node) costs ~us.
        frame = sys._getframe(1)
        while frame is not None and frame is not self._entry:
            file = frame.f_code.co_filename
            if not file.startswith(_TORCH_DIR) and file != __file__:
                node.meta[SOURCE_KEY] = (file, frame.f_lineno, frame.f_code.co_name)
                break
            frame = frame.f_back
        return node

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _Proxy(node, self)

    def iter(self, obj: fx.Proxy) -> Iterator:
        n = _arity(obj.node)
        if n is None:
            n = self.concrete_len(obj)
        if n is None:
            return super().iter(obj)
        return (obj[i] for i in range(n))

    # ---- concrete sizes (prunefx.capture.concrete) ---------------------------------------------------------------
    def _value(self, obj: fx.Proxy) -> Any:
        if self._concrete is None:
            if not self.example_inputs:
                raise NoConcreteValue("no example inputs to take sizes from")
            self._concrete = ConcreteValues(self.root, self.example_inputs)
        return self._concrete.value(self.graph, obj.node)

    def _record(self, value: Any, obj: fx.Proxy | None = None, use: str | None = None) -> None:
        """Note the decision at the innermost model line; ``use`` (a key of concrete.USES): one the analysis checks."""
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR) or
                                     frame.f_code.co_filename == __file__):
            frame = frame.f_back
        if frame is None:
            return
        file, line = frame.f_code.co_filename, frame.f_lineno
        self.specialised[f"{file}:{line}"] = value
        if use is not None and obj is not None:
            code = linecache.getline(file, line, frame.f_globals).strip()
            self.decisions.append({"node": obj.node.name, "use": use, "at": f"{file}:{line}", "code": code,
                                   "value": value})

    def to_bool(self, obj: fx.Proxy) -> bool:
        try:
            value = bool(as_number(self._value(obj)))
        except NoConcreteValue:
            return super().to_bool(obj)  # a condition on tensor data: the original TraceError
        self._record(value, obj, "condition")
        return value

    def concrete_number(self, obj: fx.Proxy, what: str, use: str | None = None) -> Any:
        try:
            value = as_number(self._value(obj))
        except NoConcreteValue as exc:
            node = obj.node.format_node()
            raise fx.proxy.TraceError(f"{what} of '{node}' is not known while tracing: {exc}") from exc
        self._record(value, obj, use)
        return value

    def concrete_ndim(self, obj: fx.Proxy) -> int | None:
        """The number of dims of a traced tensor, from the example inputs (None when unknown or not a tensor)."""
        try:
            value = self._value(obj)
        except NoConcreteValue:
            return None
        if not isinstance(value, torch.Tensor):
            return None
        # recorded as specialised but not as a decision: pruning changes sizes, never a tensor's number of dims
        self._record(value.dim())
        return value.dim()

    def concrete_class(self, obj: fx.Proxy) -> type:
        """torch.Tensor when the traced value is known to be a tensor, else the proxy's own type."""
        try:
            return torch.Tensor if isinstance(self._value(obj), torch.Tensor) else type(obj)
        except Exception:  # noqa: BLE001 - isinstance must not raise: an unknown value keeps the proxy type
            return type(obj)

    def concrete_len(self, obj: fx.Proxy) -> int | None:
        try:
            value = self._value(obj)
        except NoConcreteValue:
            return None
        # sizes only (``(*x.shape[:-1], -1, head_dim)``): iterating a module's output structure this way would
        # follow what the example run returned, not what the traced graph holds
        if isinstance(value, (tuple, list, torch.Size)) and all(type(v) is int for v in value):
            self._record(len(value))
            return len(value)
        if isinstance(value, torch.Tensor) and value.dim() > 0:  # rows of a tensor (per image of a batch)
            self._record(value.shape[0], obj, "len")
            return value.shape[0]
        return None

    def create_arg(self, a: Any) -> Any:
        try:
            return super().create_arg(a)
        except NotImplementedError:
            if isinstance(a, (fx.Proxy, torch.Tensor, nn.Module)):
                raise
        # An object fx has no argument form for (a helper a module cached on its first forward, e.g. torchvision's
        # LevelMapper) is a constant of the graph: held as an attribute of the root, read by a get_attr node.
        name = self.get_fresh_qualname("_prunefx_constant")
        setattr(self.root, name, a)
        return self.create_node("get_attr", name, (), {})

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or (_LEAF_TYPES and isinstance(m, tuple(_LEAF_TYPES))):
            return True
        if type(m) in _TRACED_TORCH_TYPES:
            return False
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        name = self.path_of_module(m)
        self._stack.append(name)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None and not self.is_leaf_module(m, name):
                self.failed_in = name
            raise
        finally:
            self._stack.pop()

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        fn = inspect.unwrap(root_fn)
        co = fn.__code__
        named = list(co.co_varnames[1 : co.co_argcount])
        has_var = co.co_flags & inspect.CO_VARARGS
        n = self.num_inputs
        if not is_module or n is None or concrete_args is not None or (n > len(named) and not has_var):
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        # Bind exactly the example inputs. Parameters after them keep their Python defaults (``mask=None``,
        # ``targets=None``): a placeholder there would send tracing down the ``is not None`` branch, which the
        # model never takes when called with these inputs. ``*args``/``**kwargs`` stay empty.
        names = [named[i] if i < len(named) else f"input_{i}" for i in range(n)]
        if self.structured:
            return self._structured_args(root_fn, names)
        placeholders = [self.create_proxy("placeholder", name, (), {}) for name in names]

        def bound(root, *xs):
            return root_fn(root, *xs)

        return bound, [self.root, *placeholders]

    @property
    def structured(self) -> bool:
        """Some example input is a container (list, tuple, dict) or None: its leaves become the placeholders."""
        return structured(self.example_inputs)

    def _structured_args(self, root_fn, names: list[str]):
        """One placeholder per leaf of the example inputs; forward sees the structure with proxies for tensors."""
        # The graph's code flattens the call's arguments with the example inputs' tree spec (fx's own pytree
        # codegen), so gm(images) and Interpreter.run(images) feed the placeholders in order. Non-tensor leaves
        # get a placeholder too (positions stay aligned) but forward sees their example value.
        args = []
        for name, x in zip(names, self.example_inputs, strict=True):
            leaves, spec = tree_flatten(x)
            proxies = [self.create_proxy("placeholder", f"{name}_{j}", (), {}) for j in range(len(leaves))]
            values = [p if isinstance(v, torch.Tensor) else v for p, v in zip(proxies, leaves, strict=True)]
            args.append(tree_unflatten(values, spec))
        self.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, tree_flatten(tuple(self.example_inputs))[1], None))

        def bound(root):
            return root_fn(root, *args)

        return bound, [self.root]


def _attribute_name(part: str) -> bool:
    """``part`` can be written ``obj.part`` in generated code (and names the attribute it spells)."""
    return part.isidentifier() and not keyword.iskeyword(part) and unicodedata.normalize("NFKC", part) == part


def _format_target_quoted(base: str, target: str) -> str:
    """fx's module path in generated code, with each name that is no attribute name quoted by repr."""
    for part in target.split("."):
        base = f"{base}.{part}" if _attribute_name(part) else f"getattr({base}, {part!r})"
    return base


def _fx_cannot_write(target: str) -> bool:
    """torch.fx's code for ``target`` (``self.part`` or ``getattr(self, "part")``) does not name it."""
    for part in target.split("."):
        if part.isidentifier():
            if not _attribute_name(part):  # self.if, or a name Python normalises to another
                return True
            continue
        if part.isascii() and part.isprintable() and '"' not in part and "\\" not in part:
            continue  # "0" (a Sequential index): the literal spells it; no need to parse one per module
        try:
            if ast.literal_eval(f'"{part}"') != part:  # a backslash escape
                return True
        except (SyntaxError, ValueError):  # a quote or a line break ends the literal
            return True
    return False


@contextmanager
def targets_quoted() -> Iterator[None]:
    """While the block runs, torch.fx's code generation quotes names that are not attribute names by repr."""
    plain = getattr(fx_graph, "_format_target", None)
    if plain is None:  # another torch.fx: its own formatting (trace() names the module if it fails)
        yield
        return
    fx_graph._format_target = _format_target_quoted
    try:
        yield
    finally:
        fx_graph._format_target = plain


class _QuotedTargets:
    """Code generation that quotes module and attribute names properly.

    fx writes ``getattr(self, "a"b")`` for a submodule named ``a"b`` (a SyntaxError), ``getattr(self, "e\f")`` for
    ``e\f`` (another name) and ``self.if`` for ``if``. The graph keeps the user's names, so its nodes still name the
    model's modules; only the generated source differs. Carried by the graph (copies and recompiles keep it).
    """

    def _gen_python_code(self, *args: Any, **kwargs: Any) -> Any:
        with targets_quoted():
            return super()._gen_python_code(*args, **kwargs)


class _QuotedCodeGen(_QuotedTargets, CodeGen):
    pass


class _QuotedPyTreeCodeGen(_QuotedTargets, _PyTreeCodeGen):
    pass


def quote_targets(graph: fx.Graph) -> bool:
    """Make ``graph``'s generated code valid for module and attribute names that are not Python identifiers.

    False when some name needs quoting that this graph's code generator (another torch.fx's) cannot do."""
    odd = any(_fx_cannot_write(str(n.target)) for n in graph.nodes if n.op in ("call_module", "get_attr"))
    quoted = {CodeGen: _QuotedCodeGen, _PyTreeCodeGen: _QuotedPyTreeCodeGen}.get(type(graph._codegen))
    if odd and quoted is not None:
        graph._codegen.__class__ = quoted  # same state (a pytree spec), quoted targets
    return not odd or quoted is not None


def _odd_names_failure(model: nn.Module, graph: fx.Graph, exc: Exception) -> TraceFailure:
    """The error when torch.fx cannot generate code for the module names in the graph."""
    odd = sorted({str(n.target) for n in graph.nodes
                  if n.op in ("call_module", "get_attr") and _fx_cannot_write(str(n.target))})
    return TraceFailure(
        f"cannot trace {type(model).__name__}: torch.fx cannot write code for the submodule name(s) "
        f"{', '.join(map(repr, odd[:3]))} ({type(exc).__name__}: {exc}); register the submodule under a name that is "
        "a Python identifier (add_module('a_b', ...) instead of add_module('a\"b', ...))"
    )


@contextmanager
def module_state_kept(root: nn.Module) -> Iterator[None]:
    """Restore every submodule's attributes (added, replaced or deleted ones) and buffer values when the block ends.

    Running or tracing a forward executes its Python: a leaf caching anchors, a BatchNorm written functionally
    that does ``self.num_batches_tracked.add_(1)`` (a real tensor, not a proxy, while tracing) would leave traces.
    """
    buffers = {id(b): b for m in submodules(root) for b in m._buffers.values() if b is not None}
    values = [(b, b.detach().clone()) for b in buffers.values() if b.device.type != "meta"]
    try:
        with attributes_kept(root):
            yield
    finally:
        with torch.no_grad():
            for b, v in values:
                if not torch.equal(b, v):
                    b.copy_(v)


_VARARGS_FACTORIES = ("ones", "zeros", "empty", "rand", "randn")


@contextmanager
def _factories_take_proxy_sizes() -> Iterator[None]:
    """torch.ones(b, n) with traced sizes raises in torch's argument parser (it never reaches fx); the same call
    with the sizes as one tuple is recorded. While tracing, the factories pass traced varargs sizes as a tuple."""
    originals = {name: getattr(torch, name) for name in _VARARGS_FACTORIES}

    def packing(fn):
        def factory(*size, **kwargs):
            if len(size) > 1 and any(isinstance(s, fx.Proxy) for s in size):
                return fn(tuple(size), **kwargs)
            return fn(*size, **kwargs)

        return factory

    try:
        for name, fn in originals.items():
            setattr(torch, name, packing(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


@contextmanager
def training_mode(model: nn.Module, training: bool | None):
    """Temporarily set every module's ``training`` flag (None: leave as is); restores each flag after."""
    if training is None:
        yield
        return
    modules = submodules(model)
    saved = [m.training for m in modules]
    try:
        model.train(training)  # through train(): a module may override it (a frozen BatchNorm stays in eval)
        yield
    finally:
        for m, flag in zip(modules, saved, strict=True):
            if m.training is not flag:
                object.__setattr__(m, "training", flag)  # where nn.Module.__setattr__ ends for a flag


def _user_frame(exc: BaseException) -> str:
    """'file:line: code' of the innermost frame outside torch, for error messages."""
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):  # _TORCH_DIR ends with "/": site-packages/torchvision is the user's code here
        if not fr.filename.startswith(_TORCH_DIR) and fr.filename != __file__:
            code = (fr.line or linecache.getline(fr.filename, fr.lineno)).strip()
            return f"{fr.filename}:{fr.lineno}: {code}"
    return "<unknown location>"


def _initialise_lazy(model: nn.Module, example_inputs: Sequence[Any] | None) -> None:
    """Run one forward on the example inputs when the model has lazy (uninitialised) parameters."""
    # torch's lazy modules (nn.LazyLinear, ...) take their shapes from their first forward: that is the dry run
    # torch documents, and nothing can be traced or pruned before it.
    lazy = [n for n, p in model.named_parameters() if nn.parameter.is_lazy(p)]
    if not lazy:
        return
    if example_inputs is None:
        raise TraceFailure(f"{lazy[0]} is a lazy parameter that is not initialised yet; pass example inputs "
                           "(or run the model once) so its shape is known")
    with training_mode(model, False), torch.no_grad():
        model(*example_inputs)


def trace(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor | None = None,
    *,
    leaves: Sequence[str] = (),
    training: bool | None = None,
    auto_leaf: bool = True,
) -> fx.GraphModule:
    """Trace ``model`` into a GraphModule that shares its submodules.

    ``leaves``: qualified module names to keep opaque. ``training``: trace with every module's flag set to
    this value (restored afterwards); None keeps the current flags. ``auto_leaf``: when a submodule's
    forward cannot be traced, make it a leaf and retry. The leaves made automatically are recorded in
    ``capture_info(gm).auto_leaves`` as ``{qualified_name: reason}``.
    """
    if not isinstance(model, nn.Module):
        raise TraceFailure(f"expected a torch.nn.Module, got {type(model).__name__}; pass the model object itself")
    _plugins.activate()  # leaves registered by the model's library
    if example_inputs is not None:
        example_inputs = positional(model, example_inputs)
    _initialise_lazy(model, example_inputs)
    num_inputs = None if example_inputs is None else len(example_inputs)
    auto: dict[str, str] = {}
    with training_mode(model, training), module_state_kept(model), capture_settings(model), \
            _factories_take_proxy_sizes(), _leaf_functions_recorded(), _autograd_functions_recorded():
        while True:
            tracer = PrunefxTracer(num_inputs, [*leaves, *auto], example_inputs or ())
            try:
                graph = tracer.trace(model)
                break
            except Exception as exc:  # any tracing failure is reported or retried
                where = _user_frame(exc)
                culprit = tracer.failed_in
                if not auto_leaf or culprit is None or culprit in auto or len(auto) >= _MAX_AUTO_LEAVES:
                    raise TraceFailure(
                        f"cannot trace {type(model).__name__}: {type(exc).__name__}: {exc}\n"
                        f"  at {where}\n"
                        "  fixes: make the module that contains this line a leaf (trace(..., leaves=[name]) or "
                        "prunefx.register_leaf(Type)); wrap the offending function with torch.fx.wrap; or remove "
                        "tensor-dependent Python control flow (e.g. `if x.sum() > 0:`) from forward"
                    ) from exc
                auto[culprit] = f"{type(exc).__name__} at {where}"
        # inside the block: tensor constants fx stowed on the root (_tensor_constant0) are removed on leaving it
        # The analysis never runs the graph's Python code: it is generated on the first call (or .code), which
        # saves a tenth of an analysis. Names the quoting cannot help get the eager build and its clear error.
        cls = _LazyGraphModule if quote_targets(graph) else fx.GraphModule
        try:
            gm = cls(tracer.root, graph, type(model).__name__)
        except SyntaxError as exc:  # a name the quoting could not help (another torch.fx's code generation)
            raise _odd_names_failure(model, graph, exc) from exc
    own = {
        n for n, _ in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    }
    lifted = sorted(n for n, _ in gm.named_buffers() if n not in own)  # torch.tensor(...) constants in forward
    set_capture_info(gm, CaptureInfo(
        capture="fx", auto_leaves=auto, training=training, lifted_constants=tuple(lifted),
        specialised=tracer.specialised, decisions=tuple(tracer.decisions),
    ))
    return gm


__all__ = ["trace", "register_leaf", "register_leaf_function", "register_capture_setting", "capture_settings",
           "PrunefxTracer", "training_mode", "module_state_kept",
           "quote_targets", "targets_quoted"]

"""The config plumbing shared by the sweep spec (:mod:`phasesweep.pipeline.spec`) and the
analysis' own sections (:mod:`phasesweep.analysis.config`); owned by neither.

Both validate YAML written by a researcher, so both need the same things: the one-line
:class:`SpecError` with a bounded :func:`excerpt` of the offending value, the strict
frozen base model of a section, a YAML reader that refuses documents nested too deeply
or whose aliases expand to too many nodes before building them, the translation of a
pydantic error into a :class:`SpecError` naming the dotted key (with the closest known
key suggested), and the short names of the grid axes, which are also the ``runs``
columns the analysis groups by. It imports pydantic and PyYAML only, so the training
workers and the figures load it cheaply.
"""

from __future__ import annotations

import difflib
import re
import reprlib
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

#: Longest excerpt of an offending value in an error message (characters).
EXCERPT_CHARS = 80

_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxstring, _EXCERPT.maxother = 3, EXCERPT_CHARS, EXCERPT_CHARS


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, without building the full repr.

    Bounded in time and memory for any value (deep, cyclic or alias-shared structures
    included): ``reprlib`` stops at a few levels and a few items per level.
    """
    return _one_line(_EXCERPT.repr(value), limit)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text[: 4 * limit].split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class SpecError(ValueError):
    """An invalid spec or override. ``key`` is the dotted path, ``value`` what was given.

    The message is one line: the key, an excerpt of the value of at most
    :data:`EXCERPT_CHARS` characters, and the reason.
    """

    def __init__(self, key: str, value: Any, reason: str, what: str = "spec") -> None:
        self.key, self.value, self.reason = key, value, reason
        super().__init__(
            f"invalid {what}: {_one_line(str(key), 2 * EXCERPT_CHARS)} = {excerpt(value)}: "
            f"{_one_line(str(reason), 4 * EXCERPT_CHARS)}"
        )


class Section(BaseModel):
    # allow_inf_nan: every float of a spec is meant to be finite (an inf lr or init
    # scale would only make every trial fail after the spec was stored).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


#: What a sweep name may be: it names the store partition (``sweep=NAME`` of every table)
#: and a file name. Use ``fullmatch`` (``$`` would accept a trailing newline).
SWEEP_NAME = re.compile(r"[a-z0-9_-]+")

#: Short grid names and the dotted paths they stand for.
SHORT_NAMES: dict[str, str] = {
    "init_scale": "model.init_scale",
    "width": "model.width",
    "depth": "model.depth",
    "activation": "model.activation",
    "leaky_slope": "model.leaky_slope",
    "noise_sigma": "data.noise_sigma",
    "n_train": "data.n_train",
    "lr": "train.lr",
    "seed": "train.seed",
}


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _lookup(raw: Any, loc: tuple[Any, ...]) -> Any:
    node = raw
    for part in loc:
        if (
            isinstance(node, dict)
            and part in node
            or isinstance(node, list)
            and isinstance(part, int)
            and part < len(node)
        ):
            node = node[part]
        else:
            return None
    return node


def raise_from_validation(
    err: ValidationError, raw: Any, model: type[BaseModel], prefix: str = ""
) -> None:
    """Re-raise pydantic's first error of validating ``raw`` as ``model`` as a
    :class:`SpecError` naming key and value (and, for an unknown key, the closest known one)."""
    first = err.errors()[0]
    loc = tuple(p for p in first["loc"] if not str(p).startswith("function-"))
    # strict unions report the branch type in the location; drop those tails.
    loc = tuple(p for p in loc if p not in {"list[...]", "float", "int", "str", "bool", "none"})
    key = prefix + _dotted(loc) if loc else prefix.rstrip(".") or "<spec>"
    value = _lookup(raw, loc) if first["type"] != "extra_forbidden" else first.get("input")
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown key" + did_you_mean(
            str(loc[-1]), _fields_at(model, loc[:-1]), prefix + _dotted(loc[:-1])
        )
    raise SpecError(key, value, reason) from None


def did_you_mean(name: str, known: typing.Iterable[str] | None, prefix: str = "") -> str:
    """`` (did you mean PREFIX.MATCH?)`` for the known name closest to ``name``, else ``""``."""
    match = difflib.get_close_matches(name, list(known or ()), n=1)
    return f" (did you mean {prefix + '.' if prefix else ''}{match[0]}?)" if match else ""


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str] | None:
    """Field names of the section at ``loc`` below ``model`` (list indices skipped)."""
    for part in loc:
        if model is None:
            return None
        if not isinstance(part, int):
            field = model.model_fields.get(part)
            model = None if field is None else _model_in(field.annotation)
    return None if model is None else list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model in a field's annotation (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if found := _model_in(arg):
            return found
    return None


#: Most nesting levels of a spec's YAML (specs use a handful).
MAX_YAML_DEPTH = 64
#: Most nodes of a spec's YAML with every alias expanded (a "billion laughs" document
#: holds few nodes but expands to billions: validating or printing it never ends).
MAX_YAML_NODES = 10**6


class _YamlLoader(yaml.SafeLoader):
    """A safe loader with two changes.

    YAML 1.1 reads ``1e-3`` (no dot) as a string; in a spec it is a float. And while
    composing, it counts every node's size with its aliases expanded (a node shared
    through an alias counts each time it is used) and its depth, and stops at
    :data:`MAX_YAML_NODES` or :data:`MAX_YAML_DEPTH` before anything is expanded:
    the composed graph shares aliased nodes, so it stays as small as the text.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> node count with aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        is_alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        if self._depth >= MAX_YAML_DEPTH:
            raise _YamlLimit(f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        size = self._sizes.get(id(node))
        if size is None:
            if is_alias:  # the anchor's node is still being composed: it contains itself
                raise _YamlLimit("an alias refers to a node that contains it", mark)
            children = node.value if isinstance(node, yaml.SequenceNode) else ()
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            size = self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        if size > MAX_YAML_NODES:
            raise _YamlLimit(f"its aliases expand it to more than {MAX_YAML_NODES} nodes", mark)
        return node


class _YamlLimit(yaml.composer.ComposerError):
    """A document over :data:`MAX_YAML_DEPTH` or :data:`MAX_YAML_NODES`."""

    def __init__(self, problem: str, mark: yaml.Mark) -> None:
        super().__init__(None, None, problem, mark)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """Parse spec YAML (safe; exponent floats without a dot included).

    Raises ``yaml.YAMLError`` for malformed YAML and for documents over the limits
    of :class:`_YamlLoader`; :func:`yaml_problem` words it in one line.
    """
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # a limit below MAX_YAML_DEPTH (deep Python stack already)
        raise yaml.YAMLError(f"nested too deeply (over {MAX_YAML_DEPTH} levels?)") from None


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line saying what is wrong with a YAML document and where."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        text = f"{err.problem}{where}"
    else:
        text = str(err)
    kind = "YAML refused" if isinstance(err, _YamlLimit) else "malformed YAML"
    return f"{kind}: {' '.join(text.split())}"

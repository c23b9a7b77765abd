"""YAML from outside (a config file, an override's value) read by a bounded loader: PyYAML's SafeLoader (plain
data, no Python objects) with the aliases, the nesting, the values once aliases are expanded and the digits of an
integer bounded before anything is built, and every refusal a ConfigError naming the file and the key path
(docs/training.md, "Trust and safety")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gcc.errors import BadInput
from gcc.inputs import MAX_DEPTH, MAX_INT_DIGITS, read_text, shown
from gcc.settings import ConfigError


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A yaml error's own words, with the line and column where the file has them."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    what = " ".join(what.split())  # one line (a reader error spans two)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


# a yaml's aliases (*name) and its values, aliases expanded: beyond these it is refused before it is built (a
# kilobyte of nested aliases expands to billions of values, which every later walk of the config would visit)
MAX_YAML_ALIASES = 100
MAX_YAML_VALUES = 100_000
_STR, _MERGE = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (plain data, no Python objects) that refuses, naming the key path: more than
    MAX_YAML_ALIASES aliases, nesting deeper than gcc.inputs.MAX_DEPTH (aliases expanded; Python's recursion
    would end in a RecursionError), more than MAX_YAML_VALUES values once aliases are expanded, an alias inside
    the node it names, and a key that is not a string (`1:`, `true:`, `null:`: quote it)."""

    def __init__(self, text: str, where: str, root: tuple[str, ...] = ()):
        super().__init__(text)
        self.where, self.path, self.aliases = where, list(root), 0

    def _refuse(self, path: list[str], what: str) -> ConfigError:
        shown_path = path if len(path) <= 8 else [*path[:4], "…", *path[-3:]]
        return ConfigError(f"{self.where}: {'.'.join(shown_path) or '(top level)'}: {what}")

    def compose_node(self, parent, index):
        step = None
        if isinstance(parent, yaml.MappingNode):  # index: the key's node, None while the key itself is composed
            step = shown(index.value, 60) if isinstance(index, yaml.ScalarNode) else "?"
        elif isinstance(parent, yaml.SequenceNode):
            step = str(index)
        if step is not None and index is not None:
            self.path.append(step)
        try:
            if len(self.path) > MAX_DEPTH:
                raise self._refuse(self.path, f"nested deeper than {MAX_DEPTH} levels")
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise self._refuse(self.path, f"more than {MAX_YAML_ALIASES} aliases (*name)")
            node = super().compose_node(parent, index)
            if isinstance(parent, yaml.MappingNode) and index is None and node.tag not in (_STR, _MERGE):
                key = shown(node.value, 60) if isinstance(node, yaml.ScalarNode) else f"a {node.id}"
                raise self._refuse(self.path, f"key {key!r} is not a string (quote it)")
            return node
        finally:
            if step is not None and index is not None:
                self.path.pop()

    def compose_document(self):
        node = super().compose_document()
        self._measure(node, list(self.path), {}, set())
        return node

    def _measure(self, node, path: list[str], seen: dict, open_: set) -> tuple[int, int]:
        """(values, levels) under `node` with aliases expanded, each node measured once (aliases share nodes)."""
        if id(node) in open_:
            raise self._refuse(path, "an alias refers to a node that holds it")
        if id(node) not in seen:
            open_.add(id(node))
            if isinstance(node, yaml.MappingNode):
                children = [
                    (f"{shown(k.value, 60)}" if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value
                ]
                children += [("?", k) for k, _ in node.value]
            elif isinstance(node, yaml.SequenceNode):
                children = [(str(i), v) for i, v in enumerate(node.value)]
            else:
                children = []
            values, levels = 1, 0
            for step, child in children:
                if len(path) >= MAX_DEPTH:
                    raise self._refuse(path, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)")
                v, lv = self._measure(child, [*path, step], seen, open_)
                values, levels = values + v, max(levels, lv + 1)
                if values > MAX_YAML_VALUES:
                    raise self._refuse(path, f"more than {MAX_YAML_VALUES} values once its aliases are expanded")
            open_.discard(id(node))
            seen[id(node)] = (values, levels)
        values, levels = seen[id(node)]
        if len(path) + levels > MAX_DEPTH:
            raise self._refuse(path, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)")
        return values, levels

    def construct_yaml_int(self, node):
        """An integer of at most MAX_INT_DIGITS digits (gcc.inputs.parse_int's rule); a longer one is refused
        naming its place (PyYAML's int() would fail past 4300 digits with a ValueError)."""
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            mark = node.start_mark
            raise ConfigError(
                f"{self.where}: line {mark.line + 1}, column {mark.column + 1}: an integer of {digits} digits "
                f"(at most {MAX_INT_DIGITS}): {shown(node.value, 40)}"
            )
        return super().construct_yaml_int(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def load_yaml(text: str, where: str, invalid: str, root: tuple[str, ...] = ()) -> Any:
    """`text` read by `BoundedLoader` (key paths start at `root`); a ConfigError starting with `where` (a refusal)
    or `invalid` (a yaml error)."""
    try:
        loader = BoundedLoader(text, where, root)  # its reader refuses a control character at once
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{invalid} ({_yaml_problem(e)})") from None


def read_yaml(path: str | Path) -> dict:
    """The yaml file's mapping of keys ({} for an empty file); a ConfigError naming the file when it cannot be.
    Read through gcc.inputs (a regular file of at most its cap) and `BoundedLoader`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, expected a yaml config file")
    try:
        text = read_text(p, "yaml")
    except BadInput as e:
        raise ConfigError(f"config file {e}") from None
    tree = load_yaml(text, str(p), f"{p}: not valid yaml")
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: expected a mapping of keys (key: value lines), got a yaml {type(tree).__name__}")
    return tree

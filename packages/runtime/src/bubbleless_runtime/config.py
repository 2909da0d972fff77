"""The configuration of ``bubbleless train``: ``load_config`` reads a YAML file into a validated
``RunConfig``, with errors a user can act on; the dataclasses are ``config_fields``'s (and importable
from here).

The config's modules import one way only: ``config_fields`` (the dataclasses, no sibling imports) <-
``config_ranges`` <- ``config_checks`` (every check that needs no torch) <- ``config`` (this: YAML in)
and ``config_docs`` (the reference page) and ``config_runtime`` (the checks that need torch or the
model, run by ``bubbleless train`` just before spawning). Validating a config imports no torch.

- Malformed YAML is a ``ValueError`` that names the file, line and column (1-based) of the problem.
- A key given twice in one mapping (a section pasted twice, a field repeated) is refused naming both
  lines, where PyYAML would silently keep the second.
- An empty file (or one holding only comments) is refused: it says which key to write, and that
  ``bubbleless train`` without a file runs the embedded demo. ``load_config(text="")`` (the Python API)
  keeps the library defaults, ``RunConfig()``.
"""

from __future__ import annotations

import os

import yaml

from .config_checks import validate
from .config_fields import (  # noqa: F401 (the public names of the config, importable from here)
    SECTIONS,
    DataConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    PipelineConfig,
    RunConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives one key twice."""


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise DuplicateKeyError(
                        None, None,
                        f"key {key!r} is given twice (first on line {first + 1}); the second would silently "
                        f"replace the first: merge them into one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str = "<config text>"):
    """``text`` as Python objects; ``ValueError`` naming ``source``, line and column on bad YAML."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as error:
        mark = error.problem_mark
        raise ValueError(f"{source}:{mark.line + 1}:{mark.column + 1}: {error.problem}") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        context = f" ({error.context})" if error.context else ""
        raise ValueError(
            f"{where}: invalid YAML{context}: {error.problem}; fix the file at that line and column"
        ) from None
    except yaml.YAMLError as error:
        raise ValueError(f"{source}: invalid YAML: {error}") from None


def load_config(path: str | os.PathLike | None = None, *, text: str | None = None) -> RunConfig:
    """Read a YAML file (or ``text``) into a validated ``RunConfig``; missing keys keep their defaults."""
    if text is None:
        if path is None:
            return validate(RunConfig())
        if os.path.isdir(path):
            raise ValueError(f"config file {str(path)!r} is a directory; give the path of a YAML file")
        if not os.path.isfile(path):
            raise ValueError(f"config file {str(path)!r} does not exist")
        with open(path, encoding="utf-8") as handle:
            data = parse_yaml(handle.read(), str(path))
        if data is None:
            raise ValueError(
                f"config file {str(path)!r} is empty: write the sections to change (e.g. `train: {{steps: 50}}`; "
                "`bubbleless train --print-config` prints every field), or run `bubbleless train` with no file "
                "for the embedded demo"
            )
        return validate(config_from_dict(data))
    return validate(config_from_dict(parse_yaml(text)))

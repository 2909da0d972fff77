"""``docs/config.md``, generated from the config dataclasses' field docstrings.

Regenerate: ``python -m bubbleless_runtime.config_docs > packages/runtime/docs/config.md``; a test keeps
the page and the code in step.
"""

from __future__ import annotations

import dataclasses

from . import config_fields as config_module
from .config_checks import choices
from .config_fields import SECTIONS, RunConfig


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """Per config class: (field, type, default, docstring), read from ``config_fields.py``'s source.

    Field docstrings are not kept at runtime, so they are read with ``ast``.
    """
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(config_module))
    classes = {c.__name__: c for c in (RunConfig, *SECTIONS.values())}
    docs: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in classes:
            continue
        defaults = {f.name: f for f in dataclasses.fields(classes[node.name])}
        rows = []
        for item, following in zip(node.body, node.body[1:] + [None], strict=True):
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                doc = ""
                if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                    doc = " ".join(str(following.value.value).split())
                name = item.target.id
                rows.append((name, ast.unparse(item.annotation), _default_text(defaults[name]), doc))
        docs[node.name] = rows
    return docs


def _default_text(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(section)" if dataclasses.is_dataclass(value) else repr(value)
    return repr(f.default)


def config_reference_markdown() -> str:
    """The text of ``docs/config.md``."""
    docs = field_docs()
    lines = [
        "# `bubbleless train` configuration reference",
        "",
        "<!-- generated from bubbleless_runtime/config_fields.py by "
        "`python -m bubbleless_runtime.config_docs > packages/runtime/docs/config.md`; edit the docstrings there -->",
        "",
        "A YAML file with up to six sections; every key is optional and takes the default shown. A key that",
        "is not listed here is an error that names it. `bubbleless train` with no file runs the embedded",
        "default (`bubbleless train --print-config` prints it); `bubbleless train --example roundrobin` runs",
        "the embedded round-robin example. `--nproc`, `--steps`, `--schedule`, `--output-dir` and `--resume`",
        "override the matching fields.",
        "",
        "Everything is checked before any process starts, each problem one message naming the key (exit",
        "status 2): malformed YAML (file, line and column), a section or key given twice, an empty file",
        "(refused: write the sections to change, or give no file for the embedded demo), values out of range,",
        "a `model.path` without a `config.json`, `lora.target_modules` that match no linear layer, a",
        "`pipeline.memory_cap` below what the parameters alone need, an `output_dir` that cannot be written.",
        "`pipeline.schedule` may also be the path of a CSV schedule (`Schedule.to_csv`,",
        "`bubbleless-schedules show NAME -p P -m M --csv FILE`), edited by hand if need be: it is validated",
        "and must be made for `pipeline.nproc` ranks and `pipeline.num_microbatches` micro-batches.",
        "",
        "```yaml",
        "model: {architecture: qwen3, num_layers: 6}",
        "pipeline: {schedule: zbv, nproc: 4, num_microbatches: 8}",
        "train: {steps: 300, precision: bf16}",
        "```",
        "",
        "The round-robin device pool (`schedule: roundrobin`) runs in one process, a thread per device; it",
        "takes `pipeline.devices` instead of `pipeline.nproc`, and its cut as forward/last/backward groups:",
        "",
        "```yaml",
        "pipeline: {schedule: roundrobin, devices: [cuda:0, cuda:1], num_microbatches: 8,",
        "           partition: {forward: [4, 4], last: 2, backward: [2, 2, 2, 2]}}",
        "```",
    ]
    accepted = choices()
    for section, cls in SECTIONS.items():
        lines += ["", f"## `{section}`", "", " ".join((cls.__doc__ or "").split()), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for name, kind, default, doc in docs[cls.__name__]:
            kind, doc = kind.replace("|", "\\|"), doc.replace("``", "`").replace("|", "\\|")
            lines.append(f"| `{section}.{name}` | `{kind}` | `{default}` | {doc} |")
        for (s, n), values in accepted.items():
            if s == section:
                lines.append(f"\n`{section}.{n}` accepts: {', '.join(f'`{v}`' for v in values)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_reference_markdown(), end="")

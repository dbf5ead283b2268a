"""The generated pages of the docs site, built from the code at every ``mkdocs build`` so they never drift from it.

:func:`generated_pages` returns ``{page path: markdown}`` for

- ``apps/<app>.md``: one page per app of :data:`warp_meshad.apps.APP_NAMES`: the app module's docstring, its picture
  (``docs/assets/apps/<app>.png`` where ``docs/make_pictures.py`` made one), its scenes (``configs/<app>/*.yaml``:
  the leading comment, the command and the file) and its config keys from the typed pydantic config class (type,
  default and the class docstring's ``Attributes:`` entry);
- ``apps/common-keys.md``: the keys every app has (:class:`warp_meshad.app.AppConfig`);
- ``energies/catalogue.md``: every file of ``kernels/energies/`` with its module docstring (formula, units, source,
  invariants) and the names it defines;
- ``solvers/linear-backends.md``: the linear back-ends of the registration table with their class docstrings;
- ``benchmarks/``: ``benchmarks/README.md`` as ``benchmarks/index.md`` and the folder's other markdown files as they
  are, with links that leave ``benchmarks/`` rewritten;
- ``api/<module>.md``: the API reference of each public module (mkdocstrings directives for every name of its
  ``__all__``, pointing at the module that defines the name).

Run it directly to write the pages to a folder for reading: ``python docs/gen_pages.py OUT_DIR``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import re
import sys
import types
import typing

ROOT = pathlib.Path(__file__).resolve().parents[1]

# the public modules of the API reference, in the order of the nav, each with a one-line title
API_MODULES = {
    "warp_meshad": "Meshes, problems, solvers, linear back-ends",
    "warp_meshad.app": "App framework: configs, runner, outputs",
    "warp_meshad.contact": "Contact pair search and CCD",
    "warp_meshad.dynamics": "Backward Euler time steps",
    "warp_meshad.torch": "PyTorch autograd",
    "warp_meshad.kernels": "Device library: ad, dtype_struct",
}
# public modules documented beside a module's ``__all__``
API_EXTRA = {"warp_meshad.kernels": ["warp_meshad.kernels.dtype_struct"]}

# --------------------------------------------------------------------------------------------------------------------
# docstrings (reST-flavoured plain text) to markdown
# --------------------------------------------------------------------------------------------------------------------

_SECTION = re.compile(r"^(Parameters|Args|Arguments|Attributes|Fields)(\s*\([^)]*\))?:\s*$")
_ENTRY = re.compile(r"^([^\s:][^:]{0,60}?):\s+(.*)$")


def _rst_roles():
    """``rst_to_markdown`` of docs/griffe_rst.py: the one rule for Sphinx roles, in the API pages and here."""
    spec = importlib.util.spec_from_file_location("warp_meshad_docs_griffe_rst", ROOT / "docs" / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rst_to_markdown


_ROLES = _rst_roles()


def _inline(text: str) -> str:
    """One line of docstring prose as markdown: roles and ``literals`` as code spans, ``*`` escaped outside code."""
    text = _ROLES(text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("*", r"\*").replace("<", "&lt;")
    return "".join(parts)


def docstring_markdown(doc: str) -> str:
    """A module or class docstring as markdown.

    Indented blocks (formulas, literal blocks) become fenced code; a ``Parameters:`` / ``Args:`` / ``Attributes:``
    section becomes a list with one item per ``name: text`` entry; everything else is prose.
    """
    lines = inspect.cleandoc(doc.expandtabs()).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith(".. code-block::"):
            i += 1
            continue
        section = _SECTION.match(line)
        if section:
            out += [f"**{line.strip()}**", ""]
            i += 1
            entries: list[list[str]] = []
            while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
                if not lines[i].strip():
                    if i + 1 < len(lines) and lines[i + 1].startswith(" "):
                        i += 1
                        continue
                    break
                body = lines[i].strip()
                indent = len(lines[i]) - len(lines[i].lstrip())
                entry = _ENTRY.match(body)
                if entry and (not entries or indent <= 4):
                    entries.append([entry.group(1), entry.group(2)])
                elif entries:
                    entries[-1][1] += " " + body
                else:
                    entries.append(["", body])
                i += 1
            for name, text in entries:
                out.append(f"- **{_inline(name)}**: {_inline(text)}" if name else f"- {_inline(text)}")
            out.append("")
            continue
        if line.startswith("    ") and (not out or not out[-1].strip() or out[-1].rstrip().endswith(":")):
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            if out and out[-1].strip():
                out.append("")
            out += ["```text", *block, "```", ""]
            continue
        stripped = line.rstrip()
        if stripped.endswith("::"):
            stripped = stripped[:-1]
        out.append(_inline(stripped))
        i += 1
    return "\n".join(out).strip() + "\n"


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


# --------------------------------------------------------------------------------------------------------------------
# config keys from the typed configs
# --------------------------------------------------------------------------------------------------------------------


def attribute_docs(cls) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` sections of ``cls`` and its bases (the nearest class first)."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        doc = klass.__dict__.get("__doc__")
        if not doc:
            continue
        lines = doc.expandtabs().splitlines()
        try:
            start = next(k for k, ln in enumerate(lines) if ln.strip() == "Attributes:")
        except StopIteration:
            continue
        base = len(lines[start]) - len(lines[start].lstrip())
        name = None
        mine: dict[str, str] = {}
        for ln in lines[start + 1:]:
            if not ln.strip():
                continue
            indent = len(ln) - len(ln.lstrip())
            if indent <= base:
                break
            entry = re.match(r"^(\w+):\s*(.*)$", ln.strip())
            if entry and (name is None or indent <= base + 4):
                name = entry.group(1)
                mine[name] = entry.group(2)
            elif name is not None:
                mine[name] += " " + ln.strip()
        for key, text in mine.items():
            found.setdefault(key, text)
    return found


def _is_model(tp) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_text(tp) -> str:
    """A field's annotation as a reader of YAML sees it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        text = " \\| ".join(type_text(a) for a in rest)
        return f"{text} \\| null" if len(rest) < len(args) else text
    if origin in (tuple, list):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        if origin is tuple:
            return "[" + ", ".join(type_text(a) for a in args) + "]"
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict or tp is dict:
        return "mapping"
    if _is_model(tp):
        return "group (below)"
    return getattr(tp, "__name__", str(tp))


def default_text(field) -> str:
    from pydantic_core import PydanticUndefined

    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if value is PydanticUndefined:
        return "required"
    if hasattr(value, "model_dump"):
        return "(below)"
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def _cell(text: str) -> str:
    """Docstring prose as one table cell: pipes outside code spans escaped (the table keeps those in code)."""
    parts = re.split(r"(`[^`]*`)", _inline(text))
    return "".join(p if k % 2 else p.replace("|", "\\|") for k, p in enumerate(parts))


def key_rows(model, names, prefix: str = "") -> list[str]:
    """Table rows (key, type, default, description) of the fields ``names`` of ``model``; groups expanded below."""
    docs = attribute_docs(model)
    rows, groups = [], []
    for name in names:
        field = model.model_fields[name]
        tp = field.annotation
        key = prefix + name
        rows.append(f"| `{key}` | {type_text(tp)} | `{default_text(field)}` | {_cell(docs.get(name, ''))} |")
        inner = [a for a in (typing.get_args(tp) or (tp,)) if _is_model(a)]
        if inner:
            groups.append((key, inner[0]))
    for key, sub in groups:
        rows += key_rows(sub, [n for n in sub.model_fields if n not in sub.internal_fields], key + ".")
    return rows


KEY_TABLE_HEAD = ["| key | type | default | what it sets |", "|---|---|---|---|"]


def common_keys_page() -> str:
    from warp_meshad.app import AppConfig

    names = [n for n in AppConfig.model_fields if n not in AppConfig.internal_fields]
    return "\n".join([
        "# Keys every app has",
        "",
        "Every app's config class derives from `AppConfig` (a pydantic model: the class is the schema). A scene's "
        "YAML file overrides these fields and the app's own (on its page); `--set key=value` and `--device` "
        "override them from the command line. An unknown key, a value of the wrong type or a missing mesh file "
        "exits with status 2 and one line naming the file and the key. The table is generated from the code.",
        "",
        *KEY_TABLE_HEAD,
        *key_rows(AppConfig, names),
        "",
    ])


def _leading_comment(text: str) -> str:
    """A scene file's leading comment, without its ``Run:`` line (the command has a column of its own)."""
    lines = []
    for ln in text.splitlines():
        if not ln.startswith("#"):
            break
        lines.append(ln.lstrip("#").strip())
    return " ".join(lines).split(" Run:", 1)[0].split("Run:", 1)[0].strip()


def app_page(name: str) -> str:
    from warp_meshad.app import AppConfig, app_class

    cls = app_class(name)
    config = cls.config_class
    module = sys.modules[cls.__module__]
    out = [f"# {name}", ""]
    picture = ROOT / "docs" / "assets" / "apps" / f"{name}.png"
    if picture.exists():
        out += [f"![{name}: the screenshot of a run, made by docs/make_pictures.py](../assets/apps/{name}.png)", ""]
    out += [docstring_markdown(module.__doc__ or ""), "## Scenes", ""]
    out += ["| scene | what it is | run it |", "|---|---|---|"]
    files = sorted((ROOT / "configs" / name).glob("*.yaml"))
    for f in files:
        scene = f"{name}/{f.stem}"
        command = (f"warp-meshad batch {scene} --meshes DIR --output DIR" if f.stem == "patches"
                   else f"warp-meshad run {scene}")
        out.append(f"| `{scene}` | {_cell(_leading_comment(f.read_text()))} | `{command}` |")
    out.append("")
    for f in files:
        out += [f'??? note "configs/{name}/{f.name}"', "    ```yaml"]
        out += [f"    {ln}" if ln else "" for ln in f.read_text().rstrip("\n").splitlines()]
        out += ["    ```", ""]
    base = AppConfig.model_fields
    own = []
    for key, field in config.model_fields.items():
        if key in config.internal_fields:
            continue
        if key not in base or field.annotation != base[key].annotation or default_text(field) != default_text(
                base[key]):
            own.append(key)
    out += [
        "## Config keys",
        "",
        f"`{config.__name__}` (`{config.__module__}`): the keys this app adds to or changes from "
        "[the keys every app has](common-keys.md). Generated from the code.",
        "",
        *KEY_TABLE_HEAD,
        *key_rows(config, own),
        "",
    ]
    return "\n".join(out)


def apps_table() -> str:
    """The table of apps (name linking to its page, scenes, the first paragraph of its module docstring)."""
    from warp_meshad.apps import APP_NAMES

    out = ["| app | scenes | what it solves |", "|---|---|---|"]
    for name in sorted(APP_NAMES):
        module = importlib.import_module(f"warp_meshad.apps.{name}")
        scenes = ", ".join(f"`{f.stem}`" for f in sorted((ROOT / "configs" / name).glob("*.yaml")))
        out.append(f"| [{name}]({name}.md) | {scenes} | {_cell(_first_paragraph(module.__doc__))} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------------------------
# energies, linear back-ends
# --------------------------------------------------------------------------------------------------------------------


def energy_catalogue_page() -> str:
    folder = ROOT / "kernels" / "energies"
    package = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    out = ["# Energy catalogue", "",
           "The built-in energies of `warp_meshad.kernels.energies`, one file each, generated from the files' "
           "docstrings: the formula, the units of each parameter, the source and the invariants. Each name below "
           "imports as `from warp_meshad.kernels.energies import NAME`.", "",
           docstring_markdown(package.split("\n\n", 1)[1] if package and "\n\n" in package else (package or ""))]
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree) or ""
        names = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names = list(ast.literal_eval(node.value))
        title = _first_paragraph(doc).rstrip(".")
        body = doc.split("\n\n", 1)[1] if "\n\n" in doc else ""
        out += [f"## {path.stem}", "", f"*{_inline(title)}.*", ""]
        if names:
            out += ["Defines: " + ", ".join(f"`{n}`" for n in names) + f" (`kernels/energies/{path.name}`).", ""]
        out.append(docstring_markdown(body) if body else "")
    return "\n".join(out)


def linear_backends_page() -> str:
    from warp_meshad._src.solve.linear import registry

    out = ["# Linear back-ends", "",
           "The back-ends a Newton-type solver, `wm.make_linear_solver(name)` or a config's `linear_solver:` may "
           "name: the registration table of `warp_meshad/_src/solve/linear/registry.py`, with each class's "
           "docstring (generated from the code). The registry's own docstring:", "",
           docstring_markdown(registry.__doc__ or ""),
           "| name | class | what it is |", "|---|---|---|"]
    for name, cls in registry._BACKENDS.items():
        out.append(f"| `\"{name}\"` | `{cls.__name__}` | {_cell(_first_paragraph(cls.__doc__))} |")
    out.append("")
    for name, cls in registry._BACKENDS.items():
        out += [f"## {name}", "", f"`{cls.__module__}.{cls.__name__}`", "", docstring_markdown(cls.__doc__ or "")]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------------------------
# benchmarks
# --------------------------------------------------------------------------------------------------------------------

_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def _benchmark_page(path: pathlib.Path, folder: pathlib.Path, served: set[str]) -> str:
    """One markdown file of ``benchmarks/`` as a page: links to its pages kept (README.md -> index.md), links to its
    other files kept and the files served, a link that leaves ``benchmarks/`` written as the path in code."""

    def link(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z]+:|^#", target):
            return match.group(0)
        rel, _, anchor = target.partition("#")
        resolved = (path.parent / rel).resolve()
        anchor = f"#{anchor}" if anchor else ""
        if resolved.is_relative_to(folder) and resolved.is_file():
            if resolved.suffix == ".md":
                page = resolved.with_name("index.md") if resolved.name == "README.md" else resolved
                return f"{match.group(1)}{os.path.relpath(page, _page_path(path, folder).parent)}{anchor})"
            served.add(resolved.relative_to(folder).as_posix())
            return match.group(0)
        shown = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else rel
        label = match.group(1)[1:-2].lstrip("[")
        return f"{label} (`{shown}`)" if label and label != rel else f"`{shown}`"

    return _LINK.sub(link, path.read_text())


def _page_path(path: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    return path.with_name("index.md") if path.name == "README.md" else path


def benchmark_pages() -> tuple[dict[str, str], list[str]]:
    """Every markdown file of ``benchmarks/`` as a page under ``benchmarks/`` (``README.md`` as its index), and the
    other files of ``benchmarks/`` their links reach (plots, served beside them)."""
    folder = (ROOT / "benchmarks").resolve()
    served: set[str] = set()
    pages = {}
    for path in sorted(folder.rglob("*.md")):
        uri = "benchmarks/" + _page_path(path, folder).relative_to(folder).as_posix()
        pages[uri] = _benchmark_page(path, folder, served)
    return pages, sorted(served)


# --------------------------------------------------------------------------------------------------------------------
# API reference
# --------------------------------------------------------------------------------------------------------------------


# installed names whose source folders are top-level in the checkout (pyproject's package-dir): the static loader of
# mkdocstrings (griffe) finds them under their folder names
_SOURCE_PACKAGES = {"warp_meshad.kernels": "kernels", "warp_meshad.apps": "apps", "warp_meshad.configs": "configs"}


def source_identifier(identifier: str) -> str:
    """The identifier mkdocstrings loads for an installed one (``warp_meshad.kernels.ad`` -> ``kernels.ad``)."""
    for installed, folder in _SOURCE_PACKAGES.items():
        if identifier == installed or identifier.startswith(installed + "."):
            return folder + identifier[len(installed):]
    return identifier


def public_names(module_name: str) -> list[tuple[str, str]]:
    """``[(public name, identifier of its definition)]`` for the ``__all__`` of a public module."""
    module = importlib.import_module(module_name)
    homes = getattr(module, "_HOMES", None)
    out = []
    for name in module.__all__:
        target = f"{module_name}.{name}"
        if homes is not None and name in homes:
            home = homes[name]
            if isinstance(home, tuple):
                target = f"{home[0]}.{home[1]}"
            elif "." in home:
                target = f"{home}.{name}"
            else:
                target = f"{module_name}.{home}.{name}"
        out.append((name, target))
    return out


def api_page(module_name: str, title: str) -> str:
    out = [f"# `{module_name}`", "", title + ".", "",
           f"::: {source_identifier(module_name)}", "    options:", "      members: false",
           "      show_root_heading: false", ""]
    for name, target in public_names(module_name):
        out += [f"::: {source_identifier(target)}", "    options:", f'      heading: "{module_name}.{name}"',
                f'      toc_label: "{name}"', ""]
    for extra in API_EXTRA.get(module_name, ()):
        out += [f"::: {source_identifier(extra)}", "    options:", f'      heading: "{extra}"',
                f'      toc_label: "{extra.rsplit(".", 1)[-1]}"', ""]
    return "\n".join(out)


def api_index_page() -> str:
    out = ["# API reference", "",
           "Every public name, at its one import path, with the docstring of its definition. Internals live in "
           "`warp_meshad._src` and are not part of the API.", "", "| module | what it holds |", "|---|---|"]
    for module_name, title in API_MODULES.items():
        out.append(f"| [`{module_name}`]({module_name}.md) | {title} |")
    out += ["", "The built-in energies of `warp_meshad.kernels.energies` are in the "
            "[energy catalogue](../energies/catalogue.md).", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------------------------


# parts of hand-written pages: a line ``<!-- generated: NAME -->`` in a page of docs/ is replaced by MARKERS[NAME]()
MARKERS = {"apps-table": apps_table}


def generated_pages() -> tuple[dict[str, str], list[str]]:
    """``({page path under docs/: markdown}, [paths of benchmarks/ files to serve beside the benchmarks page])``."""
    from warp_meshad.apps import APP_NAMES

    pages = {"apps/common-keys.md": common_keys_page()}
    for name in sorted(APP_NAMES):
        pages[f"apps/{name}.md"] = app_page(name)
    pages["energies/catalogue.md"] = energy_catalogue_page()
    pages["solvers/linear-backends.md"] = linear_backends_page()
    benchmarks, served = benchmark_pages()
    pages.update(benchmarks)
    pages["api/index.md"] = api_index_page()
    for module_name, title in API_MODULES.items():
        pages[f"api/{module_name}.md"] = api_page(module_name, title)
    return pages, served


if __name__ == "__main__":
    out_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "output/docs_pages")
    pages, _ = generated_pages()
    for rel, text in pages.items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_text(text)
    print(f"{len(pages)} pages written to {out_dir}")

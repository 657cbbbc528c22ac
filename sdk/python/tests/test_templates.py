"""Templates: ``create(template=...)`` resolves ``base`` and ``data-science`` as the CLI does
(the layout ``tether image build --template NAME`` keeps in the data directory for the local
provider, ``tether-NAME`` on a cloud provider), refuses unknown names and a template that is
not built with the command that builds it, and runs a real ``base`` as its user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, Relay
from tether_sandbox import Sandbox, TemplateNotBuilt
from tether_sandbox._templates import template_image


def _fake_built(home: Path, name: str) -> Path:
    layout = home / "templates" / name / "image"
    layout.mkdir(parents=True)
    (layout / "index.json").write_text("{}")
    (layout.parent / "template.json").write_text(json.dumps({"name": name}))
    return layout


def test_names_and_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="the templates are base, data-science"):
        template_image("bse", None)
    assert template_image("data-science", "e2b") == "tether-data-science"
    with pytest.raises(TemplateNotBuilt) as err:
        template_image("base", None)
    assert err.value.command == "tether image build --template base"
    assert "tether image build --template base" in str(err.value)

    layout = _fake_built(tmp_path, "base")
    assert template_image("base", "local") == f"oci:{layout}"
    assert template_image("base", None) == f"oci:{layout}"


def test_create_refuses_before_asking_the_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_HOME", str(tmp_path))
    # Nothing listens here: each refusal must come before any request.
    relay, token = "http://127.0.0.1:9", "t"
    with pytest.raises(ValueError, match="not both"):
        Sandbox.create(template="base", image="oci:/x", relay=relay, token=token)
    with pytest.raises(ValueError, match="no template 'nope'"):
        Sandbox.create(template="nope", relay=relay, token=token)
    with pytest.raises(TemplateNotBuilt, match="tether image build --template data-science"):
        Sandbox.create(template="data-science", relay=relay, token=token)


def _built_base() -> Path | None:
    """A ``TETHER_HOME`` holding a real ``base``, as the Rust end-to-end tests keep it."""
    cache = REPO / "target" / "tether-test-templates"
    for home in sorted(cache.glob("base-*")):
        if (home / "templates" / "base" / "template.json").is_file():
            return home
    return None


def test_a_built_base_runs_as_its_user(relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _built_base()
    if home is None:
        pytest.skip(
            "no built base template: `cargo test -p tether-e2e --test e2e -- templates::` builds one"
        )
    monkeypatch.setenv("TETHER_HOME", str(home))
    with Sandbox.create(template="base", ttl=300) as sb:
        try:
            out = sb.commands.run("whoami; pwd; python --version").stdout
            assert out.splitlines()[:2] == ["user", "/home/user"], out
            assert out.splitlines()[2].startswith("Python 3.11."), out
        finally:
            sb.delete()

"""Templates (E2B's ``base`` and ``data-science``), as ``tether image build --template NAME``
builds them: where a local one is kept, and what ``create(template=...)`` sends as the image.
The CLI's ``cli/src/templates/mod.rs`` is the other half of this convention: the local
provider runs ``DATA/templates/NAME/image`` as ``oci:PATH``, a cloud provider the image built
under ``tether-NAME``.
"""

from __future__ import annotations

from pathlib import Path

from ._relay import default_data_dir
from .errors import TemplateNotBuilt

#: Every template, as ``tether image templates`` lists them.
TEMPLATES = ("base", "data-science")
#: The prefix of a template's name on a cloud provider.
PROVIDER_PREFIX = "tether-"


def template_layout(name: str) -> Path:
    """The built template ``name``'s OCI layout on this machine."""
    return default_data_dir() / "templates" / name / "image"


def is_built(name: str) -> bool:
    """Whether ``tether image build --template NAME`` has built ``name`` on this machine."""
    layout = template_layout(name)
    return (layout / "index.json").is_file() and (layout.parent / "template.json").is_file()


def template_image(name: str, provider: str | None) -> str:
    """The image a sandbox of template ``name`` on ``provider`` is created from. Raises
    :class:`ValueError` for an unknown name and :class:`TemplateNotBuilt` for a local template
    not built here."""
    if name not in TEMPLATES:
        raise ValueError(f"there is no template {name!r}; the templates are {', '.join(TEMPLATES)}")
    if provider not in (None, "local"):
        return PROVIDER_PREFIX + name
    if not is_built(name):
        raise TemplateNotBuilt(name, str(template_layout(name)))
    return f"oci:{template_layout(name)}"

"""The deferral pipeline's refusal of a cascade folder: a folder holding ``cascade_config.json``
([`CASCADE_CONFIG_NAME`]) is a deferral cascade (`hf_defer.cascade`), which only the cascade pipeline runs whole.

Standard library only: it is copied next to the weights for remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["CASCADE_CONFIG_NAME", "refuse_cascade_folder"]


CASCADE_CONFIG_NAME = "cascade_config.json"
"""The file that makes a folder a deferral cascade (`hf_defer.cascade`): stage 1 at the folder's
root, stage 2 in ``stage2/``."""


def refuse_cascade_folder(model: Any) -> None:
    """A cascade folder's root holds its stage 1: the deferral pipeline on it would run stage 1 alone, never paying
    stage 2's check of the escalation expert. Refuses the model loaded from such a folder (``model.name_or_path``)."""
    folder = getattr(model, "name_or_path", None)
    if isinstance(folder, (str, os.PathLike)) and str(folder) and \
            os.path.isfile(os.path.join(folder, CASCADE_CONFIG_NAME)):
        raise ValueError(
            f"{str(folder)!r} holds a deferral cascade ({CASCADE_CONFIG_NAME}): the 'deferral' pipeline would run its "
            "stage 1 alone. Run the whole cascade with pipeline('deferral-cascade', model=folder, experts={...}) "
            "(library mode: import hf_defer), or hf_defer.DeferralCascade.from_pretrained(folder)."
        )

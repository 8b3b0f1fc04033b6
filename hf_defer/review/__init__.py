"""From deferral to reviewers and back: the inputs a deferral model defers become tasks on a Label Studio server (with
the model's suggestion as a pre-annotation), and the reviewers' answers come back as a long table and as one expert
column per reviewer for the next training round.

- `labeling`: the project's labelling configuration, generated from the model's `id2label` and checked against it.
- `tasks`: tasks (and their keys) from the pipeline's outputs; `answers`: answers from the annotated tasks.
- `client`: the connection to one project through label-studio-sdk ([`connect`], [`ReviewProject`]), with clear errors.
- `pushing` / `pulling`: idempotent, resumable push; incremental pull, [`reviews_to_columns`].
- `server`: a local Label Studio server in its own virtual environment (tests, `make review-server`, the demo).
- `simulated`: reviewers simulated from the CrowdFlower votes shipped with HateSpeech (the demo and tests).
- the command `hf-defer review push|pull` lives with the other commands, in `hf_defer.commands.review`.

It may import the subpackages below the commands (modeling, evaluation, data, experts, training, hub) and
label-studio-sdk, pandas and the libraries, never commands; the commands (`hf-defer review`, `hf-defer serve`) and the
decision endpoint in serving import it. Needs
`pip install 'hf-defer[review]'`.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_TOKEN_ENV": "client",
    "PullResult": "pulling",
    "PushReport": "pushing",
    "ReviewProject": "client",
    "ReviewServerError": "client",
    "check_label_config": "labeling",
    "connect": "client",
    "deferred_tasks": "tasks",
    "label_config": "labeling",
    "pull": "pulling",
    "pull_to_csv": "pulling",
    "push": "pushing",
    "push_dataset": "pushing",
    "read_answers": "pulling",
    "reviews_to_columns": "pulling",
    "task_key": "tasks",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .client import DEFAULT_TOKEN_ENV, ReviewProject, ReviewServerError, connect
    from .labeling import check_label_config, label_config
    from .pulling import PullResult, pull, pull_to_csv, read_answers, reviews_to_columns
    from .pushing import PushReport, push, push_dataset
    from .tasks import deferred_tasks, task_key

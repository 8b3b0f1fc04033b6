"""A connection to one Label Studio project, through label-studio-sdk, with the server's failures turned into errors that
say what happened: the server cannot be reached, the API token is refused, the project does not exist or was made for
other classes.

The API token is read from an environment variable (`LABEL_STUDIO_API_KEY` unless told otherwise) and never written,
printed or logged; messages name the variable, not its value.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .labeling import check_label_config, config_classes, label_config, model_classes
from .tasks import KEY_FIELD

__all__ = ["DEFAULT_TOKEN_ENV", "ReviewProject", "ReviewServerError", "connect"]

logger = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "LABEL_STUDIO_API_KEY"
"""The environment variable that holds the API token by default (the variable label-studio-sdk itself reads)."""
PAGE_SIZE = 500


class ReviewServerError(RuntimeError):
    """The Label Studio server could not do what was asked: unreachable, token refused, or an API error.

    Example:

    ```python
    >>> import os
    >>> import hf_defer.review as review
    >>> os.environ["HF_DEFER_EXAMPLE_TOKEN"] = "not-a-real-token"
    >>> try:  # nothing listens on port 9
    ...     review.connect("http://127.0.0.1:9", "reviews", ["no", "yes"], token_env="HF_DEFER_EXAMPLE_TOKEN")
    ... except review.ReviewServerError as error:
    ...     print(str(error).split(" while ")[0])
    cannot reach the Label Studio server at http://127.0.0.1:9

    ```
    """


def _sdk() -> Any:
    try:
        import label_studio_sdk
    except ImportError as error:
        raise ImportError("hf_defer.review needs label-studio-sdk: pip install 'hf-defer[review]'.") from error
    return label_studio_sdk


def _explain(error: Exception, url: str, token_env: str, doing: str) -> ReviewServerError:
    """A [`ReviewServerError`] that names the server, what was being done and why it failed (never the token)."""
    import httpx
    from label_studio_sdk.core.api_error import ApiError

    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ReviewServerError(f"cannot reach the Label Studio server at {url} while {doing} ({error}); is it "
                                 "running and is the URL right? `make review-server` starts a local one.")
    if isinstance(error, httpx.TimeoutException):
        return ReviewServerError(f"the Label Studio server at {url} did not answer in time while {doing} ({error}).")
    if isinstance(error, httpx.TransportError):
        return ReviewServerError(f"the connection to the Label Studio server at {url} failed while {doing}: {error!r}.")
    if isinstance(error, ApiError):
        detail = error.body.get("detail", error.body) if isinstance(error.body, dict) else error.body
        if isinstance(error.body, dict) and error.body.get("validation_errors"):
            detail = f"{detail}: {error.body['validation_errors']}"
        if error.status_code in (401, 403):
            return ReviewServerError(
                f"the Label Studio server at {url} refused the API token in ${token_env} while {doing} "
                f"(HTTP {error.status_code}: {detail}); set ${token_env} to a valid token (Account & Settings in "
                "Label Studio; for a legacy token the organisation must allow legacy tokens).")
        return ReviewServerError(f"the Label Studio server at {url} answered HTTP {error.status_code} while {doing}: "
                                 f"{str(detail)[:500]}")
    return ReviewServerError(f"{doing} on the Label Studio server at {url} failed: {error!r}")


class _UnexpectedShape(TypeError):
    """The server's JSON parsed, but not into what the Label Studio API answers (raised by [`_expect`])."""


def _expect(condition: bool, what: str) -> None:
    """Raises [`_UnexpectedShape`] saying `what` was expected of the server's answer, unless `condition`."""
    if not condition:
        raise _UnexpectedShape(what)


def _shape_errors() -> tuple[type[Exception], ...]:
    """What the SDK and the code reading its answers raise on valid JSON of the wrong shape."""
    import pydantic

    return (_UnexpectedShape, TypeError, AttributeError, KeyError, pydantic.ValidationError)


def _unexpected(error: Exception, url: str, doing: str) -> ReviewServerError:
    what = str(error) if isinstance(error, _UnexpectedShape) else f"{type(error).__name__}: {error}"
    return ReviewServerError(f"the server at {url} answered {doing} with JSON that is not what the Label Studio API "
                             f"sends ({' '.join(what.split())[:300]}); is {url} a Label Studio server (label-studio "
                             "1.x), reached directly rather than through a proxy that rewrites its answers?")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _guarded(method: Any) -> Any:
    """Turn transport and API errors, and answers of the wrong shape, raised inside a [`ReviewProject`] method into a
    [`ReviewServerError`] that names the server and what was being done."""
    def wrapper(self: ReviewProject, *args: Any, **kwargs: Any) -> Any:
        import httpx
        from label_studio_sdk.core.api_error import ApiError

        doing = method.__doc__.split("\n")[0].rstrip(".")
        doing = doing[:1].lower() + doing[1:]
        try:
            return method(self, *args, **kwargs)
        except (httpx.HTTPError, ApiError) as error:
            raise _explain(error, self.url, self.token_env, doing) from error
        except _shape_errors() as error:
            raise _unexpected(error, self.url, doing) from error
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


@dataclass
class ReviewProject:
    """A Label Studio project that holds the tasks of one deferral model, reached through label-studio-sdk.

    Build it with [`connect`]; [`push`] and [`pull`] take it.

    Attributes:
        client: the `label_studio_sdk.LabelStudio` client.
        project_id (`int`), title (`str`): the project.
        classes (`list[str]`): the model's classes in id order, which the project's configuration offers.
        url (`str`): the server; token_env (`str`): the environment variable the token came from.

    Example:

    ```python
    >>> import hf_defer.review as review
    >>> project = review.connect("http://localhost:8080", "HateSpeech reviews", ["hate", "offensive", "neither"])  # doctest: +SKIP
    >>> project.project_id, project.classes  # doctest: +SKIP
    (3, ['hate', 'offensive', 'neither'])

    ```
    """

    client: Any
    project_id: int
    title: str
    classes: list[str]
    url: str
    token_env: str = DEFAULT_TOKEN_ENV
    _users: dict[int, str] = field(default_factory=dict, repr=False)

    @_guarded
    def task_keys(self) -> dict[str, int]:
        """Listing the project's tasks.

        Returns the key of every task pushed by hf_defer, mapped to its task id."""
        keys: dict[str, int] = {}
        repeated: list[str] = []
        for task in self.client.tasks.list(project=self.project_id, fields="task_only", page_size=PAGE_SIZE):
            _expect(_is_id(task.id) and isinstance(task.data or {}, dict),
                    f"a task with an integer id and a data object, got {task.id!r} and {task.data!r:.80}")
            key = (task.data or {}).get(KEY_FIELD)
            if key is not None:
                if str(key) in keys:
                    repeated.append(str(key))
                keys.setdefault(str(key), task.id)
        if repeated:  # two pushes of the same inputs at once; one push at a time per project avoids it
            logger.warning(f"project {self.title!r} has {len(repeated)} task(s) whose key another task has too, e.g. "
                           f"{repeated[:5]}; answers to either are pulled under the same item.")
        return keys

    @_guarded
    def import_tasks(self, tasks: Sequence[Mapping[str, Any]]) -> list[int]:
        """Importing tasks.

        One import request (atomic on the server); returns the new task ids."""
        response = self.client.projects.import_tasks(id=self.project_id, request=list(tasks), return_task_ids=True)
        ids = response.task_ids or []
        _expect(isinstance(ids, list) and all(_is_id(task_id) for task_id in ids),
                f"'task_ids' a list of integer task ids, got {ids!r:.80}")
        return list(ids)

    @_guarded
    def annotated_tasks(self) -> list[dict[str, Any]]:
        """Reading the annotated tasks.

        Returns `{"id", "data", "annotations", "updated_at"}` for each task with at least one annotation (annotations
        as the server sends them: dicts with `id`, `completed_by`, `result`, `was_cancelled`, `updated_at`, ...)."""
        query = json.dumps({"filters": {"conjunction": "and", "items": [
            {"filter": "filter:tasks:total_annotations", "operator": "greater", "type": "Number", "value": 0}]}})
        tasks = []
        for task in self.client.tasks.list(project=self.project_id, fields="all", query=query, page_size=PAGE_SIZE):
            annotations = [item if isinstance(item, dict) else item.dict() for item in (task.annotations or [])]
            _expect(_is_id(task.id) and isinstance(task.data or {}, dict),
                    f"a task with an integer id and a data object, got {task.id!r} and {task.data!r:.80}")
            for annotation in annotations:
                result = annotation.get("result") or []
                _expect(isinstance(result, list) and all(isinstance(item, dict) and isinstance(item.get("value") or {},
                                                                                               dict) for item in result),
                        f"task {task.id}: an annotation's 'result' a list of objects with a 'value' object, got "
                        f"{result!r:.80}")
            tasks.append({"id": task.id, "data": task.data or {}, "annotations": annotations,
                          "updated_at": None if task.updated_at is None else task.updated_at.isoformat()})
        return tasks

    @_guarded
    def users(self, refresh: bool = False) -> dict[int, str]:
        """Reading the users.

        Each user id mapped to the identity answers are filed under: the user's email (else username, else
        `user-<id>`)."""
        if refresh or not self._users:
            users = list(self.client.users.list())
            _expect(all(_is_id(user.id) and isinstance(user.email or user.username or "", str) for user in users),
                    "users with an integer id and a text email or username, got "
                    f"{[(user.id, user.email) for user in users][:3]!r:.80}")
            self._users = {user.id: user.email or user.username or f"user-{user.id}" for user in users}
        return self._users


def _find_project(client: Any, project: int | str) -> Any | None:
    if isinstance(project, int) or (isinstance(project, str) and project.isdigit()):
        from label_studio_sdk.core.api_error import ApiError

        try:
            return client.projects.get(id=int(project))
        except ApiError as error:
            if error.status_code == 404:
                return None
            raise
    matches = [found for found in client.projects.list(title=project, page_size=100) if found.title == project]
    if len(matches) > 1:
        raise ReviewServerError(f"{len(matches)} projects are titled {project!r} (ids {[m.id for m in matches]}); "
                                "pass the project id instead.")
    return client.projects.get(id=matches[0].id) if matches else None


def connect(
    url: str,
    project: int | str,
    id2label: Mapping[Any, Any] | Sequence[str] | None = None,
    *,
    token_env: str = DEFAULT_TOKEN_ENV,
    create: bool = True,
    timeout: float = 60.0,
    httpx_client: Any = None,
) -> ReviewProject:
    """Connect to a Label Studio project for a deferral model's reviews, creating it if asked.

    Args:
        url (`str`): the server, e.g. `"http://localhost:8080"`.
        project (`int` or `str`): the project id, or its title (unique on the server).
        id2label (`dict` or `list[str]`, *optional*): the model's `config.id2label`: a new project is configured with
            these classes ([`label_config`]); an existing one must offer exactly these. Without it (enough to pull),
            the classes are those the existing project offers.
        token_env (`str`, *optional*, defaults to `"LABEL_STUDIO_API_KEY"`): the environment variable holding the API
            token (a personal access token or a legacy token).
        create (`bool`, *optional*, defaults to True): create a project titled `project` when none exists.
        timeout (`float`, *optional*, defaults to 60): seconds to wait for each request.
        httpx_client (`httpx.Client`, *optional*): the HTTP client for the SDK (tests pass one that replays recorded
            responses).

    Returns:
        [`ReviewProject`].

    Raises:
        ValueError: an empty `url`, an unset `token_env`, or a project whose labelling configuration does not offer the
            model's classes.
        ReviewServerError: the server is unreachable, refuses the token, or the project does not exist and `create` is
            False (or `project` is an id that does not exist).

    Example:

    ```python
    >>> import hf_defer.review as review  # doctest: +SKIP
    >>> project = review.connect("http://localhost:8080", "HateSpeech reviews", model.config.id2label)  # doctest: +SKIP

    ```
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"`url` must be the server's http(s) address, e.g. 'http://localhost:8080', got {url!r}.")
    url = url.rstrip("/")
    token = os.environ.get(token_env)
    if not token:
        raise ValueError(f"the environment variable ${token_env} (`token_env`) holding the Label Studio API token is not "
                         "set; export it (the token is read from the environment only, never from a file or flag).")
    classes = None if id2label is None else model_classes(id2label)
    sdk = _sdk()
    client = sdk.LabelStudio(base_url=url, api_key=token, timeout=timeout, httpx_client=httpx_client)
    try:
        client.users.whoami()  # reachability and the token, before anything else
        found = _find_project(client, project)
        if found is None:
            if not create or classes is None or isinstance(project, int) or str(project).isdigit():
                raise ReviewServerError(f"the Label Studio server at {url} has no project {project!r}; pass an existing "
                                        "project's id or title, or a new title with create=True and the model's "
                                        "id2label.")
            found = client.projects.create(title=str(project), label_config=label_config(classes))
            _expect(_is_id(found.id), f"the created project with an integer id, got {found.id!r}")
            logger.info(f"created the Label Studio project {found.title!r} (id {found.id}) for the classes {classes}.")
            found = client.projects.get(id=found.id)
        _expect(_is_id(found.id) and isinstance(found.title, str) and isinstance(found.label_config or "", str),
                f"a project with an integer id, a title and a labelling configuration, got id {found.id!r}")
    except ReviewServerError:
        raise
    except Exception as error:
        import httpx
        from label_studio_sdk.core.api_error import ApiError

        if isinstance(error, (httpx.HTTPError, ApiError)):
            raise _explain(error, url, token_env, f"opening project {project!r}") from error
        if isinstance(error, _shape_errors()):
            raise _unexpected(error, url, f"opening project {project!r}") from error
        raise
    if classes is None:
        classes = config_classes(found.label_config or "")
    check_label_config(found.label_config or "", classes, f"project {found.title!r} (id {found.id})")
    return ReviewProject(client=client, project_id=found.id, title=found.title, classes=classes, url=url,
                         token_env=token_env)

"""The Label Studio labelling configuration of a deferral model: generated from its `id2label`, and checked against a
project's configuration before anything is pushed or pulled.

The configuration shows the input text, a line with the model's suggestion (class, probability, the expert it routed
the input to) and one single-choice control with one `<Choice>` per class, in class-id order. The control is named
[`CONTROL_NAME`] and reads the object [`OBJECT_NAME`]; pre-annotations and answers refer to both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import quoteattr

__all__ = ["CONTROL_NAME", "OBJECT_NAME", "check_label_config", "config_classes", "label_config", "model_classes"]

CONTROL_NAME = "label"
"""Name of the `<Choices>` control (the `from_name` of every pre-annotation and answer)."""
OBJECT_NAME = "text"
"""Name of the `<Text>` object that shows the input (the `to_name`); it reads the task field `$text`."""


def model_classes(id2label: Mapping[Any, Any] | Sequence[str]) -> list[str]:
    """The class names of a model in class-id order, from its `config.id2label` (keys may be ints or digit strings).

    Raises:
        ValueError: ids that are not 0..K-1, fewer than two classes, or a name that is empty or repeated.

    Example:

    ```python
    >>> from hf_defer.review.labeling import model_classes
    >>> model_classes({"1": "offensive", "0": "neither"})
    ['neither', 'offensive']

    ```
    """
    if isinstance(id2label, Mapping):
        try:
            by_id = {int(key): value for key, value in id2label.items()}
        except (TypeError, ValueError):
            raise ValueError(f"`id2label` keys must be class ids (ints), got {sorted(map(repr, id2label))}.") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise ValueError(f"`id2label` must map the ids 0..K-1 to class names, got ids {sorted(by_id)}.")
        names = [by_id[index] for index in range(len(by_id))]
    elif isinstance(id2label, Sequence) and not isinstance(id2label, str):
        names = list(id2label)
    else:
        raise ValueError(f"`id2label` must be a dict {{id: name}} or a list of class names, got {type(id2label).__name__}.")
    bad = [name for name in names if not isinstance(name, str) or not name.strip()]
    if bad:
        raise ValueError(f"class names must be non-empty strings, got {bad[:5]} in `id2label`.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated or len(names) < 2:
        raise ValueError(f"`id2label` must name at least two distinct classes, got {names}.")
    return names


def label_config(id2label: Mapping[Any, Any] | Sequence[str], title: str | None = None) -> str:
    """The labelling configuration (XML) for a model with these classes.

    Args:
        id2label (`dict` or `list[str]`): the model's `config.id2label`, or its class names in id order.
        title (`str`, *optional*): a heading shown above each task.

    Returns:
        `str`: the XML of a Label Studio project: the `$text` of each task, the model's suggestion and one radio
        choice per class (names are XML-escaped, so any class name is safe).

    Example:

    ```python
    >>> from hf_defer.review import label_config
    >>> print(label_config(["neither", "offensive"]))  # doctest: +NORMALIZE_WHITESPACE
    <View>
      <Header value="Model suggestion: $hf_defer_suggestion (probability $hf_defer_suggestion_score), routed to
        $hf_defer_expert"/>
      <Text name="text" value="$text"/>
      <Choices name="label" toName="text" choice="single-radio" showInline="true" required="true">
        <Choice value="neither"/>
        <Choice value="offensive"/>
      </Choices>
    </View>

    ```
    """
    names = model_classes(id2label)
    lines = ["<View>"]
    if title:
        lines.append(f"  <Header value={quoteattr(title)}/>")
    lines.append('  <Header value="Model suggestion: $hf_defer_suggestion (probability $hf_defer_suggestion_score), '
                 'routed to $hf_defer_expert"/>')
    lines.append(f'  <Text name="{OBJECT_NAME}" value="$text"/>')
    lines.append(f'  <Choices name="{CONTROL_NAME}" toName="{OBJECT_NAME}" choice="single-radio" showInline="true" '
                 'required="true">')
    lines += [f"    <Choice value={quoteattr(name)}/>" for name in names]
    lines += ["  </Choices>", "</View>"]
    return "\n".join(lines)


def config_classes(config: str) -> list[str]:
    """The classes a project's configuration offers in its [`CONTROL_NAME`] control (a choice's `alias` if it has one,
    since that is what answers hold), parsed with label-studio-sdk's `LabelInterface`.

    Raises:
        ValueError: the XML does not parse, or has no `<Choices name="label">` control.
    """
    from label_studio_sdk.label_interface import LabelInterface

    try:
        interface = LabelInterface(config)
    except Exception as error:  # the SDK raises several types for bad XML
        raise ValueError(f"the project's labelling configuration does not parse: {error}") from error
    controls = {control.name: control for control in interface.controls}
    control = controls.get(CONTROL_NAME)
    if control is None or control.tag.lower() != "choices":
        found = sorted(f"<{control.tag} name={name!r}>" for name, control in controls.items())
        raise ValueError(f"the project's labelling configuration has no <Choices name={CONTROL_NAME!r}> control "
                         f"(it has {found or 'no controls'}); create the project with hf_defer.review.label_config.")
    return list(control.labels)


def check_label_config(config: str, id2label: Mapping[Any, Any] | Sequence[str], project: str = "the project") -> None:
    """Check that a project's configuration offers exactly the model's classes.

    Raises:
        ValueError: naming the classes the project lacks and those the model does not have.

    Example:

    ```python
    >>> from hf_defer.review.labeling import check_label_config, label_config
    >>> check_label_config(label_config(["a", "b"]), {0: "a", 1: "b"})  # matches: nothing happens
    >>> check_label_config(label_config(["a", "c"]), ["a", "b"], "project 7")
    Traceback (most recent call last):
    ...
    ValueError: project 7's labelling configuration does not match the model's classes ['a', 'b']: it lacks ['b'] and has ['c'], which the model does not have. Use a project made for this model (hf_defer.review.label_config(model.config.id2label)).

    ```
    """
    expected = model_classes(id2label)
    offered = config_classes(config)
    lacks = [name for name in expected if name not in offered]
    extra = [name for name in offered if name not in expected]
    if lacks or extra:
        parts = ([f"it lacks {lacks}"] if lacks else []) + (
            [f"has {extra}, which the model does not have"] if extra else [])
        raise ValueError(f"{project}'s labelling configuration does not match the model's classes {expected}: "
                         f"{' and '.join(parts)}. Use a project made for this model "
                         "(hf_defer.review.label_config(model.config.id2label)).")

"""The labelling configuration: generated from id2label (checked with the standard library's XML parser, not with the
code under test) and checked against a project's configuration."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from hf_defer.review.labeling import check_label_config, config_classes, label_config, model_classes

AWKWARD = ["a<b", 'say "hi"', "x & y", "naïve 'quote'"]


def test_the_config_offers_each_class_once_in_id_order_whatever_its_characters():
    root = ElementTree.fromstring(label_config({1: AWKWARD[1], 0: AWKWARD[0], 3: AWKWARD[3], 2: AWKWARD[2]}))
    (choices,) = root.iter("Choices")
    assert (choices.get("name"), choices.get("toName"), choices.get("choice")) == ("label", "text", "single-radio")
    assert [choice.get("value") for choice in choices.iter("Choice")] == AWKWARD
    (text,) = root.iter("Text")
    assert (text.get("name"), text.get("value")) == ("text", "$text")
    assert any("$hf_defer_suggestion" in header.get("value") for header in root.iter("Header"))


def test_config_classes_reads_back_the_generated_config_and_an_alias():
    assert config_classes(label_config(AWKWARD)) == AWKWARD
    aliased = ('<View><Text name="text" value="$text"/><Choices name="label" toName="text">'
               '<Choice value="Offensive language" alias="offensive_language"/><Choice value="neither"/></Choices></View>')
    assert config_classes(aliased) == ["offensive_language", "neither"]


def test_a_project_for_other_classes_is_refused_naming_both_sides():
    check_label_config(label_config(["neither", "offensive"]), {0: "neither", 1: "offensive"})
    with pytest.raises(ValueError, match=r"project 'x'.*lacks \['offensive'\] and has \['spam'\]"):
        check_label_config(label_config(["neither", "spam"]), ["neither", "offensive"], "project 'x'")
    with pytest.raises(ValueError, match="no <Choices name='label'> control"):
        check_label_config('<View><Text name="text" value="$text"/></View>', ["a", "b"])
    with pytest.raises(ValueError, match="does not parse"):
        config_classes("<View><Choices")


@pytest.mark.parametrize("bad, message", [({0: "a", 2: "b"}, "ids 0..K-1"), ({"zero": "a"}, "keys must be class ids"),
                                          (["a", "a"], "two distinct"), (["a", ""], "non-empty"), ("ab", "dict")])
def test_model_classes_refuses_what_is_not_an_id2label(bad, message):
    with pytest.raises(ValueError, match=message):
        model_classes(bad)
    assert model_classes({"1": "b", "0": "a"}) == ["a", "b"]

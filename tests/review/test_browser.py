"""A reviewer in a real browser (headless Chromium driven by Selenium through Debian's chromedriver): joins through the
organisation's invite link, opens a pushed task, sees the model's suggestion pre-selected, chooses another class and
submits; `pull` then returns that answer under that reviewer's email."""

from __future__ import annotations

import secrets

import pytest

import hf_defer.review as review
from headless_chromium import chromium_driver

pytestmark = [pytest.mark.review, pytest.mark.browser]
CLASSES = ["hate_speech", "offensive_language", "neither"]


@pytest.fixture
def browser(tmp_path):
    with chromium_driver(tmp_path / "last_page.png", "") as driver:
        yield driver


def test_a_reviewer_answers_in_the_browser_and_pull_returns_the_answer_under_their_identity(label_studio, project_title,
                                                                                          browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    project = review.connect(label_studio.url, project_title, CLASSES)
    suggestion = {"defer": True, "expert": "reviewer", "class_label": "offensive_language", "class_score": 0.62,
                  "scores": {"hate_speech": 0.2, "offensive_language": 0.62, "neither": 0.18}, "expert_accuracy": [0.91]}
    review.push(project, ["you are such a clown lol"], [suggestion], expert_names=["reviewer"], ids=["b1"])
    task_id = project.task_keys()["id:b1"]
    invite = project.client.organizations.invites.get_invite_link().invite_url
    email, password = f"reviewer-{secrets.token_hex(3)}@example.com", secrets.token_urlsafe(12)
    wait = WebDriverWait(browser, 60, poll_frequency=0.5, ignored_exceptions=[StaleElementReferenceException])

    browser.get(f"{label_studio.url}{invite}")
    wait.until(shown.presence_of_element_located((By.NAME, "email"))).send_keys(email)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda driver: "/user/signup" not in driver.current_url)

    browser.get(f"{label_studio.url}/projects/{project.project_id}/data?task={task_id}")
    wait.until(shown.text_to_be_present_in_element(
        (By.TAG_NAME, "body"), "Model suggestion: offensive_language (probability 0.62), routed to reviewer"))

    def radios(driver):
        """The class radios by name, once all are rendered (the pre-annotation loads after the page)."""
        found = {radio.get_attribute("name"): radio  # Label Studio names each choice's radio after its value
                 for radio in driver.find_elements(By.CSS_SELECTOR, "input.ant-radio-input[type=radio]")}
        return found if set(found) == set(CLASSES) else False

    radios = wait.until(radios)
    assert set(radios) == set(CLASSES), f"the classes shown are {sorted(radios)}"
    assert radios["offensive_language"].is_selected(), "the model's suggestion is not pre-selected"
    browser.execute_script("arguments[0].click();", radios["neither"].find_element(By.XPATH, "./ancestor::label"))
    wait.until(lambda driver: driver.find_element(By.CSS_SELECTOR, "input.ant-radio-input[name='neither']").is_selected())
    assert not browser.find_element(By.CSS_SELECTOR, "input.ant-radio-input[name='offensive_language']").is_selected()
    wait.until(shown.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Submit']"))).click()

    def answered(_):
        return len(review.pull(project).table) > 0

    WebDriverWait(browser, 60, poll_frequency=1.0).until(answered)
    table = review.pull(project).table
    assert table[["item", "annotator", "answer"]].values.tolist() == [["id:b1", email, "neither"]]

"""`rlds-writer view` in a real headless Chromium (Debian's), driven by Selenium.

Skips, saying why, where chromium, chromium-driver or selenium is missing;
fails under CI=true (.ci/run installs them). With RLDS_WRITER_SCREENSHOTS=1
the screenshots go to docs/images/ (the ones the docs show); else to a
temporary directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers_browser import console_errors, start_chromium
from helpers_viewer import TASKS, serving, write_robot

import rlds_writer

N = 10
SIZE = 96
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser") / "robot"
    write_robot(path, N, steps=24, size=SIZE)
    return path


@pytest.fixture(scope="module")
def page(robot):
    driver = start_chromium()
    try:
        with serving(robot) as (server, _):
            yield driver, server.url
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    if os.environ.get("RLDS_WRITER_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return DOCS_IMAGES
    return tmp_path_factory.mktemp("screenshots")


def _wait(driver, script, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return " + script)
    )


def _open(driver, url, query=""):
    driver.get(url + query)
    _wait(driver, "document.querySelectorAll('#episodes tbody tr').length > 0")
    _wait(driver, "window.RV && RV.stats && document.querySelectorAll('.plot').length > 0")


def _steps(driver):
    """The step each camera shows and each plot's cursor is at."""
    return driver.execute_script(
        "return [[...document.querySelectorAll('#cameras canvas')].map(c => c.dataset.step),"
        " [...document.querySelectorAll('.plot')].map(p => p.dataset.cursor)]"
    )


def _all_at(driver, step):
    _wait(
        driver,
        f"[...document.querySelectorAll('#cameras canvas')].every(c => c.dataset.step === '{step}')"
        f" && [...document.querySelectorAll('.plot')].every(p => p.dataset.cursor === '{step}')",
    )


def _press(driver, key):
    from selenium.webdriver.common.by import By

    driver.find_element(By.TAG_NAME, "body").send_keys(key)


def _camera_pixels(driver):
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#cameras canvas')].map(c => "
        "Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data))"
    )
    return [np.array(r, np.uint8).reshape(SIZE, SIZE, 4)[..., :3] for r in rows]


def test_page_loads_with_no_console_error(page):
    driver, url = page
    _open(driver, url)
    _all_at(driver, 0)
    assert (
        driver.execute_script("return document.querySelectorAll('#episodes tbody tr').length") == N
    )
    assert driver.execute_script("return document.querySelectorAll('#cameras canvas').length") == 2
    names = driver.execute_script(
        "return [...document.querySelectorAll('.plot')].map(p => p.dataset.field)"
    )
    assert names == ["action", "observation/state", "reward"]
    assert console_errors(driver) == []


def test_right_arrow_moves_both_cameras_and_every_plot_cursor_to_the_same_step(page, robot):
    from selenium.webdriver.common.keys import Keys

    driver, url = page
    _open(driver, url, "?episode=2&step=3")
    _all_at(driver, 3)
    for _ in range(3):
        _press(driver, Keys.ARROW_RIGHT)
    _all_at(driver, 6)
    cameras, cursors = _steps(driver)
    assert cameras == ["6", "6"] and cursors == ["6", "6", "6"]
    assert "step=6" in driver.current_url
    # What each camera shows is its stored frame of that step (JPEG decoders differ a little).
    steps = rlds_writer.open_dataset(robot).episodes("train")[2]["steps"]["observation"]
    shown = _camera_pixels(driver)
    for pixels, name in zip(shown, ("image", "wrist_image")):
        error = np.abs(pixels.astype(int) - steps[name][6].astype(int)).mean()
        off_by_one = np.abs(pixels.astype(int) - steps[name][5].astype(int)).mean()
        assert error < 2 < off_by_one, (name, error, off_by_one)
    # The values beside each plot are the exact ones of that step.
    _wait(driver, "document.querySelector('.plot .value').textContent !== '…'")
    value = driver.execute_script("return document.querySelector('.plot .value').textContent")
    action = rlds_writer.open_dataset(robot).episodes("train")[2]["steps"]["action"][6][0]
    assert float(value) == pytest.approx(float(action), rel=1e-3)
    _press(driver, Keys.ARROW_LEFT)
    _all_at(driver, 5)
    assert console_errors(driver) == []


def test_clicking_a_plot_seeks(page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, url = page
    _open(driver, url, "?episode=1&step=0")
    _all_at(driver, 0)
    length = driver.execute_script("return Number(document.getElementById('scrub').max)") + 1
    overlay = driver.find_elements(By.CSS_SELECTOR, ".plot-overlay")[1]
    width = overlay.size["width"]
    left, right = 52, 8  # the plot's margins (plots.js PAD)
    target = 17
    x = left + target / (length - 1) * (width - left - right)
    ActionChains(driver).move_to_element_with_offset(
        overlay, int(x - width / 2), 0
    ).click().perform()
    _all_at(driver, target)
    assert "step=17" in driver.current_url
    assert console_errors(driver) == []


def test_down_arrow_opens_the_next_episode_and_up_the_previous(page):
    from selenium.webdriver.common.keys import Keys

    driver, url = page
    _open(driver, url, "?episode=4&step=5")
    _all_at(driver, 5)
    _press(driver, Keys.ARROW_DOWN)
    _wait(driver, "document.getElementById('episode-title').textContent.startsWith('episode 5 ')")
    _all_at(driver, 0)
    assert "episode=5" in driver.current_url
    assert (
        driver.execute_script("return document.querySelector('#episodes tr.current').dataset.id")
        == "5"
    )
    assert (
        driver.execute_script("return document.getElementById('instruction').textContent")
        == TASKS[5 % 3]
    )
    _press(driver, Keys.ARROW_UP)
    _press(driver, Keys.ARROW_UP)
    _wait(driver, "document.getElementById('episode-title').textContent.startsWith('episode 3 ')")
    assert console_errors(driver) == []


def test_a_reload_restores_the_episode_and_step(page, screenshots):
    driver, url = page
    _open(driver, url, "?episode=7&step=11")
    _all_at(driver, 11)
    driver.refresh()
    _wait(driver, "document.getElementById('episode-title').textContent.startsWith('episode 7 ')")
    _all_at(driver, 11)
    assert driver.execute_script("return document.getElementById('scrub').value") == "11"
    assert "then let go" not in driver.execute_script(
        "return document.getElementById('step-texts').textContent"
    )
    driver.execute_script("document.getElementById('player').scrollTop = 0")
    driver.save_screenshot(str(screenshots / "viewer-player.png"))
    assert console_errors(driver) == []


def test_a_filter_narrows_the_list(page, screenshots):
    from selenium.webdriver.common.by import By

    driver, url = page
    _open(driver, url, "?episode=3&step=14")
    rows = "document.querySelectorAll('#episodes tbody tr')"
    _wait(driver, f"{rows}.length === {N}")
    driver.find_element(By.ID, "f-text").send_keys("drawer")
    _wait(driver, f"{rows}.length === 3")
    ids = driver.execute_script(f"return [...{rows}].map(r => r.dataset.id)")
    assert ids == ["1", "4", "7"]
    assert driver.find_element(By.ID, "list-status").text == "3 of 10 episodes match"
    driver.execute_script(
        "const box = document.getElementById('f-text'); box.value = '';"
        "box.dispatchEvent(new Event('input'));"
    )
    _wait(driver, f"{rows}.length === {N}")
    # Sorted by return, highest first (a click on the header).
    driver.find_element(By.CSS_SELECTOR, "th[data-sort='return']").click()
    _wait(driver, f"{rows}[0].dataset.id === '9'")
    _all_at(driver, 14)
    driver.save_screenshot(str(screenshots / "viewer-list.png"))
    assert console_errors(driver) == []


def test_playing_shows_every_step_in_order(page):
    driver, url = page
    _open(driver, url, "?episode=0&step=0")
    _all_at(driver, 0)
    driver.execute_script(
        "window.seen = []; const p = history.replaceState.bind(history);"
        "setInterval(() => window.seen.push(document.getElementById('scrub').value), 5);"
    )
    driver.find_element("id", "play").click()
    _wait(driver, "document.getElementById('play').textContent === '▶'")
    last = driver.execute_script("return Number(document.getElementById('scrub').max)")
    _all_at(driver, last)
    seen = [int(s) for s in driver.execute_script("return window.seen")]
    assert seen == sorted(seen) and seen[-1] == last
    assert driver.execute_script("return RV.stats.shown") >= last
    assert console_errors(driver) == []


def test_ci_and_the_image_install_debians_browser():
    root = Path(__file__).resolve().parents[2]
    for name in (".ci/run", "docker/Dockerfile"):
        text = (root / name).read_text()
        assert re.search(r"apt-get install -y[^\n]* chromium chromium-driver", text), name
    setup = (root / "setup.py").read_text()
    assert '"selenium>=' in setup.split('_EXTRAS["test"]', 1)[1]


def test_series_toggles_hide_a_line_in_every_episode(page):
    from selenium.webdriver.common.by import By

    driver, url = page
    _open(driver, url, "?episode=0&step=0")
    _all_at(driver, 0)
    boxes = driver.find_elements(By.CSS_SELECTOR, ".plot[data-field='action'] .series input")
    assert len(boxes) == 7 and all(box.is_selected() for box in boxes)
    boxes[2].click()
    driver.get(url + "?episode=6&step=0")
    _wait(driver, "document.getElementById('episode-title').textContent.startsWith('episode 6 ')")
    boxes = driver.find_elements(By.CSS_SELECTOR, ".plot[data-field='action'] .series input")
    assert [box.is_selected() for box in boxes] == [True, True, False, True, True, True, True]
    boxes[2].click()
    assert console_errors(driver) == []


def test_text_from_the_dataset_is_shown_as_text_never_run(tmp_path):
    import tensorflow_datasets as tfds

    hostile = "<img src=/x onerror=window.pwned=1><script>window.pwned=2</script>"
    config = rlds_writer.DatasetConfig(
        name="texts",
        observation_info=np.float32,
        action_info=np.float32,
        step_metadata_info={"language_instruction": tfds.features.Text()},
        episode_metadata_info={"note": tfds.features.Text()},
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "texts", config) as writer:
        writer.write_episode(
            {
                "observation": np.zeros(3, np.float32),
                "action": np.zeros(2, np.float32),
                "language_instruction": [hostile] * 3,
            },
            episode_metadata={"note": hostile},
        )
    driver = start_chromium()
    try:
        with serving(tmp_path / "texts") as (server, _):
            _open(driver, server.url)
            _all_at(driver, 0)
            assert (
                driver.execute_script("return document.getElementById('instruction').textContent")
                == hostile
            )
            assert hostile in driver.execute_script(
                "return document.getElementById('metadata').textContent"
            )
            assert driver.execute_script("return window.pwned") is None
            assert (
                driver.execute_script(
                    "return document.querySelectorAll('#player img, #list img').length"
                )
                == 0
            )
            assert console_errors(driver) == []
    finally:
        driver.quit()

"""The viewer's pages in real headless Chromium (Debian's, driven by Playwright; no browser download).

One browser for the module, a fresh page per test; every test also checks that no hostile string
ran as script (``window.__pwned``) and that the page logged no error.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import tarfile
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.replay.viewer_store import CHROMIUM, HOSTILE_PATH, XSS, chromium_flags

TIMEOUT_MS = 30_000
# Every wait of a page (actions and expectations alike) gets the same bound: a loaded machine can
# take more than expect's own default of 5 s to answer a click with a fetched detail.
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=chromium_flags())
        yield b
        b.close()


@contextlib.contextmanager
def checked_page(browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield pg
    assert pg.evaluate("window.__pwned") is None, "hostile content ran as script"
    assert not errors, errors
    context.close()


@pytest.fixture
def page(browser, viewer):
    with checked_page(browser) as pg:
        yield pg


def test_runs_list_filters_and_pages(page: Page, viewer, viewer_store):
    page.goto(viewer.url + "/?limit=10")
    rows = page.locator("tr.run-row")
    expect(rows).to_have_count(10)
    page.click("#runs-more")
    expect(rows).to_have_count(20)
    while page.locator("#runs-more").is_visible():
        n = rows.count()
        page.click("#runs-more")
        expect(rows).not_to_have_count(n)
    total = 4 + len(viewer_store.synthetic)
    expect(rows).to_have_count(total)
    expect(page.locator("#runs-more")).to_be_hidden()
    page.select_option("select[name=task]", "bccd-det")
    expect(page).to_have_url(re.compile(r"task=bccd-det"))
    expect(page.locator("#runs-count")).to_contain_text("matching")
    ids = set(page.locator("tr.run-row").evaluate_all("rs => rs.map(r => r.dataset.run)"))
    assert {viewer_store.clean, viewer_store.flawed, viewer_store.hostile} <= ids
    page.fill("input[name=q]", "crash-mid")
    page.click("button[type=submit]")
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("tr.run-row a.run-link")).to_have_text(viewer_store.flawed)


def test_run_page_timeline_events_and_model_call(page: Page, viewer, viewer_store):
    page.goto(viewer.url + f"/runs/{viewer_store.clean}")
    expect(page.locator("#verify-badge")).to_have_text("verified")
    expect(page.locator("#timeline-info")).to_contain_text("real duration")
    # The timeline was drawn: the canvas holds coloured pixels in the model lane.
    painted = page.evaluate(
        """() => { const c = document.getElementById('timeline'); const d = c.getContext('2d')
                  .getImageData(70, 0, c.width - 70, 20).data; let n = 0;
                  for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 200 && d[i] < 100) n++; return n; }"""
    )
    assert painted > 20
    calls = page.locator(".ev[data-kind='model_call.completed']")
    expect(calls.first).to_be_visible()
    calls.first.click()
    detail = page.locator(".detail").first
    expect(detail.locator(".msg .role").first).to_have_text(re.compile("^system"))
    expect(detail.locator(".reply .tool-call")).to_contain_text("execute_code(")
    detail.locator("button[data-tab='raw request']").click()
    expect(detail.locator("pre.raw")).to_contain_text('"messages"')
    detail.locator("button[data-tab='raw response']").click()
    expect(detail.locator("pre.raw")).to_contain_text("chat.completion")
    expect(page.locator("#scores .kv").first).to_contain_text("OVERALL")


def test_deep_link_opens_at_an_event_deep_in_a_big_run(page: Page, viewer, viewer_store):
    key = "shim:88888"
    page.goto(viewer.url + f"/runs/{viewer_store.big}#{key}")
    target = page.locator(f"[id='ev-{key}']")
    expect(target).to_have_class(re.compile("target"))
    expect(target).to_be_in_viewport()
    assert page.locator(".ev").count() <= 600  # only a window of the run is in the page
    # Scrolling down pages more events in after the window.
    last_before = page.locator(".ev").last.get_attribute("data-key")
    page.locator("#events").evaluate("e => e.scrollTop = e.scrollHeight")
    expect(page.locator(".ev").last).not_to_have_attribute("data-key", last_before or "")
    # And scrolling up pages earlier ones in before it.
    first_before = page.locator(".ev").first.get_attribute("data-key")
    page.locator("#events").evaluate("e => e.scrollTop = 0")
    expect(page.locator(".ev").first).not_to_have_attribute("data-key", first_before or "")
    # The timeline marks where the list is.
    expect(page.locator("#timeline-info")).to_contain_text("events from")


def test_audit_finding_link_lands_on_the_cited_event(page: Page, viewer, viewer_store):
    page.goto(viewer.url + f"/runs/{viewer_store.hostile}")
    link = page.locator("#scores li.violation a.cite").first
    expect(link).to_have_text(viewer_store.hostile_private_key)
    link.click()
    target = page.locator(f"[id='ev-{viewer_store.hostile_private_key}']")
    expect(target).to_have_class(re.compile("target"))
    expect(target).to_contain_text("/data/private/")


def test_a_scanners_finding_links_to_its_event_and_the_runs_filter_by_scanner(
    page: Page, viewer, viewer_store
):
    page.goto(viewer.url + f"/runs/{viewer_store.hostile}")
    scan = page.locator("#scores .scan[data-scanner='audit']")
    expect(scan).to_contain_text("private_access")
    link = scan.locator("li.finding a.cite").first
    expect(link).to_have_text(viewer_store.hostile_private_key)
    link.click()
    target = page.locator(f"[id='ev-{viewer_store.hostile_private_key}']")
    expect(target).to_have_class(re.compile("target"))
    # A finding that repeats the agent's markup shows it as text, and runs none of it.
    echo = page.locator("#scores .scan[data-scanner='echo_model'] li.finding")
    expect(echo).to_contain_text(XSS)
    assert echo.locator("img, script").count() == 0
    assert page.evaluate("window.__pwned") is None
    page.goto(viewer.url + "/")
    page.select_option("select[name=scanner]", "audit")
    expect(page).to_have_url(re.compile(r"scanner=audit"))
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("tr.run-row a.run-link")).to_have_text(viewer_store.hostile)
    page.fill("input[name=scan_value]", "private_access")
    page.click("button[type=submit]")
    expect(page.locator("tr.run-row")).to_have_count(1)
    page.fill("input[name=scan_value]", "no-such-value")
    page.click("button[type=submit]")
    expect(page.locator("tr.run-row")).to_have_count(0)


def test_hostile_strings_render_as_text(page: Page, viewer, viewer_store):
    page.goto(viewer.url + f"/runs/{viewer_store.hostile}")
    expect(page.locator(".ev").first).to_be_visible()
    expect(page.locator("#run-header")).to_contain_text(XSS)  # the header comes after the first events
    page.locator(".ev[data-kind='model_call.completed']").first.click()
    detail = page.locator(".detail").first
    expect(detail.locator("pre.reply-text")).to_have_text(XSS)
    expect(detail.locator("img.preview")).to_have_count(1)  # the request's inline image, from the server
    image = detail.locator("img.preview")
    # Loaded asynchronously: its size is known once it is complete.
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=image.element_handle())
    assert image.evaluate("i => i.naturalWidth") == 8
    page.locator(".ev[data-kind='file.written']").first.click()
    expect(page.locator(".detail .file-text").first).to_contain_text("<script>")
    assert page.locator("script").count() == 1 and page.locator("svg").count() == 0


def test_diff_with_itself_is_empty(page: Page, viewer, viewer_store):
    page.goto(viewer.url + f"/diff?a={viewer_store.clean}&b={viewer_store.clean}")
    expect(page.locator("#divergence")).to_have_text("The two runs take identical steps.")
    assert set(page.locator("#diff-rows tr").evaluate_all("rs => rs.map(r => r.dataset.op)")) == {"same"}


def test_diff_of_clean_and_flawed_shows_first_divergence(page: Page, viewer, viewer_store):
    page.goto(viewer.url + f"/diff?a={viewer_store.clean}&b={viewer_store.flawed}")
    expect(page.locator("#divergence")).to_contain_text("First divergence at step row")
    first = page.locator("#diff-rows tr.first-divergence")
    expect(first).to_have_count(1)
    expect(first).to_have_attribute("data-op", "changed")
    expect(first).to_contain_text("code")  # the changed argument
    expect(page.locator("#diff-outcomes")).to_contain_text(re.compile("differs|only_a|only_b"))


def test_grid_of_a_task_links_each_run(page: Page, viewer, viewer_store):
    page.goto(viewer.url + "/grid?task=bccd-det")
    grid = page.locator("#grid")
    expect(grid.locator("th").first).to_have_text("agent · model")
    expect(grid.locator("th").nth(1)).to_have_text("run 1")
    expect(grid.locator(f"a.cell[href='/runs/{viewer_store.flawed}']")).to_have_count(1)


def test_the_workspace_and_a_file_at_an_event_download(page: Page, viewer, viewer_store):
    """The run page offers the workspace at an event (a tar) and a file's version then: the same
    query as `amb checkout` / `amb files`, every byte checked, hostile names kept out of headers."""
    page.goto(viewer.url + f"/runs/{viewer_store.hostile}")
    # The events come first and the header, scores, timeline and verify after them: their answers
    # re-lay the page out, so the row is clicked once they are in (on a loaded machine a detail
    # opened while they arrived was once not found within 30 s).
    page.wait_for_load_state("networkidle")
    page.locator(".ev[data-kind='file.written']").nth(2).click()  # notes.html, the third file
    detail = page.locator(".detail").first
    file_href = detail.locator("a.workspace-file").get_attribute("href")
    tar_href = detail.locator("a.workspace-tar").get_attribute("href")
    assert file_href and tar_href
    got = page.request.get(viewer.url + file_href)
    assert got.status == 200 and got.body() == XSS.encode()
    assert got.headers["content-disposition"] == 'attachment; filename="notes.html"'
    listing = page.request.get(viewer.url + tar_href.replace("workspace.tar", "workspace")).json()
    got = page.request.get(viewer.url + tar_href)
    assert got.status == 200 and got.headers["x-amb-not-kept"] == "0"
    with tarfile.open(fileobj=io.BytesIO(got.body())) as tar:
        members = {m.name: _read(tar, m) for m in tar.getmembers()}
    assert members["notes.html"] == XSS.encode()
    assert {f["path"]: f["size"] for f in listing["files"]} == {n: len(b) for n, b in members.items()}
    assert set(members) == {HOSTILE_PATH, "plots/figure.png", "notes.html"}
    # At the first file's event only that file existed; a path that is not there is a 404.
    first = page.request.get(f"{viewer.url}/api/runs/{viewer_store.hostile}/workspace?at=shim:0")
    assert [f["path"] for f in first.json()["files"]] == [HOSTILE_PATH]
    missing = page.request.get(viewer.url + file_href.replace("notes.html", "nope.txt"))
    assert missing.status == 404


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    assert f is not None, f"{member.name} is not a regular file"
    return f.read()


def test_an_unknown_cost_reads_unknown_never_zero(page: Page, viewer, viewer_store):
    # The baseline's model is in no price table: its cost is unknown, in the list and on its page.
    page.goto(viewer.url + f"/runs/{viewer_store.clean}")
    cost = page.locator("span", has=page.locator("b", has_text=re.compile("^cost$")))
    expect(cost).to_have_text("costunknown")
    page.goto(viewer.url + "/?limit=10")
    row = page.locator(f"tr.run-row[data-run='{viewer_store.clean}']")
    expect(row).to_have_count(1)
    headers = page.locator("thead th").all_inner_texts()
    expect(row.locator("td").nth(headers.index("cost $"))).to_have_text("unknown")


def test_a_gemini_calls_messages_function_calls_and_image_render(browser, genai_run):
    """A call of the google-genai agent: its user turn, the model's turn with its function call,
    the function response, and the reply; and the inline PNG of another call, served decoded."""
    from replay.web.server import Running

    with Running(genai_run.store) as viewer, checked_page(browser) as page:
        page.goto(viewer.url + f"/runs/{genai_run.run_id}")
        calls = page.locator(".ev[data-kind='model_call.completed']")
        expect(calls).to_have_count(7)
        calls.nth(1).click()  # the second request: it carries the first turn's function call and its answer
        detail = page.locator(".detail").first
        roles = detail.locator(".messages .msg .role")
        expect(roles).to_have_text(["user", "assistant", "tool"])
        expect(detail.locator(".messages .msg").first).to_contain_text("read notes.md")
        expect(detail.locator(".messages .tool-call")).to_contain_text('read_file({"path"')
        expect(detail.locator(".messages .tool-result")).to_contain_text("notes: ok")
        expect(detail.locator(".reply .reply-text")).to_contain_text("Hello from the fake upstream")
        calls.nth(4).click()  # the call with the inline image
        image = page.locator(".detail img.preview").first
        expect(image).to_be_visible()
        page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=image.element_handle())
        assert image.evaluate("i => i.naturalWidth") == 160
        served = page.request.get(viewer.url + (image.get_attribute("src") or ""))
        assert served.headers["content-type"] == "image/png"
        assert hashlib.sha256(served.body()).hexdigest() == genai_run.client["image_sha256"]  # as sent

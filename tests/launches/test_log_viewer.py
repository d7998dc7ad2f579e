"""The log viewer's reads (issue 21, item 1): windows of stored lines by sequence number, filters
by level, rank, node (a multi-node launch's, issue 22) and the diagnosis's evidence, search over the
whole log; bad input is a 400 that says what is taken."""

from __future__ import annotations

import pytest
from django.urls import reverse

from nodes.domain.log_lines import level_of, rank_of
from nodes.models import LaunchLogLine
from nodes.models.choices import LaunchStatus
from nodes.services import log_view
from tests.factories import make_node
from tests.launches.test_views_launches import make_launch, node, revision  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def _text(i: int) -> str:
    if i % 1000 == 0:
        return f"[2026-01-01 00:00:00 TP{i % 3}] RuntimeError: needle number {i}"
    if i % 250 == 0:
        return f"[2026-01-01 00:00:00 TP1] WARNING: slow step at line {i}"
    if i % 10 == 0:
        return "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 4, #token: 900"
    return f"[2026-01-01 00:00:00 TP{i % 2}] line {i}"


@pytest.fixture
def long_log(node, revision):  # noqa: F811
    launch = make_launch(
        revision,
        node,
        status=LaunchStatus.FAILED,
        last_seq=10_000,
        log_complete=True,
        diagnosis={"category": "x", "evidence": [{"line": 3000, "text": "t"}, {"line": 7}]},
    )
    LaunchLogLine.objects.bulk_create(
        (
            LaunchLogLine(launch=launch, seq=i, text=t, level=level_of(t), rank=rank_of(t))
            for i in range(1, 10_001)
            for t in [_text(i)]
        ),
        batch_size=2000,
    )
    return launch


def _lines(client, launch, query: str) -> dict:
    answer = client.get(reverse("nodes:launch-lines", args=[launch.pk]) + query)
    assert answer.status_code == 200, answer.content
    return dict(answer.json())


def test_windows_after_before_and_around_a_line(viewer_client, long_log):
    last = _lines(viewer_client, long_log, "?limit=100")
    assert [r[0] for r in last["lines"]] == list(range(9901, 10_001))
    assert last["more_before"] and not last["more_after"] and last["ended"]
    earlier = _lines(viewer_client, long_log, "?before=9901&limit=50")
    assert [r[0] for r in earlier["lines"]] == list(range(9851, 9901)) and earlier["more_after"]
    around = _lines(viewer_client, long_log, "?around=5000&limit=10")
    assert [r[0] for r in around["lines"]] == list(range(4995, 5005))
    assert around["lines"][5][1].endswith("needle number 5000") and around["lines"][5][2] == 2
    first = _lines(viewer_client, long_log, "?after=0&limit=3")
    assert [r[0] for r in first["lines"]] == [1, 2, 3] and not first["more_before"]
    # A window is bounded: 1,000 lines at most, and more is a 400 that says so (as the API's).
    assert len(_lines(viewer_client, long_log, "?after=0&limit=1000")["lines"]) == 1000
    too_many = viewer_client.get(reverse("nodes:launch-lines", args=[long_log.pk]), {"limit": 1001})
    assert too_many.status_code == 400


def test_filters_by_level_rank_and_evidence(viewer_client, long_log):
    errors = _lines(viewer_client, long_log, "?level=error")["lines"]
    assert [r[0] for r in errors] == list(range(1000, 10_001, 1000))
    flagged = _lines(viewer_client, long_log, "?level=warning&before=2000")["lines"]
    assert [r[0] for r in flagged] == [250, 500, 750, 1000, 1250, 1500, 1750]
    tp1_errors = _lines(viewer_client, long_log, "?level=error&rank=TP1")["lines"]
    assert [r[0] for r in tp1_errors] == [1000, 4000, 7000, 10_000]
    assert {r[3] for r in tp1_errors} == {"TP1"}
    evidence = _lines(viewer_client, long_log, "?evidence=1")["lines"]
    assert [r[0] for r in evidence] == [7, 3000]


def test_search_over_the_whole_log_counts_and_lists_matches(viewer_client, long_log):
    url = reverse("nodes:launch-search", args=[long_log.pk])
    found = viewer_client.get(url, {"q": "NEEDLE number"}).json()
    assert found["count"] == 10
    assert [m[0] for m in found["matches"]] == list(range(1000, 10_001, 1000))
    many = viewer_client.get(url, {"q": "line"}).json()
    # 9,000 plain lines and 30 warnings name a line.
    assert many["count"] == 9030 and len(many["matches"]) == 200 and many["more"]
    # The matches after the listed ones, a page at a time, to the last.
    seen, after = [m[0] for m in many["matches"]], many["matches"][-1][0]
    while True:
        page = viewer_client.get(url, {"q": "line", "after": after}).json()
        seen += [m[0] for m in page["matches"]]
        if not page["more"]:
            break
        after = page["matches"][-1][0]
    assert len(seen) == 9030 and seen == sorted(set(seen)) and not found["more"]
    within = viewer_client.get(url, {"q": "needle", "rank": "TP0"}).json()
    assert [m[0] for m in within["matches"]] == [3000, 6000, 9000]


def test_search_folds_case_beyond_ascii(viewer_client, node, revision):  # noqa: F811
    """SQLite's LIKE folds ASCII only: ``äö`` did not find ``ÄÖ`` on the default database."""
    launch = make_launch(revision, node)
    texts = ["Modell GRÖSSE geladen", "ÄÖ-Prüfung bestanden", "nothing here", "straße ok"]
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=launch, seq=i, text=t) for i, t in enumerate(texts, start=1)
    )
    url = reverse("nodes:launch-search", args=[launch.pk])
    assert [m[0] for m in viewer_client.get(url, {"q": "äö"}).json()["matches"]] == [2]
    assert [m[0] for m in viewer_client.get(url, {"q": "grösse"}).json()["matches"]] == [1]
    # Regular-expression characters in the text are only text.
    assert viewer_client.get(url, {"q": "ö-p.*"}).json()["count"] == 0


@pytest.mark.parametrize(
    ("where", "query", "said"),
    [
        ("nodes:launch-search", {"q": "x"}, "search for 2 to 200 characters"),
        ("nodes:launch-search", {"q": "a\x00b"}, "a search cannot hold a NUL character"),
        (
            "nodes:launch-search",
            {"q": "ab", "after": "-1"},
            "after is a whole number from 0 to 2,147,483,647",
        ),  # fmt: skip
        ("nodes:launch-search", {"q": "ab", "level": "loud"}, "level is warning or error"),
        ("nodes:launch-lines", {"level": "info"}, "level is warning or error"),
        ("nodes:launch-lines", {"rank": "T" * 40}, "rank is a prefix such as TP3"),
        ("nodes:launch-lines", {"rank": "TP1\x00"}, "rank is a prefix such as TP3"),
        ("nodes:launch-lines", {"evidence": "yes"}, "evidence is 1 or 0"),
        ("nodes:launch-lines", {"node": "n" * 65}, "node is a node's name (at most 64 characters)"),
        (
            "nodes:launch-search",
            {"q": "ab", "node": "gpu\x00"},
            "node is a node's name (at most 64 characters)",
        ),  # fmt: skip
    ],
)
def test_bad_viewer_input_is_a_clear_400(viewer_client, long_log, where, query, said):
    answer = viewer_client.get(reverse(where, args=[long_log.pk]), query)
    assert answer.status_code == 400 and answer.json() == {"error": said}


@pytest.mark.parametrize(
    ("query", "said"),
    [
        # Found by a helper: digits Python's isdigit() takes and int() refuses were a 500, and
        # then were read as no number at all: the last lines came back for any of these.
        *[
            (bad, f"{bad[1:].split('=')[0]} is a whole number from 0 to 2,147,483,647")
            for bad in (
                "?after=-5",
                "?before=abc",
                "?around=1e9",
                "?after=²",
                "?around=٣",
                "?before=99999999999",
                "?after=2147483648",
                "?after=",
            )  # fmt: skip
        ],
        ("?limit=0", "limit is a whole number from 1 to 1,000"),
        ("?limit=1001", "limit is a whole number from 1 to 1,000"),
        ("?after=5&before=9", "give one of after, before and around"),
    ],
)
def test_numbers_that_are_not_line_numbers_are_a_clear_400(viewer_client, long_log, query, said):
    answer = viewer_client.get(reverse("nodes:launch-lines", args=[long_log.pk]) + query)
    assert answer.status_code == 400 and answer.json() == {"error": said}


def test_a_launch_the_reader_cannot_see_is_a_json_404(viewer_client, long_log):
    for where in ("nodes:launch-lines", "nodes:launch-search"):
        answer = viewer_client.get(reverse(where, args=[long_log.pk + 1]), {"q": "needle"})
        assert answer.status_code == 404 and answer.json() == {"error": "No such launch."}


def test_the_page_opens_with_the_last_thousand_lines_and_the_ranks(viewer_client, long_log):
    page = viewer_client.get(reverse("nodes:launch-detail", args=[long_log.pk])).content.decode()
    assert page.count('<span data-seq="') == 1000 and 'id="line-10000"' in page
    assert 'id="line-9000"' not in page and 'data-more-before="true"' in page
    assert "<option>TP0</option><option>TP1</option><option>TP2</option>" in page
    # One node: no Node select, no node tags.
    assert 'id="log-node"' not in page and "node-tag" not in page


def test_a_window_before_the_end_knows_nothing_follows(viewer_client, long_log):
    doc = _lines(viewer_client, long_log, "?before=2000000000&limit=3")
    assert [r[0] for r in doc["lines"]] == [9998, 9999, 10_000] and not doc["more_after"]
    assert _lines(viewer_client, long_log, "?before=9999&limit=3")["more_after"]


@pytest.mark.parametrize(
    "evidence", [5, True, "lines", [{"line": 10**20}, {"line": True}, {"line": "7"}, 3]]
)
def test_a_malformed_diagnosis_filters_to_no_evidence_and_the_page_renders(
    viewer_client, long_log, evidence
):
    long_log.diagnosis = {"category": "x", "evidence": evidence}
    long_log.save()
    assert _lines(viewer_client, long_log, "?evidence=1")["lines"] == []
    search = reverse("nodes:launch-search", args=[long_log.pk])
    assert viewer_client.get(search, {"q": "line", "evidence": "1"}).json()["count"] == 0
    page = viewer_client.get(reverse("nodes:launch-detail", args=[long_log.pk]))
    assert page.status_code == 200 and b'class="evidence"' not in page.content


def test_the_download_says_where_lines_were_not_kept_at_the_end(viewer_client, long_log):
    LaunchLogLine.objects.filter(launch=long_log, seq__gt=9990).delete()
    download = viewer_client.get(reverse("nodes:launch-log", args=[long_log.pk]))
    text = b"".join(download.streaming_content).decode()
    assert text.endswith("[rankwise: lines 9991–10000 were not kept]\n")


def test_whoever_may_read_the_lines_may_follow_them_live(long_log, panel):
    from django.test import Client

    from tests.factories import make_user
    from tests.sse import events

    nora = make_user("nora", None)  # no role: she may open the page and read its lines
    reader = Client()
    reader.force_login(nora)  # type: ignore[arg-type]
    assert reader.get(reverse("nodes:launch-lines", args=[long_log.pk])).status_code == 200
    url = panel.url + reverse("nodes:launch-events", args=[long_log.pk])
    got = list(events(url, panel.cookie_for(nora)))  # an ended launch: every line, then the end
    seqs = [seq for e in got if e.name == "lines" for seq, _ in e.lines()]
    assert seqs == list(range(1, 10_001)) and got[-1].name == "end"
    with pytest.raises(OSError, match="HTTP 403"):
        list(events(url, ""))


def _ask(url: str, cookie: str, method: str = "GET", **headers: str) -> tuple[int, str]:
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path, headers={"Cookie": cookie, **headers})
        answer = connection.getresponse()
        return answer.status, answer.read(200).decode()
    finally:
        connection.close()


def test_the_stream_takes_get_and_sequence_numbers_only(long_log, panel):
    # Found by a helper: a HEAD held a stream open on the server that no client read, until
    # the launch ended; a garbage Last-Event-ID replayed the whole log from line 1.
    from tests.factories import make_user

    cookie = panel.cookie_for(make_user("nora", None))
    url = panel.url + reverse("nodes:launch-events", args=[long_log.pk])
    assert _ask(url, cookie, "HEAD")[0] == 405
    assert _ask(url, cookie, "OPTIONS") == (405, "This stream is read with GET.")
    for garbage in ("abc", "-5", "99999999999999999999999", "１２"):
        status, said = _ask(url, cookie, **{"Last-Event-ID": garbage.encode().decode("latin-1")})
        assert (status, said) == (400, "Last-Event-ID is a whole number from 0 to 2,147,483,647")
    assert _ask(url + "?after=x", cookie)[0] == 400


def test_a_stream_ends_once_its_launch_is_hidden_from_the_reader(long_log, panel):
    # Found by a helper: visibility was checked only when the stream opened, so a profile made
    # team-only went on streaming to whoever had its page open.
    import time

    from nodes.models import Team
    from nodes.views.launch_log import RECHECK_S
    from tests.factories import make_user
    from tests.sse import events

    long_log.status, long_log.log_complete = LaunchStatus.READY, False
    long_log.save()
    url = panel.url + reverse("nodes:launch-events", args=[long_log.pk])
    stream = events(url, panel.cookie_for(make_user("nora", None)))
    assert next(stream).name == "lines"
    profile = long_log.revision.profile
    profile.team, profile.visibility = Team.objects.create(name="alpha"), "team"
    profile.save()
    hidden = time.monotonic()
    rest = [e.name for e in stream]
    assert "end" not in rest and time.monotonic() - hidden < RECHECK_S + 5


@pytest.fixture
def group_log(node, revision):  # noqa: F811
    """A launch over three nodes (gpu-01 is node 0; the parts were made out of order): its 30
    lines, printed in turn by gpu-01, gpu-02 and gpu-03, stored on the group's launch."""
    primary = make_launch(revision, node, status=LaunchStatus.STOPPED, last_seq=30,
                          log_complete=True)  # fmt: skip
    make_launch(revision, make_node("gpu-03"), group=primary, node_rank=2)
    make_launch(revision, make_node("gpu-02"), group=primary, node_rank=1)
    names = ["gpu-01", "gpu-02", "gpu-03"]
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(launch=primary, seq=i, text=t, level=level_of(t), rank=rank_of(t), node=n)
        for i in range(1, 31)
        for n in [names[(i - 1) % 3]]
        for t in [
            f"[2026-01-01 00:00:00 TP{(i - 1) % 3 * 2}] "
            + (f"RuntimeError: {n} gave up" if i % 10 == 0 else f"line {i}")
        ]
    )
    return primary


def test_a_multi_node_launchs_rows_carry_their_node_and_filter_by_it(viewer_client, group_log):
    assert log_view.nodes(group_log) == ["gpu-01", "gpu-02", "gpu-03"]
    first = _lines(viewer_client, group_log, "?after=0&limit=4")["lines"]
    assert first == [
        [1, "[2026-01-01 00:00:00 TP0] line 1", 0, "TP0", "gpu-01"],
        [2, "[2026-01-01 00:00:00 TP2] line 2", 0, "TP2", "gpu-02"],
        [3, "[2026-01-01 00:00:00 TP4] line 3", 0, "TP4", "gpu-03"],
        [4, "[2026-01-01 00:00:00 TP0] line 4", 0, "TP0", "gpu-01"],
    ]
    on_b = _lines(viewer_client, group_log, "?node=gpu-02")["lines"]
    assert [r[0] for r in on_b] == list(range(2, 31, 3)) and {r[4] for r in on_b} == {"gpu-02"}
    assert _lines(viewer_client, group_log, "?node=gpu-02&rank=TP0")["lines"] == []
    errors = _lines(viewer_client, group_log, "?node=gpu-03&level=error")["lines"]
    assert [r[0] for r in errors] == [30]
    assert _lines(viewer_client, group_log, "?node=gpu-09")["lines"] == []
    search = reverse("nodes:launch-search", args=[group_log.pk])
    found = viewer_client.get(search, {"q": "gave up", "node": "gpu-01"}).json()
    assert [m[0] for m in found["matches"]] == [10] and found["matches"][0][4] == "gpu-01"
    assert viewer_client.get(search, {"q": "gave up"}).json()["count"] == 3


def test_a_multi_node_download_names_each_lines_node(viewer_client, group_log, long_log):
    download = viewer_client.get(reverse("nodes:launch-log", args=[group_log.pk]))
    text = b"".join(download.streaming_content).decode().splitlines()
    assert text[:3] == [
        "[gpu-01] [2026-01-01 00:00:00 TP0] line 1",
        "[gpu-02] [2026-01-01 00:00:00 TP2] line 2",
        "[gpu-03] [2026-01-01 00:00:00 TP4] line 3",
    ]
    assert (
        len(text) == 30
        and text[-1] == "[gpu-03] [2026-01-01 00:00:00 TP4] RuntimeError: gpu-03 gave up"
    )
    one = viewer_client.get(reverse("nodes:launch-log", args=[long_log.pk]))
    assert b"".join(one.streaming_content).startswith(b"[2026-01-01 00:00:00 TP1] line 1\n")


def test_the_page_of_a_multi_node_launch_offers_its_nodes_and_tags_each_line(
    viewer_client, group_log
):
    page = viewer_client.get(reverse("nodes:launch-detail", args=[group_log.pk])).content.decode()
    assert (
        '<select id="log-node"><option value="">all</option><option>gpu-01</option>'
        "<option>gpu-02</option><option>gpu-03</option></select>"
    ) in page
    assert (
        '<span data-seq="2" id="line-2" data-node="gpu-02"><span class="node-tag">gpu-02</span>'
        "[2026-01-01 00:00:00 TP2] line 2\n</span>"
    ) in page
    # A part's own page: its lines are the group's, so it offers no nodes of its own.
    part = group_log.parts.get(node_rank=1)
    assert log_view.nodes(part) == []

"""The HTML report's runs table links each run into the viewer (``amb report --viewer-url``)."""

from __future__ import annotations

from scorer import report, report_html


def test_runs_link_into_the_viewer_escaped():
    rows = [
        {
            "run_id": 'r"<b>1',
            "task": "kidney-seg",
            "tier": "lite",
            "model": "m",
            "status": "completed",
            "overall": 0.5,
            "codes": ["E4"],
        },
    ]
    page = report_html.html_page(
        report.build(
            [
                {
                    **rows[0],
                    "track": "segmentation",
                    "agentic": 0.5,
                    "task_score": 0.5,
                    "s1": 1,
                    "s2": 1,
                    "s3": 1,
                    "s4": 1,
                    "s5": 1,
                    "cost_usd": 1.0,
                    "turns": 3,
                    "judge": "j",
                    "profile_name": "p",
                    "profile_id": "x",
                }
            ]
        ),
        runs=rows,
        viewer_url="http://127.0.0.1:8765/",
    )
    assert 'href="http://127.0.0.1:8765/runs/r%22%3Cb%3E1"' in page
    assert "r&quot;&lt;b&gt;1</a>" in page and "<b>1" not in page
    bare = report_html.html_page(report.build([]), runs=rows)
    assert "<a " not in bare.split('id="runs"')[1]

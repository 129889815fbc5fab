//! The JUnit XML rendering of a report (`--junit`), for CI systems that show test results:
//! one test suite `llm-replay` with a `run` test case and one test case per goal.

use std::fmt::Write as _;

use super::Report;
use super::escape::xml;
use super::format;

/// Render `report` as JUnit XML.
///
/// The `run` test case fails only when requests were issued and none succeeded (the run
/// measured nothing); error counts alone do not fail it, since goals such as
/// `llm.error-rate > 1` are how a user says how many errors are too many. Each goal is a test
/// case that fails when the goal failed, with the value and threshold in the failure message.
pub fn render_junit(report: &Report) -> String {
    let r = &report.requests;
    let run_failed = r.total > 0 && r.succeeded == 0;
    let tests = 1 + report.goals.len();
    let failures = usize::from(run_failed) + report.goals.iter().filter(|g| g.failed).count();
    let time = format!("{:.3}", report.run.duration_s);

    let mut out = String::new();
    let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        out,
        "<testsuites name=\"llm-replay\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" time=\"{time}\">"
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"llm-replay\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{time}\" timestamp=\"{}\">",
        xml(&report.run.started_at)
    );
    let _ = writeln!(
        out,
        "    <properties>\n      <property name=\"run.id\" value=\"{}\"/>\n      <property name=\"target\" value=\"{}\"/>\n    </properties>",
        xml(&report.run.id),
        xml(&report.run.target)
    );

    let _ = writeln!(
        out,
        "    <testcase classname=\"llm-replay\" name=\"run\" time=\"{time}\">"
    );
    if run_failed {
        let _ = writeln!(
            out,
            "      <failure type=\"run\" message=\"no request succeeded ({} issued, {} failed, {} ended early, {} lost, {} not started)\"/>",
            r.total, r.failed, r.ended_early, r.lost, r.not_started
        );
    }
    let mut summary = format!(
        "requests {}; failed by kind: {}; output tokens/s {}; requests/s {}",
        format::total_line(report),
        format::failed_by_kind(report),
        format::rate(report.llm.output_tokens_per_second),
        format::rate(report.llm.requests_per_second)
    );
    if let Some(goodput) = &report.goodput {
        let _ = write!(
            summary,
            "; goodput {:.2} requests/s ({} good within {})",
            goodput.requests_per_second,
            format::pct(goodput.good_share_pct),
            goodput.slos.join(", ")
        );
    }
    if let Some(capacity) = &report.capacity {
        let _ = write!(summary, "; {}", format::capacity_answer(capacity));
    }
    let _ = writeln!(out, "      <system-out>{}</system-out>", xml(&summary));
    let _ = writeln!(out, "    </testcase>");

    for goal in &report.goals {
        let name = xml(&goal.expr);
        if goal.failed {
            let detail = match (&goal.value, &goal.note) {
                (None, Some(note)) => format!("{}: {note}", goal.metric),
                _ => format!(
                    "{} = {} (the goal fails if {} {})",
                    goal.metric,
                    format::goal_number(goal.value),
                    goal.op,
                    format::goal_number(Some(goal.threshold))
                ),
            };
            let _ = writeln!(
                out,
                "    <testcase classname=\"llm-replay.goals\" name=\"{name}\" time=\"0\">\n      <failure type=\"goal\" message=\"{}\"/>\n    </testcase>",
                xml(&detail)
            );
        } else {
            let _ = writeln!(
                out,
                "    <testcase classname=\"llm-replay.goals\" name=\"{name}\" time=\"0\">\n      <system-out>{} = {}</system-out>\n    </testcase>",
                xml(&goal.metric),
                format::goal_number(goal.value)
            );
        }
    }
    let _ = writeln!(out, "  </testsuite>\n</testsuites>");
    out
}

//! The error summary as the renderers show it: one row per kind, status and message, most
//! frequent first, the message cleaned once more (a saved report read back may hold anything).

use common::metrics::clean_message;

use super::{ErrorEntry, Report};

/// Rows shown at most; the rest are summed into one "other" row.
pub(super) const MAX_ROWS: usize = 12;

/// One row of the error summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ErrorRow {
    /// `status 400`, `error_frame`, `transport`, `timeout 504`.
    pub what: String,
    pub count: u64,
    /// The message, cleaned; `—` when there was none.
    pub message: String,
}

/// The rows of `report`'s error summary (empty when nothing failed).
pub(super) fn error_rows(report: &Report) -> Vec<ErrorRow> {
    let entries = &report.requests.errors;
    let mut rows: Vec<ErrorRow> = entries.iter().take(MAX_ROWS).map(row).collect();
    let rest: u64 = entries.iter().skip(MAX_ROWS).map(|e| e.count).sum();
    if rest > 0 {
        rows.push(ErrorRow {
            what: "other".to_owned(),
            count: rest,
            message: format!(
                "{} more kinds, statuses or messages",
                entries.len() - MAX_ROWS
            ),
        });
    }
    rows
}

fn row(entry: &ErrorEntry) -> ErrorRow {
    let kind = clean_message(&entry.kind);
    ErrorRow {
        what: match entry.status {
            Some(status) => format!("{kind} {status}"),
            None => kind,
        },
        count: entry.count,
        message: entry
            .message
            .as_deref()
            .map(clean_message)
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| super::format::NO_VALUE.to_owned()),
    }
}

//! `--requests-out`: one JSON line per measured request, merged from every worker as their
//! batches arrive, so a percentile can be traced back to the requests that made it.
//!
//! Workers send their records in bounded batches before each report; the gRPC service hands
//! each batch here and it goes straight to a buffered file, so the coordinator's memory does
//! not grow with the run.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use common::metrics::RequestRecord;
use serde_json::json;

/// The per-request output file of one run.
pub struct RequestsOut {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    out: BufWriter<File>,
    lines: u64,
    /// The first write error; reported at the end, never silently dropped.
    error: Option<std::io::Error>,
    /// During a `--find-max` search: the probe whose records arrive now (1-based index,
    /// load), written on each line.
    probe: Option<(usize, f64)>,
}

impl RequestsOut {
    /// Create (truncate) `path`.
    pub fn create(path: &Path) -> std::io::Result<RequestsOut> {
        let file = File::create(path)?;
        Ok(RequestsOut {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                out: BufWriter::with_capacity(256 << 10, file),
                lines: 0,
                error: None,
                probe: None,
            }),
        })
    }

    /// Where the lines go.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The probe whose records the next batches carry (probes run one after another, and a
    /// probe's records all arrive before its replay returns).
    pub fn set_probe(&self, probe: Option<(usize, f64)>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.probe = probe;
    }

    /// Append the records one worker sent.
    pub fn write(&self, worker: &str, records: &[RequestRecord]) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.error.is_some() {
            return;
        }
        let probe = inner.probe;
        for record in records {
            let mut line = record_line(worker, record);
            if let (Some((index, load)), Some(fields)) = (probe, line.as_object_mut()) {
                fields.insert("probe".to_owned(), index.into());
                fields.insert("load".to_owned(), load.into());
            }
            let written = serde_json::to_writer(&mut inner.out, &line)
                .map_err(std::io::Error::from)
                .and_then(|()| inner.out.write_all(b"\n"));
            if let Err(error) = written {
                inner.error = Some(error);
                return;
            }
            inner.lines += 1;
        }
    }

    /// Flush and return the number of lines written, or the first error.
    pub fn finish(&self) -> std::io::Result<u64> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(error) = inner.error.take() {
            return Err(error);
        }
        inner.out.flush()?;
        // Only a file on disk can be synced: a device or a pipe (`/dev/null`, `/dev/stdout`)
        // refuses (EINVAL), and its lines are already written.
        let file = inner.out.get_ref();
        if file.metadata()?.is_file() {
            file.sync_data()?;
        }
        Ok(inner.lines)
    }
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|us| us as f64 / 1000.0)
}

/// The JSON line of one request (the keys are the contract's), with `"good"` when the run
/// had `--slo` objectives (whether the request succeeded and met every one).
pub fn record_line(worker: &str, record: &RequestRecord) -> serde_json::Value {
    let o = &record.outcome;
    let mut line = json!({
        "exchange": record.meta.id.clone().unwrap_or_else(|| record.meta.index.to_string()),
        "index": record.meta.index,
        "worker": worker,
        "session": record.meta.session,
        "sent_unix_ms": o.sent_unix_us.map(|us| us as f64 / 1000.0),
        "schedule_lag_ms": ms(o.schedule_lag_us),
        "outcome": record.outcome_name(),
        "status": record.status,
        "unstreamed": o.unstreamed,
        "ttft_ms": ms(o.ttft_us),
        "ttst_ms": ms(o.ttst_us),
        "latency_ms": ms(o.latency_us),
        "itl_ms": record.itl_us().map(|us| us / 1000.0),
        "input_tokens": o.input_tokens,
        "output_tokens": o.output_tokens(),
        // Output: usage | server | tokenizer | frames; input: usage | server | tokenizer |
        // estimate (null without an input count).
        "token_source": {
            "output": o.output_source().name(),
            "input": o.input_source.map(|source| source.name()),
        },
        "cached_input_tokens": o.cached_input_tokens,
        "message": record.message,
    });
    if let (Some(good), Some(fields)) = (record.good, line.as_object_mut()) {
        fields.insert("good".to_owned(), good.into());
    }
    line
}

#[cfg(test)]
mod tests {
    use common::measure::{FailureKind, RequestOutcome};
    use common::metrics::{RecordMeta, RequestRecord};

    use super::RequestsOut;

    fn one_record() -> RequestRecord {
        RequestRecord {
            meta: RecordMeta {
                index: 0,
                id: Some("ex-0".into()),
                session: None,
            },
            outcome: RequestOutcome::failed(FailureKind::Status),
            status: Some(500),
            message: Some("overloaded".into()),
            good: None,
        }
    }

    /// A line says whether its request was good only when the run judged it (`--slo`).
    #[test]
    fn a_line_says_good_when_the_request_was_judged() {
        let unjudged = super::record_line("w", &one_record());
        assert!(unjudged.get("good").is_none(), "{unjudged}");
        for good in [true, false] {
            let record = RequestRecord {
                good: Some(good),
                ..one_record()
            };
            let line = super::record_line("w", &record);
            assert_eq!(line["good"], serde_json::Value::Bool(good), "{line}");
            // The rest of the line is unchanged.
            assert_eq!(line["outcome"], unjudged["outcome"]);
        }
    }

    /// A device takes the lines and cannot be synced; that is not a failure. A device that
    /// cannot take them is, and `finish` says so.
    #[test]
    fn finish_fails_only_when_the_lines_could_not_be_written() {
        let null = RequestsOut::create(std::path::Path::new("/dev/null")).expect("open");
        null.write("w", &[one_record()]);
        assert_eq!(null.finish().expect("written"), 1);

        let full = RequestsOut::create(std::path::Path::new("/dev/full")).expect("open");
        full.write("w", &[one_record()]);
        let error = full.finish().expect_err("no space");
        assert_eq!(error.raw_os_error(), Some(28), "{error}");
    }
}

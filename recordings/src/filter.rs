//! `llm-replay recording filter RECORDING --upstream NAME -o OUT`: the exchanges one upstream
//! served, as a recording of their own, so a replay can target that provider alone
//! (`record` with several `--upstream` routes notes each exchange's route name,
//! `common::recording::UpstreamNote`). The exchanges are written as read (arrival offsets,
//! sessions and frames kept), through `RecordingWriter`, which drops credentials as every
//! writer does; the recorder's header and gap lines are not copied.

use std::path::PathBuf;

use common::recording::{RecordingError, RecordingReader, RecordingWriter};

/// `llm-replay recording filter` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct FilterArgs {
    /// Recording to read (a file or a directory of files).
    pub recording: PathBuf,
    /// Keep the exchanges this upstream served: its route name, as `record` notes it (the
    /// path prefix without its slash, the host, or `default`; `recording stats` lists them).
    #[arg(long, value_name = "NAME")]
    pub upstream: String,
    /// Output recording (`.jsonl`, or `.jsonl.gz` to compress).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// What one filter kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterSummary {
    /// Exchanges read.
    pub read: u64,
    /// Exchanges the upstream served, written.
    pub kept: u64,
    pub torn_last_line: Option<u64>,
}

/// A problem filtering.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the output is the recording itself; write elsewhere", path.display())]
    SameFile { path: PathBuf },
}

impl FilterError {
    /// The output could not be written (rather than bad input or options).
    pub fn is_write(&self) -> bool {
        matches!(self, FilterError::Write { .. })
    }
}

/// Copy the exchanges of `args.recording` that `args.upstream` served to `args.output`.
pub fn filter_by_upstream(args: &FilterArgs) -> Result<FilterSummary, FilterError> {
    if common::recording::is_same_file(&args.recording, &args.output) {
        return Err(FilterError::SameFile {
            path: args.output.clone(),
        });
    }
    let mut reader = RecordingReader::open(&args.recording)?;
    let write_error = |source| FilterError::Write {
        path: args.output.clone(),
        source,
    };
    let mut writer = RecordingWriter::create_replacing(&args.output).map_err(write_error)?;
    let mut summary = FilterSummary::default();
    for item in reader.by_ref() {
        let (_, exchange) = item?;
        summary.read += 1;
        if exchange
            .upstream_note()
            .is_some_and(|note| note.name == args.upstream)
        {
            writer.write(&exchange).map_err(write_error)?;
            summary.kept += 1;
        }
    }
    writer.finish().map_err(write_error)?;
    summary.torn_last_line = reader.torn_last_line();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_exchanges_of_one_upstream_as_written() {
        let dir = std::env::temp_dir().join(format!("llm-replay-filter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let input = dir.join("all.jsonl");
        let lines = [
            r#"{"at_ms":0.0,"upstream":{"name":"openai","url":"http://a:1"},"request":{"path":"/v1/chat/completions"}}"#,
            r#"{"at_ms":5.0,"upstream":{"name":"anthropic","url":"http://b:2"},"request":{"path":"/v1/messages"}}"#,
            r#"{"at_ms":9.5,"session":"s1","upstream":{"name":"openai","url":"http://a:1"},"request":{"path":"/v1/models"}}"#,
            r#"{"at_ms":12.0,"request":{"path":"/v1/chat/completions"}}"#,
        ];
        std::fs::write(&input, lines.join("\n") + "\n").expect("write");
        let output = dir.join("openai.jsonl");
        let args = FilterArgs {
            recording: input.clone(),
            upstream: "openai".into(),
            output: output.clone(),
        };
        let summary = filter_by_upstream(&args).expect("filters");
        assert_eq!((summary.read, summary.kept), (4, 2));
        let kept: Vec<_> = RecordingReader::open(&output)
            .expect("opens")
            .map(|item| item.expect("reads").1)
            .collect();
        let paths: Vec<&str> = kept.iter().map(|e| e.request.path.as_str()).collect();
        assert_eq!(paths, ["/v1/chat/completions", "/v1/models"]);
        assert_eq!(kept[1].at_ms, Some(9.5));
        assert_eq!(kept[1].session.as_deref(), Some("s1"));
        let same = FilterArgs {
            output: input.clone(),
            ..args
        };
        assert!(matches!(
            filter_by_upstream(&same),
            Err(FilterError::SameFile { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! `llm-replay recording filter RECORDING --upstream NAME -o OUT`: the exchanges one upstream
//! served, as a recording of their own, so a replay can target that provider alone
//! (`record` with several `--upstream` routes notes each exchange's route name,
//! `common::recording::UpstreamNote`). The exchanges are written as read (arrival offsets,
//! sessions and frames kept), through `RecordingWriter`, which drops credentials as every
//! writer does. What the recorder said of the whole recording stays true of the part and is
//! kept: the share of the traffic it holds (a sampled recording's header) and its gap
//! markers (exchanges proxied and never recorded, of any upstream: a count the part may
//! have missed), each written where the reader met it.

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
    /// Gap markers copied (exchanges the recorder proxied and never recorded).
    pub gaps: u64,
    /// Lines skipped for their length (not exchanges the filter could judge).
    pub skipped_long_lines: u64,
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

/// The reader's notes already copied to the output.
#[derive(Default)]
struct CopiedNotes {
    sample_share: Option<f64>,
    gaps: usize,
}

impl CopiedNotes {
    /// Write what `reader` noted since the last call: a smaller sample share, new gaps.
    fn copy_new(
        &mut self,
        reader: &RecordingReader,
        writer: &mut RecordingWriter,
    ) -> std::io::Result<()> {
        if reader.sample_share() != self.sample_share
            && let Some(share) = reader.sample_share()
        {
            writer.write_sample_header("llm-replay recording filter", share)?;
            self.sample_share = Some(share);
        }
        for gap in &reader.gaps()[self.gaps..] {
            writer.write_gap(gap)?;
        }
        self.gaps = reader.gaps().len();
        Ok(())
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
    let mut notes = CopiedNotes::default();
    loop {
        let item = reader.next();
        notes.copy_new(&reader, &mut writer).map_err(write_error)?;
        let Some(item) = item else { break };
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
    summary.gaps = notes.gaps as u64;
    writer.finish().map_err(write_error)?;
    summary.torn_last_line = reader.torn_last_line();
    summary.skipped_long_lines = reader.skipped_lines();
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

    /// A part of a sampled recording holds the same share of the traffic, and the gaps the
    /// recorder marked stay marked, where they were.
    #[test]
    fn keeps_the_sample_share_and_the_gaps() {
        let dir =
            std::env::temp_dir().join(format!("llm-replay-filter-notes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let input = dir.join("sampled.jsonl");
        let lines = [
            r#"{"recording":{"format":1,"writer":"llm-replay record","seq":0,"sample":0.5}}"#,
            r#"{"at_ms":0.0,"upstream":{"name":"openai","url":"http://a:1"},"request":{"path":"/v1/chat/completions"}}"#,
            r#"{"gap":{"exchanges":7,"reason":"disk_full","from_ms":1.0,"to_ms":3.5,"from":"2026-12-06T07:00:00.001Z","to":"2026-12-06T07:00:00.003Z"}}"#,
            r#"{"at_ms":5.0,"upstream":{"name":"anthropic","url":"http://b:2"},"request":{"path":"/v1/messages"}}"#,
            r#"{"at_ms":9.5,"upstream":{"name":"openai","url":"http://a:1"},"request":{"path":"/v1/models"}}"#,
        ];
        std::fs::write(&input, lines.join("\n") + "\n").expect("write");
        let output = dir.join("openai.jsonl");
        let args = FilterArgs {
            recording: input,
            upstream: "openai".into(),
            output: output.clone(),
        };
        let summary = filter_by_upstream(&args).expect("filters");
        assert_eq!((summary.read, summary.kept, summary.gaps), (3, 2, 1));
        let mut reader = RecordingReader::open(&output).expect("opens");
        let first = reader.next().expect("an exchange").expect("reads").1;
        assert_eq!(first.at_ms, Some(0.0));
        assert_eq!(reader.sample_share(), Some(0.5));
        assert!(
            reader.gaps().is_empty(),
            "the gap comes after the first exchange"
        );
        let second = reader.next().expect("an exchange").expect("reads").1;
        assert_eq!(second.at_ms, Some(9.5));
        let gap = &reader.gaps()[0];
        assert_eq!((gap.exchanges, gap.reason.as_str()), (7, "disk_full"));
        assert_eq!((gap.from_ms, gap.to_ms), (Some(1.0), Some(3.5)));
        assert_eq!(gap.to.as_deref(), Some("2026-12-06T07:00:00.003Z"));
        assert!(reader.next().is_none());
        std::fs::remove_dir_all(&dir).ok();
    }
}

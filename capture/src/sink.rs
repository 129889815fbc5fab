//! Where the recording goes: one file (`--out FILE`, as before) or a directory of rotated
//! files (`--out DIR/`): `recording-<UTC time>-<seq>.jsonl.gz`, a new one past
//! `--rotate-size` or `--rotate-every`, the oldest deleted past `--max-disk` / `--keep`.
//!
//! A `.gz` file is a sequence of gzip members, each a whole batch of lines (the writer's
//! queue at the time): the file is a complete gzip stream after every write, so a closed file
//! is readable at once and a crash loses at most the batch being written. Every write is
//! undone (`set_len` back) when it fails, so a full disk never leaves half a line or half a
//! member behind. A gap marker is a fixed-width line (a stored, uncompressed member in a
//! `.gz` file) rewritten in place as its count grows, which needs no more room on a full disk.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flate2::Compression;
use flate2::write::GzEncoder;

/// Where and how to write (from `--out`, `--rotate-*`, `--max-disk`, `--keep`, `--sample`).
#[derive(Debug, Clone)]
pub struct OutputPlan {
    /// `--out`.
    pub path: PathBuf,
    /// `--out` names a directory: rotate inside it.
    pub directory: bool,
    pub rotate_size: Option<u64>,
    pub rotate_every: Option<Duration>,
    pub max_disk: Option<u64>,
    pub keep: Option<usize>,
    /// The share of traffic recorded (`--sample`), 1 for all.
    pub sample: f64,
}

/// Width of a gap marker line, newline included.
pub const MARKER_WIDTH: usize = 320;

/// Recently written units kept for [`Sink::remove_last_unit`].
const RECENT_UNITS: usize = 16;

/// The open recording file.
pub struct Sink {
    plan: OutputPlan,
    pub path: PathBuf,
    file: File,
    /// Bytes in the file (where the next write goes).
    pub len: u64,
    gzip: bool,
    opened: Instant,
    seq: u64,
    /// Start offsets and exchange counts of the last units written, newest last.
    recent: VecDeque<(u64, u64)>,
}

/// Seconds and milliseconds since the epoch, now.
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn utc_millis(at: Duration) -> String {
    format!(
        "{}.{:03}Z",
        common::civil::utc_date_time(at.as_secs()),
        at.subsec_millis()
    )
}

impl Sink {
    /// Open the first file (a single `--out` file is created or truncated).
    pub fn open(plan: OutputPlan) -> std::io::Result<Sink> {
        if plan.directory {
            std::fs::create_dir_all(&plan.path)?;
        }
        let (path, file) = Sink::create(&plan, 1)?;
        let mut sink = Sink {
            gzip: is_gz(&path),
            path,
            file,
            len: 0,
            opened: Instant::now(),
            seq: 1,
            recent: VecDeque::new(),
            plan,
        };
        sink.write_header();
        Ok(sink)
    }

    fn create(plan: &OutputPlan, seq: u64) -> std::io::Result<(PathBuf, File)> {
        let path = if plan.directory {
            let stamp = common::civil::utc_date_time(unix_now().as_secs()).replace([':', '-'], "");
            plan.path
                .join(format!("recording-{stamp}Z-{seq:06}.jsonl.gz"))
        } else {
            plan.path.clone()
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok((path, file))
    }

    /// A file header when the file says something a reader needs (a sampled share), or the
    /// file is one of a rotation. Not written is not an error (a full disk): logged.
    fn write_header(&mut self) {
        if !self.plan.directory && self.plan.sample >= 1.0 {
            return;
        }
        let header = serde_json::json!({ common::recording::HEADER_KEY: {
            "format": 1,
            "writer": "llm-replay record",
            "opened": utc_millis(unix_now()),
            "seq": self.seq,
            "sample": self.plan.sample,
        }});
        let mut line = header.to_string().into_bytes();
        line.push(b'\n');
        if let Err(error) = self.append(&line, 0) {
            tracing::warn!(%error, file = %self.path.display(), "cannot write the file header");
        }
    }

    /// A rotation is due: the file is past `--rotate-size`, or older than `--rotate-every`
    /// (and holds an exchange).
    pub fn rotation_due(&self) -> bool {
        if !self.plan.directory || (self.recent.iter().all(|(_, n)| *n == 0) && self.len < 4096) {
            return false;
        }
        self.plan.rotate_size.is_some_and(|size| self.len >= size)
            || self
                .plan
                .rotate_every
                .is_some_and(|every| self.opened.elapsed() >= every)
    }

    /// When the open file is due by age (for the writer's wait).
    pub fn age_deadline(&self) -> Option<Instant> {
        if !self.plan.directory {
            return None;
        }
        self.plan.rotate_every.map(|every| self.opened + every)
    }

    /// Close this file (synced: it is complete) and open the next; apply retention.
    pub fn rotate(&mut self) -> std::io::Result<()> {
        self.sync()?;
        let closed = self.path.clone();
        let closed_bytes = self.len;
        let (path, file) = Sink::create(&self.plan, self.seq + 1)?;
        self.seq += 1;
        self.path = path;
        self.file = file;
        self.len = 0;
        self.opened = Instant::now();
        self.recent.clear();
        self.write_header();
        let deleted = self.apply_retention();
        tracing::info!(
            closed = %closed.display(),
            closed_bytes,
            opened = %self.path.display(),
            deleted,
            "recording rotated"
        );
        Ok(())
    }

    /// Delete the oldest closed files past `--keep` files or `--max-disk` bytes; returns how
    /// many were deleted.
    fn apply_retention(&self) -> usize {
        if self.plan.keep.is_none() && self.plan.max_disk.is_none() {
            return 0;
        }
        let Ok(files) = common::recording::recording_files(&self.plan.path) else {
            return 0;
        };
        let mut sized: Vec<(PathBuf, u64)> = files
            .into_iter()
            .map(|p| {
                let len = std::fs::metadata(&p).map_or(0, |m| m.len());
                (p, len)
            })
            .collect();
        let mut total: u64 = sized.iter().map(|(_, len)| len).sum();
        let mut deleted = 0;
        while !sized.is_empty() {
            let over_count = self.plan.keep.is_some_and(|keep| sized.len() > keep.max(1));
            let over_size = self.plan.max_disk.is_some_and(|max| total > max);
            if !over_count && !over_size {
                break;
            }
            let (oldest, len) = sized.remove(0);
            if oldest == self.path {
                break;
            }
            match std::fs::remove_file(&oldest) {
                Ok(()) => {
                    deleted += 1;
                    total = total.saturating_sub(len);
                    tracing::info!(deleted = %oldest.display(), bytes = len, "old recording deleted (retention)");
                }
                Err(error) => {
                    tracing::warn!(%error, file = %oldest.display(), "cannot delete an old recording");
                }
            }
        }
        deleted
    }

    /// The bytes for `lines` as stored: a gzip member in a `.gz` file.
    fn encode(&self, lines: &[u8], level: Compression) -> std::io::Result<Vec<u8>> {
        if !self.gzip {
            return Ok(lines.to_vec());
        }
        let mut encoder = GzEncoder::new(Vec::with_capacity(lines.len() / 3 + 64), level);
        encoder.write_all(lines)?;
        encoder.finish()
    }

    /// Append whole lines holding `exchanges` exchanges; on error nothing of them stays in
    /// the file. Returns the bytes written.
    pub fn append(&mut self, lines: &[u8], exchanges: u64) -> std::io::Result<u64> {
        let unit = self.encode(lines, Compression::fast())?;
        let start = self.len;
        self.write_unit(&unit)?;
        self.recent.push_back((start, exchanges));
        if self.recent.len() > RECENT_UNITS {
            self.recent.pop_front();
        }
        Ok(unit.len() as u64)
    }

    fn write_unit(&mut self, unit: &[u8]) -> std::io::Result<()> {
        let start = self.len;
        match self.file.write_all(unit) {
            Ok(()) => {
                self.len += unit.len() as u64;
                Ok(())
            }
            Err(error) => {
                self.truncate_to(start);
                Err(error)
            }
        }
    }

    fn truncate_to(&mut self, len: u64) {
        if let Err(error) = self.file.set_len(len) {
            tracing::warn!(%error, "cannot cut a failed write back");
        }
        let _ = self.file.seek(SeekFrom::Start(len));
        self.len = len;
    }

    /// Remove the newest unit written (to make room for a gap marker); returns how many
    /// exchanges it held.
    pub fn remove_last_unit(&mut self) -> Option<u64> {
        let (start, exchanges) = self.recent.pop_back()?;
        if exchanges == 0 {
            // A header or another marker: keep it.
            self.recent.push_back((start, exchanges));
            return None;
        }
        self.truncate_to(start);
        Some(exchanges)
    }

    /// A fixed-width marker: `json` padded with spaces to [`MARKER_WIDTH`].
    fn marker_unit(&self, json: &str) -> std::io::Result<Vec<u8>> {
        let mut line = json.as_bytes().to_vec();
        line.resize(MARKER_WIDTH - 1, b' ');
        line.truncate(MARKER_WIDTH - 1);
        line.push(b'\n');
        self.encode(&line, Compression::none())
    }

    /// Append a gap marker; returns its offset, for [`Sink::rewrite_marker`].
    pub fn append_marker(&mut self, json: &str) -> std::io::Result<u64> {
        let unit = self.marker_unit(json)?;
        let start = self.len;
        self.write_unit(&unit)?;
        self.recent.push_back((start, 0));
        Ok(start)
    }

    /// Rewrite the marker at `offset` in place (same width: the file does not grow).
    pub fn rewrite_marker(&self, offset: u64, json: &str) -> std::io::Result<()> {
        let unit = self.marker_unit(json)?;
        self.file.write_all_at(&unit, offset)
    }

    /// `fsync` the data; a file that cannot be synced (a pipe, `/dev/stdout`) is not an error.
    pub fn sync(&self) -> std::io::Result<()> {
        match self.file.sync_data() {
            Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            other => other,
        }
    }
}

fn is_gz(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_keeps_its_width_whatever_it_says() {
        let dir = std::env::temp_dir().join(format!("sink-marker-{}", std::process::id()));
        let plan = OutputPlan {
            path: dir.clone(),
            directory: true,
            rotate_size: None,
            rotate_every: None,
            max_disk: None,
            keep: None,
            sample: 1.0,
        };
        let sink = Sink::open(plan).expect("open");
        let short = sink
            .marker_unit("{\"gap\":{\"exchanges\":1}}")
            .expect("unit");
        let long = sink
            .marker_unit("{\"gap\":{\"exchanges\":123456789,\"reason\":\"disk_full\"}}")
            .expect("unit");
        assert_eq!(short.len(), long.len());
        drop(sink);
        let _ = std::fs::remove_dir_all(dir);
    }
}

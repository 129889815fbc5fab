//! The files a command will write, checked before it reads much or sends any load: a typo
//! must not cost a long replay, an output must never destroy an input (`run rec.jsonl
//! --requests-out rec.jsonl` once truncated the recording it was about to replay) or another
//! output, and the check itself must change nothing that was there before it.
//!
//! Two paths are the same file when they resolve to the same (device, inode) — through
//! symbolic links, hard links, `..` or a relative spelling alike — or, for files that do not
//! exist yet, when their canonical parent directory and file name are equal. Devices, pipes
//! and sockets (`/dev/null`, `/dev/stdout` on a terminal) are never "the same file": writing
//! two outputs there loses nothing that was on disk.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file the command reads, and how the messages call it (`the recording`, `--config`).
pub struct Input<'a> {
    pub what: &'a str,
    pub path: &'a Path,
}

/// A file the command writes, and the flag that named it (`--report-json`).
pub struct Output<'a> {
    pub flag: &'a str,
    pub path: &'a Path,
}

/// Refuse an output that is a symbolic link to nothing, that is an input or another output,
/// or that cannot be written; `Err` holds the message (a usage error). Nothing that existed is
/// changed: an existing file is opened for appending and closed; a missing one is created
/// exclusively (never through a link) and removed again.
pub fn check_outputs(outputs: &[Output<'_>], inputs: &[Input<'_>]) -> Result<(), String> {
    for output in outputs {
        if is_dangling_symlink(output.path) {
            return Err(format!(
                "{} {}: is a symbolic link to a file that does not exist; name the file itself",
                output.flag,
                output.path.display()
            ));
        }
    }
    let input_ids: Vec<Identity> = inputs.iter().map(|i| identity(i.path)).collect();
    let output_ids: Vec<Identity> = outputs.iter().map(|o| identity(o.path)).collect();
    for (i, output) in outputs.iter().enumerate() {
        if let Some((input, _)) = inputs
            .iter()
            .zip(&input_ids)
            .find(|(_, id)| id.same_file(&output_ids[i]))
        {
            return Err(format!(
                "{} {}: is {} ({}); writing it would destroy it",
                output.flag,
                output.path.display(),
                input.what,
                input.path.display()
            ));
        }
        if let Some((other, _)) = outputs[..i]
            .iter()
            .zip(&output_ids[..i])
            .find(|(_, id)| id.same_file(&output_ids[i]))
        {
            return Err(format!(
                "{} {} and {} {} are the same file: one would overwrite the other",
                other.flag,
                other.path.display(),
                output.flag,
                output.path.display()
            ));
        }
    }
    for output in outputs {
        if let Err(error) = check_writable(output.path) {
            return Err(format!(
                "{} {}: cannot write: {error}",
                output.flag,
                output.path.display()
            ));
        }
    }
    Ok(())
}

/// What a path resolves to, for "is it the same file".
#[derive(Debug, PartialEq)]
enum Identity {
    /// An existing file or directory.
    Existing { dev: u64, ino: u64 },
    /// A device, pipe or socket: never the same file as another path.
    Special,
    /// Nothing there yet: the canonical parent joined with the file name.
    Planned(PathBuf),
}

impl Identity {
    fn same_file(&self, other: &Identity) -> bool {
        !matches!(self, Identity::Special) && self == other
    }
}

fn identity(path: &Path) -> Identity {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() || meta.is_dir() => Identity::Existing {
            dev: meta.dev(),
            ino: meta.ino(),
        },
        Ok(_) => Identity::Special,
        Err(_) => Identity::Planned(planned_path(path)),
    }
}

/// Where a file that does not exist yet would be created.
fn planned_path(path: &Path) -> PathBuf {
    let Some(name) = path.file_name() else {
        return std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    };
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match std::fs::canonicalize(parent) {
        Ok(dir) => dir.join(name),
        Err(_) => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// A symbolic link whose target does not exist: creating "the file" would create the target
/// somewhere else, and removing it again would remove the link.
fn is_dangling_symlink(path: &Path) -> bool {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    is_link
        && std::fs::metadata(path).is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound)
}

fn check_writable(path: &Path) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok() {
        // Appending to nothing leaves the file as it was.
        std::fs::OpenOptions::new().append(true).open(path)?;
        return Ok(());
    }
    // `create_new` (O_EXCL) fails on anything already there, links included, so the file
    // removed below is the one just created.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    std::fs::remove_file(path)
}

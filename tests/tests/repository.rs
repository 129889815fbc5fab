//! The repository itself: no file carries a merge's conflict markers (two once reached the
//! README unnoticed, as prose renders them without complaint).

use std::path::Path;

use fixtures::{parallel_lock, workspace_root};

/// Text files a merge can leave markers in.
const CHECKED: &[&str] = &[
    "md", "rs", "toml", "yaml", "yml", "json", "py", "sh", "proto",
];

fn walk(dir: &Path, found: &mut Vec<String>, checked: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(
                name.as_ref(),
                "target" | ".git" | "node_modules" | "reports"
            ) {
                walk(&path, found, checked);
            }
            continue;
        }
        let checked_kind = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CHECKED.contains(&e));
        let Some(text) = checked_kind
            .then(|| std::fs::read_to_string(&path).ok())
            .flatten()
        else {
            continue;
        };
        *checked += 1;
        for (number, line) in text.lines().enumerate() {
            if line.starts_with("<<<<<<< ") || line.starts_with(">>>>>>> ") {
                found.push(format!("{}:{}: {line}", path.display(), number + 1));
            }
        }
    }
}

#[test]
fn no_file_carries_merge_conflict_markers() {
    let _parallel = parallel_lock();
    let mut found = Vec::new();
    let mut checked = 0;
    walk(&workspace_root(), &mut found, &mut checked);
    assert!(checked > 100, "only {checked} files read: wrong root?");
    assert!(found.is_empty(), "conflict markers:\n{}", found.join("\n"));
}

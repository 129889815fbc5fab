//! The house's invariants, checked (in the spirit of rust-analyzer's `tidy` test): what
//! ARCHITECTURE.md's "Invariants" states about the code's shape holds, and a change that breaks
//! one fails here, naming the file and what it reached.
//!
//! - **No import circle among a crate's modules.** Each `crate::`/`super::` path in a
//!   library's non-test code is an edge between the two sibling subtrees it crosses (a module
//!   using its parent, or a parent its child, is no edge); a circle among the children of any
//!   module fails.
//! - **The allowed crate edges** (`ALLOWED_CRATE_EDGES`): nothing depends on `cli`, the
//!   coordinator not on the worker, the worker on no tool crate, `common` on none of ours.
//! - **Generated protobuf types** (`proto::v1`) only in `proto` and the gRPC layers
//!   (`GRPC_LAYERS`).
//! - **No printing from library crates** (`println!`, `eprintln!`, `print!`, `eprint!`) outside
//!   the CLI layers (`PRINTING_ALLOWED`), benches and tests.
//!
//! Each check is a function over a folder, and the tests at the end prove each can fail on a
//! small tree made for it.

mod rust_source;

use rust_source::{all_source_files, crate_files};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose modules are checked, by folder.
const LIBRARY_CRATES: [&str; 8] = [
    "proto",
    "common",
    "worker",
    "coordinator",
    "mock",
    "capture",
    "recordings",
    "cli",
];

/// Which of the workspace's crates each crate may depend on (normal, dev and build
/// dependencies). `tests` and `bench` are tools over the whole: anything but `cli`.
const ALLOWED_CRATE_EDGES: [(&str, &[&str]); 10] = [
    ("proto", &["common"]),
    ("common", &[]),
    ("worker", &["common", "proto"]),
    ("coordinator", &["common", "proto", "mock"]),
    ("mock", &["common"]),
    ("capture", &["common"]),
    ("recordings", &["common"]),
    (
        "cli",
        &[
            "common",
            "proto",
            "worker",
            "coordinator",
            "mock",
            "capture",
            "recordings",
        ],
    ),
    (
        "tests",
        &[
            "common",
            "proto",
            "worker",
            "coordinator",
            "mock",
            "capture",
            "recordings",
        ],
    ),
    (
        "bench",
        &[
            "common",
            "proto",
            "worker",
            "coordinator",
            "mock",
            "capture",
            "recordings",
        ],
    ),
];

/// The modules that may name generated protobuf types (`proto::v1`), by crate folder and
/// module path: the worker's link (joining and the level's exchange; not its session), the
/// coordinator's gRPC service, its listener and the pre-authentication guard that reads gRPC
/// framing.
const GRPC_LAYERS: [(&str, &str); 6] = [
    ("worker", "link"),
    ("worker", "link::join"),
    ("worker", "link::level"),
    ("coordinator", "server"),
    ("coordinator", "pool"),
    ("coordinator", "link_guard"),
];

/// The modules that may print to the user: the CLI layers.
const PRINTING_ALLOWED: [(&str, &str); 1] = [("worker", "cli")];

/// The longest a function may be (CONVENTIONS: under 150 lines).
const MAX_FUNCTION_LINES: usize = 150;

/// The crates whose functions are held to `MAX_FUNCTION_LINES`: every crate of the product
/// (the tests' own crate aside).
const SHORT_FUNCTION_CRATES: [&str; 9] = [
    "proto",
    "common",
    "worker",
    "coordinator",
    "mock",
    "capture",
    "recordings",
    "cli",
    "bench",
];

/// Functions over the limit that predate this check, with their length when it was added: each
/// may shrink, none may grow, and a function that is split leaves this list (a ratchet). Empty:
/// the last (`into_config`, 185 lines) was split when the run's flags moved to `cli`.
const LONG_FUNCTIONS_TO_SPLIT: [(&str, &str, usize); 0] = [];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace")
        .to_path_buf()
}

/// A module path as segments (`[]` is the crate root).
type ModPath = Vec<String>;

fn show(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

/// One edge between two sibling modules, with the file and path that made it.
#[derive(Clone, Debug)]
struct Edge {
    from: String,
    to: String,
    because: String,
}

/// Every circle among sibling modules in one crate's `src/`, each as the sibling names in
/// order with the references that make it.
fn import_circles(src: &Path) -> Vec<String> {
    let files = crate_files(src);
    let modules: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
    // parent module → (child → children it reaches, with the reason)
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> = BTreeMap::new();
    for file in files.iter().filter(|f| !f.is_test) {
        for (target, text) in file.references() {
            let Some(target) = longest_module(&modules, &target) else {
                continue;
            };
            if let Some((parent, edge)) = sibling_edge(&file.module, &target) {
                let because = format!("{} uses `{text}`", file.shown);
                graphs
                    .entry(parent)
                    .or_default()
                    .entry(edge.from)
                    .or_default()
                    .entry(edge.to)
                    .or_insert(because);
            }
        }
    }
    let mut circles = Vec::new();
    for (parent, graph) in &graphs {
        for circle in find_circles(graph) {
            circles.push(format!(
                "in `{}`: {}",
                show(parent),
                circle
                    .iter()
                    .map(|e| format!("{} → {} ({})", e.from, e.to, e.because))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    circles
}

/// The longest prefix of `path` that is a module of the crate (an item's path names its
/// module first).
fn longest_module(modules: &BTreeSet<ModPath>, path: &[String]) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// The edge a reference from module `from` to module `to` makes: between the two children of
/// their lowest common ancestor that hold them. None when one holds the other (a module using
/// its parent or its child).
fn sibling_edge(from: &[String], to: &[String]) -> Option<(ModPath, Edge)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    Some((
        from[..common].to_vec(),
        Edge {
            from: from[common].clone(),
            to: to[common].clone(),
            because: String::new(),
        },
    ))
}

/// The circles of a small directed graph: for each strongly connected set of two or more, one
/// circle through it (found by a walk from its smallest member).
fn find_circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<Edge>> {
    let mut seen_sets: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut circles = Vec::new();
    for start in graph.keys() {
        let Some(path) = path_back_to(graph, start) else {
            continue;
        };
        let members: BTreeSet<String> = path.iter().map(|e| e.from.clone()).collect();
        if seen_sets.insert(members) {
            circles.push(path);
        }
    }
    circles
}

/// A shortest walk from `start` back to itself (breadth first), if there is one.
fn path_back_to(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
    start: &str,
) -> Option<Vec<Edge>> {
    let mut came_from: BTreeMap<String, Edge> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.to_string()]);
    while let Some(node) = queue.pop_front() {
        for (next, because) in graph.get(&node).into_iter().flatten() {
            let edge = Edge {
                from: node.clone(),
                to: next.clone(),
                because: because.clone(),
            };
            if next == start {
                let mut path = vec![edge];
                let mut at = node.clone();
                while at != start {
                    let back = came_from[&at].clone();
                    at = back.from.clone();
                    path.push(back);
                }
                path.reverse();
                return Some(path);
            }
            if !came_from.contains_key(next) {
                came_from.insert(next.clone(), edge);
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// The workspace crates (by folder) a crate's manifest depends on, each with whether only as a
/// dev-dependency.
fn crate_edges(root: &Path, krate: &str) -> BTreeMap<String, bool> {
    let manifest = root.join(krate).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let mut deps: BTreeMap<String, bool> = BTreeMap::new();
    let mut table: Option<bool> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            table = line
                .contains("dependencies")
                .then(|| line.contains("dev-dependencies"));
            continue;
        }
        let Some(dev_only) = table else {
            continue;
        };
        if let Some(name) = line.split(['=', '.', ' ']).next()
            && let Some(folder) = name.strip_prefix("llm-replay-")
        {
            let entry = deps.entry(folder.to_string()).or_insert(dev_only);
            *entry = *entry && dev_only;
        }
    }
    deps
}

/// Every dependency of a workspace crate on another that `ALLOWED_CRATE_EDGES` does not allow.
/// A crate's tests may also start the mock server (a dev-dependency on `mock`); nothing ever
/// depends on `cli`.
fn forbidden_crate_edges(root: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    for (krate, allowed) in ALLOWED_CRATE_EDGES {
        if !root.join(krate).join("Cargo.toml").exists() {
            continue;
        }
        for (dep, dev_only) in crate_edges(root, krate) {
            let test_server = dev_only && dep == "mock";
            if dep == krate || (allowed.contains(&dep.as_str()) || test_server) && dep != "cli" {
                continue;
            }
            wrong.push(format!(
                "{krate}/Cargo.toml depends on llm-replay-{dep}{}, which ARCHITECTURE.md does not allow",
                if dev_only { " (dev)" } else { "" }
            ));
        }
    }
    wrong
}

/// Whether `module` is one of `allowed` (submodules are not: each layer is named).
fn within(allowed: &[(&str, &str)], krate: &str, module: &[String]) -> bool {
    let shown = show(module);
    allowed.iter().any(|(k, m)| *k == krate && shown == *m)
}

/// Non-test files outside their allowed modules that contain one of `needles` in code (not in
/// comments or strings).
fn misplaced(root: &Path, allowed: &[(&str, &str)], needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for krate in LIBRARY_CRATES {
        if krate == "proto" || krate == "cli" {
            continue;
        }
        let src = root.join(krate).join("src");
        if !src.exists() {
            continue;
        }
        for file in crate_files(&src) {
            if file.is_test || within(allowed, krate, &file.module) {
                continue;
            }
            let first = needles
                .iter()
                .filter_map(|needle| Some((file.code_line_with(needle)?, needle)))
                .min();
            if let Some((line, needle)) = first {
                found.push(format!("{}:{line}: `{needle}`", file.shown));
            }
        }
    }
    found
}

fn generated_types_outside_their_layers(root: &Path) -> Vec<String> {
    misplaced(root, &GRPC_LAYERS, &["proto::v1", "v1::"])
}

fn printing_from_libraries(root: &Path) -> Vec<String> {
    misplaced(
        root,
        &PRINTING_ALLOWED,
        &["println!", "eprintln!", "print!", "eprint!"],
    )
}

/// Non-test functions over `MAX_FUNCTION_LINES` in `crates`, and listed ones that grew (or
/// are gone or short: the list is stale).
fn long_functions(root: &Path, crates: &[&str], listed: &[(&str, &str, usize)]) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for krate in crates {
        let src = root.join(krate).join("src");
        if !src.exists() {
            continue;
        }
        for file in all_source_files(&src).iter().filter(|f| !f.is_test) {
            for (name, line, length) in file.functions() {
                if length <= MAX_FUNCTION_LINES {
                    continue;
                }
                let known = listed
                    .iter()
                    .find(|(path, known, _)| *path == file.shown && *known == name);
                match known {
                    Some((_, _, was)) if length <= *was => {
                        seen.insert((file.shown.clone(), name));
                    }
                    Some((_, _, was)) => {
                        seen.insert((file.shown.clone(), name.clone()));
                        wrong.push(format!(
                            "{}:{line}: `{name}` grew to {length} lines (was {was}): split it by the ideas it holds",
                            file.shown
                        ));
                    }
                    None => wrong.push(format!(
                        "{}:{line}: `{name}` is {length} lines (at most {MAX_FUNCTION_LINES}): split it by the ideas it holds",
                        file.shown
                    )),
                }
            }
        }
    }
    for (path, name, _) in listed {
        if !seen.contains(&(path.to_string(), name.to_string())) {
            wrong.push(format!(
                "{path}: `{name}` is no longer over {MAX_FUNCTION_LINES} lines: take it off LONG_FUNCTIONS_TO_SPLIT"
            ));
        }
    }
    wrong
}

fn circles_in_workspace(root: &Path) -> Vec<String> {
    LIBRARY_CRATES
        .iter()
        .filter(|k| root.join(k).join("src").exists())
        .flat_map(|k| {
            import_circles(&root.join(k).join("src"))
                .into_iter()
                .map(move |c| format!("{k}: {c}"))
        })
        .collect()
}

#[test]
fn no_import_circle_among_a_crates_modules() {
    let circles = circles_in_workspace(&workspace_root());
    assert!(
        circles.is_empty(),
        "import circles (move what two modules need into the lower one):\n{}",
        circles.join("\n")
    );
}

#[test]
fn crates_depend_only_along_the_allowed_edges() {
    let wrong = forbidden_crate_edges(&workspace_root());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn generated_protobuf_types_stay_in_the_grpc_layers() {
    let wrong = generated_types_outside_their_layers(&workspace_root());
    assert!(
        wrong.is_empty(),
        "generated types outside proto and the gRPC layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn library_crates_do_not_print() {
    let wrong = printing_from_libraries(&workspace_root());
    assert!(
        wrong.is_empty(),
        "printing outside the CLI layers (return a value, or log with tracing):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn functions_stay_short() {
    let wrong = long_functions(
        &workspace_root(),
        &SHORT_FUNCTION_CRATES,
        &LONG_FUNCTIONS_TO_SPLIT,
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn architecture_md_names_each_checked_invariant() {
    let text =
        std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    for claim in [
        "No import circle",
        "never on the worker",
        "Generated protobuf types",
        "tests/tidy",
    ] {
        assert!(text.contains(claim), "ARCHITECTURE.md lost `{claim}`");
    }
}

/// The checks themselves fail on a tree made to break each one.
mod the_checks_can_fail {
    use super::*;

    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Self {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tidy-{name}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Tree(dir)
        }

        fn file(&self, path: &str, text: &str) -> &Self {
            let path = self.0.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
            std::fs::write(path, text).expect("write");
            self
        }
    }

    #[test]
    fn a_new_circle_is_found_with_its_references() {
        let tree = Tree::new("circle");
        tree.file("m/src/lib.rs", "mod body;\nmod metrics;\nmod synth;\n")
            .file("m/src/body.rs", "use crate::metrics::Count;\n")
            .file("m/src/metrics.rs", "pub fn f() { crate::synth::g(); }\n")
            .file(
                "m/src/synth.rs",
                "use crate::{body::{self, Frame}, other};\n// crate::metrics in a comment\n",
            );
        let circles = import_circles(&tree.0.join("m/src"));
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert!(
            circles[0].contains("body → metrics")
                && circles[0].contains("metrics → synth")
                && circles[0].contains("synth → body"),
            "{circles:?}"
        );
    }

    #[test]
    fn parents_children_comments_strings_and_tests_make_no_circle() {
        let tree = Tree::new("no-circle");
        tree.file("m/src/lib.rs", "mod a;\nmod b;\nuse a::X;\n")
            .file("m/src/a.rs", "mod inner;\nuse crate::b::Y;\npub struct X;\n")
            .file("m/src/a/inner.rs", "use super::X;\nuse super::super::b::Y;\n")
            .file(
                "m/src/b.rs",
                "pub struct Y;\nconst S: &str = \"crate::a::X\";\n/* crate::a */\n#[cfg(test)]\nmod tests {\n    use crate::a::X;\n}\n",
            )
            .file("m/src/b/tests.rs", "use crate::a::X;\n");
        let circles = import_circles(&tree.0.join("m/src"));
        assert!(circles.is_empty(), "{circles:?}");
    }

    #[test]
    fn a_circle_inside_a_module_is_found() {
        let tree = Tree::new("inner-circle");
        tree.file("m/src/lib.rs", "mod engine;\n")
            .file("m/src/engine.rs", "mod a;\nmod b;\n")
            .file("m/src/engine/a.rs", "use super::b::B;\n")
            .file("m/src/engine/b.rs", "use crate::engine::a::A;\n");
        let circles = import_circles(&tree.0.join("m/src"));
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert!(circles[0].starts_with("in `engine`"), "{circles:?}");
    }

    #[test]
    fn a_coordinator_to_worker_edge_is_refused() {
        let tree = Tree::new("edges");
        tree.file(
            "coordinator/Cargo.toml",
            "[package]\nname = \"llm-replay-coordinator\"\n\n[dependencies]\nllm-replay-common.workspace = true\nllm-replay-worker = { workspace = true }\n",
        )
        .file(
            "common/Cargo.toml",
            "[package]\nname = \"llm-replay-common\"\n\n[dev-dependencies]\nllm-replay-cli.workspace = true\n",
        );
        let wrong = forbidden_crate_edges(&tree.0);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("coordinator/Cargo.toml depends on llm-replay-worker"))
        );
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("common/Cargo.toml depends on llm-replay-cli"))
        );
    }

    #[test]
    fn a_generated_type_outside_its_layers_is_refused() {
        let tree = Tree::new("generated");
        tree.file("coordinator/src/lib.rs", "mod server;\nmod supervisor;\n")
            .file("coordinator/src/server.rs", "use proto::v1;\n")
            .file(
                "coordinator/src/supervisor.rs",
                "// proto::v1 named in a comment is fine\nfn f(m: proto::v1::Report) {}\n",
            )
            .file("worker/src/lib.rs", "mod link;\n")
            .file("worker/src/link.rs", "mod session;\nuse proto::v1;\n")
            .file("worker/src/link/session.rs", "use proto::v1::Grant;\n");
        let wrong = generated_types_outside_their_layers(&tree.0);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong
                .iter()
                .any(|w| w.starts_with("coordinator/src/supervisor.rs:2")),
            "{wrong:?}"
        );
        assert!(
            wrong
                .iter()
                .any(|w| w.starts_with("worker/src/link/session.rs:1")),
            "{wrong:?}"
        );
    }

    #[test]
    fn a_long_function_or_a_grown_one_is_refused() {
        let tree = Tree::new("long");
        let body = |n: usize| "    let x = 1;\n".repeat(n);
        tree.file(
            "worker/src/lib.rs",
            &format!(
                "pub fn short() {{\n{}}}\nfn long(a: u8) -> u8 {{\n{}    a\n}}\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
                body(10),
                body(160),
                body(200)
            ),
        )
        .file(
            "worker/src/grown.rs",
            &format!("fn grown() {{\n{}}}\n", body(170)),
        );
        let listed = [
            ("worker/src/grown.rs", "grown", 160),
            ("worker/src/gone.rs", "gone", 200),
        ];
        let wrong = long_functions(&tree.0, &["worker"], &listed);
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(
            wrong
                .iter()
                .any(|w| w.starts_with("worker/src/lib.rs:13: `long` is 163 lines")),
            "{wrong:?}"
        );
        assert!(
            wrong
                .iter()
                .any(|w| w.contains("`grown` grew to 172 lines (was 160)")),
            "{wrong:?}"
        );
        assert!(
            wrong.iter().any(|w| w.contains("`gone` is no longer over")),
            "{wrong:?}"
        );
    }

    #[test]
    fn printing_from_a_library_is_refused() {
        let tree = Tree::new("printing");
        tree.file("mock/src/lib.rs", "fn f() { eprintln!(\"x\"); }\n")
            .file("worker/src/cli.rs", "fn f() { println!(\"ok here\"); }\n")
            .file("worker/src/lib.rs", "mod cli;\n");
        let wrong = printing_from_libraries(&tree.0);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].starts_with("mock/src/lib.rs:1"), "{wrong:?}");
    }
}

//! A parser of the Prometheus text exposition format (version 0.0.4), and the reduction of
//! one scrape to one value per metric family.
//!
//! Hand-rolled, not a crate: `prometheus-parse` 0.2.5 (the most used one) reads metric
//! names with `\w+`, so it drops every `vllm:`/`sglang:` name, splits label pairs on `,` and
//! `=` (an escaped `"` or a `,` inside a label value breaks it) and pulls in chrono,
//! itertools, regex and once_cell; the others are unmaintained 0.1 releases (nom 5). The
//! format is line-based and small: about 250 lines here, with unit and property tests.
//!
//! What is read: `# TYPE` lines (other comments, `# HELP` and OpenMetrics' `# EOF` are
//! skipped), samples `name{label="value",...} value [timestamp]` with the escapes `\\`,
//! `\"`, `\n` in label values, Go's float spellings (`+Inf`, `-Inf`, `NaN`) and an optional
//! integer timestamp (read and ignored: the scrape's own instant is what counts).
//! What is refused, as a [`ParseError`], never a panic: an empty body, a body that is
//! not UTF-8, one that looks like HTML or JSON, a line that is not a sample, more than
//! [`MAX_SERIES`] samples.

use std::collections::{BTreeMap, HashMap};

/// The most samples one scrape may hold: beyond it the scrape is refused, so a hostile
/// or runaway endpoint cannot make the coordinator keep unbounded data.
pub const MAX_SERIES: usize = 50_000;

/// Why a body is not Prometheus text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// Nothing but white space.
    #[error("empty body")]
    Empty,
    /// Not UTF-8.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// Starts like HTML, XML or JSON.
    #[error("looks like {0}")]
    Markup(&'static str),
    /// A line that is neither a comment nor a sample.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was expected.
        reason: &'static str,
    },
    /// More than [`MAX_SERIES`] samples.
    #[error("more than {MAX_SERIES} series")]
    TooManySeries,
}

/// The type a `# TYPE` line declares (`untyped` when none does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
    /// `histogram`.
    Histogram,
    /// `summary`.
    Summary,
    /// `untyped`, or no `# TYPE` line.
    Untyped,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (e.g. `vllm:e2e_request_latency_seconds_bucket`).
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
    /// Its timestamp in milliseconds, if written.
    pub timestamp_ms: Option<i64>,
}

/// A parsed body: the declared types and the samples, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// Family name → declared type.
    pub types: HashMap<String, MetricType>,
    /// Every sample line.
    pub samples: Vec<Sample>,
}

/// One family's value in one scrape, its series summed over label sets (non-finite
/// samples skipped, summary families dropped).
#[derive(Debug, Clone, PartialEq)]
pub enum FamilyValue {
    /// A gauge, or an untyped family.
    Gauge(f64),
    /// A counter.
    Counter(f64),
    /// A histogram: cumulative buckets `(le, count)` sorted by `le`, `_sum` and `_count`.
    Histogram {
        /// `(upper bound, cumulative count)`, ascending, summed per bound over label sets.
        buckets: Vec<(f64, f64)>,
        /// Sum of observations.
        sum: f64,
        /// Number of observations.
        count: f64,
    },
}

/// Families whose series are also kept apart by one label, as `family{label="value"}`:
/// their total means nothing (TensorRT-LLM counts waiting, active and the maximum of
/// requests in one family).
pub const SPLIT_BY_LABEL: &[(&str, &str)] = &[
    ("nv_trt_llm_request_metrics", "request_type"),
    ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"),
];

/// Parse `body` as Prometheus text.
pub fn parse(body: &[u8]) -> Result<Exposition, ParseError> {
    let text = std::str::from_utf8(body).map_err(|_| ParseError::NotUtf8)?;
    let trimmed = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if trimmed.is_empty() {
        return Err(ParseError::Empty);
    }
    if trimmed.starts_with('<') {
        return Err(ParseError::Markup("HTML or XML"));
    }
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Err(ParseError::Markup("JSON"));
    }
    let mut exposition = Exposition::default();
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = line.trim_matches([' ', '\t', '\r']);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if words.next() == Some("TYPE")
                && let (Some(name), Some(kind)) = (words.next(), words.next())
            {
                let kind = match kind {
                    "counter" => MetricType::Counter,
                    "gauge" => MetricType::Gauge,
                    "histogram" => MetricType::Histogram,
                    "summary" => MetricType::Summary,
                    _ => MetricType::Untyped,
                };
                exposition.types.insert(name.to_owned(), kind);
            }
            continue;
        }
        if exposition.samples.len() >= MAX_SERIES {
            return Err(ParseError::TooManySeries);
        }
        let sample = parse_sample(line).map_err(|reason| ParseError::Line {
            line: line_number,
            reason,
        })?;
        exposition.samples.push(sample);
    }
    Ok(exposition)
}

/// One sample line (trimmed, not a comment).
fn parse_sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("expected a metric name");
    }
    let after_name = &line[name_end..];
    let trimmed = after_name.trim_start_matches([' ', '\t']);
    let mut labels = Vec::new();
    // As Prometheus' own parser: blanks may stand before `{` and after `}`.
    let rest = if let Some(after_brace) = trimmed.strip_prefix('{') {
        parse_labels(after_brace, &mut labels)?
    } else if trimmed.len() == after_name.len() {
        return Err("expected white space or `{` after the metric name");
    } else {
        trimmed
    };
    let mut words = rest.split_whitespace();
    let value = words.next().ok_or("expected a value")?;
    let value = parse_float(value).ok_or("the value is not a number")?;
    let timestamp_ms = match words.next() {
        None => None,
        Some(word) => Some(
            word.parse::<i64>()
                .map_err(|_| "the timestamp is not an integer")?,
        ),
    };
    if words.next().is_some() {
        return Err("unexpected text after the timestamp");
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Labels after `{`, up to and including `}`; returns what follows.
fn parse_labels<'a>(
    mut rest: &'a str,
    labels: &mut Vec<(String, String)>,
) -> Result<&'a str, &'static str> {
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let label = &rest[..name_end];
        if label.is_empty() {
            return Err("expected a label name");
        }
        rest = rest[name_end..].trim_start_matches([' ', '\t']);
        rest = rest
            .strip_prefix('=')
            .ok_or("expected `=` after a label name")?;
        rest = rest.trim_start_matches([' ', '\t']);
        rest = rest
            .strip_prefix('"')
            .ok_or("expected a quoted label value")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value"),
                Some((at, '"')) => break at,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    // Prometheus keeps an unknown escape as written.
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err("unterminated label value"),
                },
                Some((_, other)) => value.push(other),
            }
        };
        labels.push((label.to_owned(), value));
        rest = rest[end + 1..].trim_start_matches([' ', '\t']);
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("expected `,` or `}` after a label value");
        }
    }
}

/// A metric name's characters: `[a-zA-Z0-9_:]`.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Go's float syntax as Prometheus writes it (`+Inf`, `-Inf`, `NaN`, exponents).
pub(crate) fn parse_float(word: &str) -> Option<f64> {
    match word {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        // Rust also reads `infinity` and `nan` in any case; Go's parser reads them too.
        _ => word.parse::<f64>().ok(),
    }
}

/// Label names that say which replica (process) answered: a balancer or gateway that
/// relays several replicas' metrics often keeps them.
pub const REPLICA_LABELS: [&str; 5] = ["instance", "pod", "replica", "server", "hostname"];

/// Which replica answered this scrape, as far as its labels say: every distinct
/// `name="value"` of a [`REPLICA_LABELS`] label, sorted and joined with `,` (control
/// characters escaped, at most 200 characters); `None` when no sample carries one.
pub fn replica_identity(exposition: &Exposition) -> Option<String> {
    let mut seen = std::collections::BTreeSet::new();
    for sample in &exposition.samples {
        for (name, value) in &sample.labels {
            if REPLICA_LABELS.contains(&name.as_str()) && seen.len() < 16 {
                seen.insert(format!("{name}=\"{value}\""));
            }
        }
    }
    if seen.is_empty() {
        return None;
    }
    let joined = seen.into_iter().collect::<Vec<_>>().join(",");
    let shown: String = joined.chars().take(200).collect();
    Some(common::text::escape_controls(&shown).into_owned())
}

/// Reduce a parsed body to one value per family (see [`FamilyValue`]).
///
/// A sample belongs to the family its `# TYPE` line names; `NAME_bucket`, `NAME_sum`,
/// `NAME_count` to histogram `NAME`; `NAME_total` to counter `NAME` (OpenMetrics style);
/// any other sample is an untyped family of its own name, read as a gauge.
pub fn reduce(exposition: &Exposition) -> BTreeMap<String, FamilyValue> {
    let mut families: BTreeMap<String, FamilyValue> = BTreeMap::new();
    for sample in &exposition.samples {
        let (family, kind, suffix) = family_of(&sample.name, &exposition.types);
        if is_created_timestamp(family, &exposition.types) {
            continue;
        }
        let keys = split_keys(family, &sample.labels);
        for key in keys {
            match kind {
                MetricType::Summary => {}
                MetricType::Gauge | MetricType::Untyped => {
                    if sample.value.is_finite() {
                        let entry = families.entry(key).or_insert(FamilyValue::Gauge(0.0));
                        if let FamilyValue::Gauge(total) = entry {
                            *total += sample.value;
                        }
                    }
                }
                MetricType::Counter => {
                    if sample.value.is_finite() {
                        let entry = families.entry(key).or_insert(FamilyValue::Counter(0.0));
                        if let FamilyValue::Counter(total) = entry {
                            *total += sample.value;
                        }
                    }
                }
                MetricType::Histogram => {
                    let entry = families.entry(key).or_insert(FamilyValue::Histogram {
                        buckets: Vec::new(),
                        sum: 0.0,
                        count: 0.0,
                    });
                    let FamilyValue::Histogram {
                        buckets,
                        sum,
                        count,
                    } = entry
                    else {
                        continue;
                    };
                    if !sample.value.is_finite() {
                        continue;
                    }
                    match suffix {
                        Suffix::Bucket => {
                            let le = sample
                                .labels
                                .iter()
                                .find(|(name, _)| name == "le")
                                .and_then(|(_, le)| parse_float(le));
                            if let Some(le) = le.filter(|le| !le.is_nan()) {
                                add_bucket(buckets, le, sample.value);
                            }
                        }
                        Suffix::Sum => *sum += sample.value,
                        Suffix::Count => *count += sample.value,
                        Suffix::None | Suffix::Total => {}
                    }
                }
            }
        }
    }
    families
}

/// Add `value` to the bucket of bound `le`, keeping the buckets sorted.
pub(crate) fn add_bucket(buckets: &mut Vec<(f64, f64)>, le: f64, value: f64) {
    match buckets.binary_search_by(|(bound, _)| bound.total_cmp(&le)) {
        Ok(at) => buckets[at].1 += value,
        Err(at) => buckets.insert(at, (le, value)),
    }
}

/// Which suffix tied a sample to its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suffix {
    None,
    Bucket,
    Sum,
    Count,
    Total,
}

/// True for `X_created`, the creation timestamp `prometheus_client` writes beside each
/// counter and histogram `X` (38 of vLLM's 90 families): a Unix time, not a measurement, left
/// out of the report.
fn is_created_timestamp(family: &str, types: &HashMap<String, MetricType>) -> bool {
    family.strip_suffix("_created").is_some_and(|stem| {
        types.contains_key(stem) || types.contains_key(&format!("{stem}_total"))
    })
}

/// The family, its type, and the suffix of sample `name`.
fn family_of<'a>(
    name: &'a str,
    types: &HashMap<String, MetricType>,
) -> (&'a str, MetricType, Suffix) {
    if let Some(kind) = types.get(name) {
        return (name, *kind, Suffix::None);
    }
    for (suffix, tag) in [
        ("_bucket", Suffix::Bucket),
        ("_sum", Suffix::Sum),
        ("_count", Suffix::Count),
        ("_total", Suffix::Total),
    ] {
        if let Some(family) = name.strip_suffix(suffix)
            && let Some(kind) = types.get(family)
        {
            let fits = match tag {
                Suffix::Total => *kind == MetricType::Counter,
                _ => matches!(kind, MetricType::Histogram | MetricType::Summary),
            };
            if fits {
                return (family, *kind, tag);
            }
        }
    }
    (name, MetricType::Untyped, Suffix::None)
}

/// The keys a sample adds to: its family, and `family{label="value"}` for the families of
/// [`SPLIT_BY_LABEL`].
fn split_keys(family: &str, labels: &[(String, String)]) -> Vec<String> {
    let mut keys = vec![family.to_owned()];
    for (split_family, split_label) in SPLIT_BY_LABEL {
        if family == *split_family
            && let Some((_, value)) = labels.iter().find(|(name, _)| name == split_label)
        {
            keys.push(format!("{family}{{{split_label}=\"{value}\"}}"));
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn created_timestamps_are_left_out_and_a_lone_created_family_kept() {
        let text = "# TYPE vllm:prompt_tokens_total counter\n\
                    vllm:prompt_tokens_total{engine=\"0\"} 12\n\
                    # TYPE vllm:prompt_tokens_created gauge\n\
                    vllm:prompt_tokens_created{engine=\"0\"} 1.7e9\n\
                    # TYPE vllm:e2e_request_latency_seconds histogram\n\
                    vllm:e2e_request_latency_seconds_count 1\n\
                    # TYPE vllm:e2e_request_latency_seconds_created gauge\n\
                    vllm:e2e_request_latency_seconds_created 1.7e9\n\
                    # TYPE jobs_created gauge\njobs_created 4\n";
        let families = reduce(&parse(text.as_bytes()).expect("valid"));
        let names: Vec<&str> = families.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "jobs_created",
                "vllm:e2e_request_latency_seconds",
                "vllm:prompt_tokens_total"
            ]
        );
    }

    const VLLM: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 1.5e+03
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.25
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile="0.5"} 0.2
rpc_duration_seconds_sum 10
rpc_duration_seconds_count 50
process_open_fds 12 1395066363000
# EOF
"#;

    #[test]
    fn reads_a_vllm_body_into_families() {
        let families = reduce(&parse(VLLM.as_bytes()).expect("valid"));
        assert_eq!(
            families.get("vllm:num_requests_waiting"),
            Some(&FamilyValue::Gauge(5.0))
        );
        assert_eq!(
            families.get("vllm:prompt_tokens_total"),
            Some(&FamilyValue::Counter(1500.0))
        );
        assert_eq!(
            families.get("vllm:time_to_first_token_seconds"),
            Some(&FamilyValue::Histogram {
                buckets: vec![(0.1, 1.0), (0.5, 3.0), (f64::INFINITY, 4.0)],
                sum: 1.25,
                count: 4.0,
            })
        );
        assert_eq!(
            families.get("process_open_fds"),
            Some(&FamilyValue::Gauge(12.0))
        );
        assert!(!families.contains_key("rpc_duration_seconds"));
        assert!(!families.contains_key("rpc_duration_seconds_sum"));
    }

    #[test]
    fn reads_escapes_odd_spacing_and_special_values() {
        let body = "a{path=\"C:\\\\x\",q=\"say \\\"hi\\\", ok}\",n=\"1\\n2\",} NaN\n\
                    b { x = \"}\" }\t+Inf -5\nc -Inf\n";
        let exposition = parse(body.as_bytes()).expect("valid");
        let a = &exposition.samples[0];
        assert_eq!(
            a.labels,
            vec![
                ("path".to_owned(), "C:\\x".to_owned()),
                ("q".to_owned(), "say \"hi\", ok}".to_owned()),
                ("n".to_owned(), "1\n2".to_owned()),
            ]
        );
        assert!(a.value.is_nan());
        assert_eq!(exposition.samples[1].value, f64::INFINITY);
        assert_eq!(exposition.samples[1].timestamp_ms, Some(-5));
        assert_eq!(exposition.samples[2].value, f64::NEG_INFINITY);
    }

    #[test]
    fn refuses_what_is_not_prometheus_text() {
        assert_eq!(parse(b""), Err(ParseError::Empty));
        assert_eq!(parse(b" \n\n"), Err(ParseError::Empty));
        assert_eq!(
            parse(b"<!DOCTYPE html><html></html>"),
            Err(ParseError::Markup("HTML or XML"))
        );
        assert_eq!(
            parse(b"{\"detail\":\"Not Found\"}"),
            Err(ParseError::Markup("JSON"))
        );
        assert_eq!(parse(&[0xff, 0xfe, 0x00]), Err(ParseError::NotUtf8));
        assert!(matches!(
            parse(b"# ok\nNot Found\n"),
            Err(ParseError::Line { line: 2, .. })
        ));
        assert!(matches!(
            parse(b"a{b=\"c} 1\n"),
            Err(ParseError::Line { line: 1, .. })
        ));
        assert!(matches!(
            parse(b"a 1 2 3\n"),
            Err(ParseError::Line { line: 1, .. })
        ));
    }

    #[test]
    fn bounds_the_series_kept() {
        let body: String = (0..=MAX_SERIES)
            .map(|i| format!("m{{i=\"{i}\"}} 1\n"))
            .collect();
        assert_eq!(parse(body.as_bytes()), Err(ParseError::TooManySeries));
    }

    #[test]
    fn splits_tensorrt_llm_request_types() {
        let body = "# TYPE nv_trt_llm_request_metrics gauge\n\
                    nv_trt_llm_request_metrics{model=\"m\",request_type=\"waiting\"} 4\n\
                    nv_trt_llm_request_metrics{model=\"m\",request_type=\"active\"} 6\n";
        let families = reduce(&parse(body.as_bytes()).expect("valid"));
        assert_eq!(
            families.get("nv_trt_llm_request_metrics{request_type=\"waiting\"}"),
            Some(&FamilyValue::Gauge(4.0))
        );
        assert_eq!(
            families.get("nv_trt_llm_request_metrics"),
            Some(&FamilyValue::Gauge(10.0))
        );
    }

    /// Write a label value as Prometheus does.
    fn escape(value: &str) -> String {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    }

    /// Write a float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` would, near enough.
    fn format_float(value: f64) -> String {
        if value.is_nan() {
            "NaN".to_owned()
        } else if value == f64::INFINITY {
            "+Inf".to_owned()
        } else if value == f64::NEG_INFINITY {
            "-Inf".to_owned()
        } else {
            format!("{value:e}")
        }
    }

    fn arb_sample() -> impl Strategy<Value = Sample> {
        let name = "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}";
        let labels = prop::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "\\PC{0,12}"), 0..4);
        let value = prop_oneof![
            any::<f64>(),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::NAN),
            (-1e6f64..1e6),
        ];
        let timestamp = prop::option::of(any::<i64>());
        (name, labels, value, timestamp).prop_map(|(name, labels, value, timestamp_ms)| Sample {
            name,
            labels,
            value,
            timestamp_ms,
        })
    }

    fn render(samples: &[Sample]) -> String {
        let mut text = String::from("# HELP x some help\n");
        for sample in samples {
            text.push_str(&sample.name);
            if !sample.labels.is_empty() {
                let labels: Vec<String> = sample
                    .labels
                    .iter()
                    .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
                    .collect();
                text.push_str(&format!("{{{}}}", labels.join(",")));
            }
            text.push(' ');
            text.push_str(&format_float(sample.value));
            if let Some(timestamp) = sample.timestamp_ms {
                text.push_str(&format!(" {timestamp}"));
            }
            text.push('\n');
        }
        text
    }

    proptest! {
        #[test]
        fn generated_text_round_trips(samples in prop::collection::vec(arb_sample(), 1..20)) {
            let parsed = parse(render(&samples).as_bytes()).expect("generated text is valid");
            prop_assert_eq!(parsed.samples.len(), samples.len());
            for (got, want) in parsed.samples.iter().zip(&samples) {
                prop_assert_eq!(&got.name, &want.name);
                prop_assert_eq!(&got.labels, &want.labels);
                prop_assert_eq!(got.timestamp_ms, want.timestamp_ms);
                prop_assert!(
                    got.value == want.value || (got.value.is_nan() && want.value.is_nan()),
                    "{} != {}", got.value, want.value
                );
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(exposition) = parse(&body) {
                let _ = reduce(&exposition);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(body in "\\PC{0,200}") {
            if let Ok(exposition) = parse(body.as_bytes()) {
                let _ = reduce(&exposition);
            }
        }
    }
}

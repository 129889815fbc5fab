//! Azure LLM inference trace CSVs (`TIMESTAMP,ContextTokens,GeneratedTokens`, the Splitwise
//! 2023 release) → timed chat requests with synthesised prompts of `ContextTokens` tokens and
//! `max_tokens = GeneratedTokens`.
//!
//! Arrival offsets are exact: timestamps are parsed to 100 ns ticks (the CSV has 7 fractional
//! digits) and offset from the earliest one.

use std::io::BufRead;

use common::recording::SourceNote;

use super::{
    ImportError, ImportFormat, Sink, Source, Synth, csv_fields, exchange, json_request, synth_note,
    synthetic_chat_body,
};

struct Row {
    ticks: i64,
    context_tokens: u64,
    generated_tokens: u64,
}

/// Import `source` into `sink`.
pub fn import(
    source: &Source,
    sink: &mut Sink,
    synth: &Synth,
    model: &str,
) -> Result<(), ImportError> {
    // Pass 1: validate every row and find the earliest timestamp (rows are sorted in the
    // published files, but nothing requires it).
    let mut earliest = i64::MAX;
    for_each_row(source, &mut |_, row| {
        earliest = earliest.min(row.ticks);
        Ok(true)
    })?;
    // Pass 2: emit.
    for_each_row(source, &mut |line, row| {
        if !sink.wants_more() {
            return Ok(false);
        }
        let input = usize::try_from(row.context_tokens).unwrap_or(usize::MAX);
        let (prompt, counted) = synth.exact_prompt(line ^ (0xA2u64 << 56), input);
        let body = synthetic_chat_body(model, &prompt, Some(row.generated_tokens.max(1)));
        let mut ex = exchange(json_request("/v1/chat/completions", &body));
        ex.id = Some(format!("azure-{line}"));
        ex.at_ms = Some((row.ticks - earliest) as f64 / 10_000.0);
        ex.unknown
            .insert("synth".into(), synth_note(synth, counted));
        ex.set_source_note(&SourceNote {
            line: Some(line),
            output_tokens: Some(row.generated_tokens),
            ..SourceNote::new(ImportFormat::AzureTrace.name())
        });
        sink.emit(&ex)?;
        Ok(true)
    })
}

fn for_each_row(
    source: &Source,
    on_row: &mut dyn FnMut(u64, Row) -> Result<bool, ImportError>,
) -> Result<(), ImportError> {
    let reader = source.open()?;
    let mut columns: Option<[usize; 3]> = None;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index as u64 + 1;
        let line = line.map_err(|e| source.read_error(line_no, e))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields = csv_fields(line);
        let Some(cols) = columns else {
            let find = |name: &str| {
                fields
                    .iter()
                    .position(|f| f.trim().eq_ignore_ascii_case(name))
                    .ok_or_else(|| {
                        source.invalid(
                            line_no,
                            "(header)",
                            format!(
                                "expected a header with TIMESTAMP,ContextTokens,GeneratedTokens; no {name} column in {line:?}"
                            ),
                        )
                    })
            };
            columns = Some([
                find("TIMESTAMP")?,
                find("ContextTokens")?,
                find("GeneratedTokens")?,
            ]);
            continue;
        };
        let get = |i: usize, name: &str| {
            fields
                .get(cols[i])
                .map(|f| f.trim())
                .ok_or_else(|| source.invalid(line_no, name, "missing field"))
        };
        let timestamp = get(0, "TIMESTAMP")?;
        let ticks = parse_timestamp_ticks(timestamp).ok_or_else(|| {
            source.invalid(
                line_no,
                "TIMESTAMP",
                format!("expected YYYY-MM-DD HH:MM:SS[.fffffff], got {timestamp:?}"),
            )
        })?;
        let number = |i: usize, name: &str| -> Result<u64, ImportError> {
            let text = get(i, name)?;
            text.parse::<u64>().map_err(|_| {
                source.invalid(
                    line_no,
                    name,
                    format!("expected a non-negative integer, got {text:?}"),
                )
            })
        };
        let row = Row {
            ticks,
            context_tokens: number(1, "ContextTokens")?,
            generated_tokens: number(2, "GeneratedTokens")?,
        };
        if !on_row(line_no, row)? {
            break;
        }
    }
    if columns.is_none() {
        return Err(source.invalid(1, "(header)", "the file is empty"));
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS[.f…]` (or with `T`) → 100 ns ticks since 1970-01-01 (UTC assumed;
/// only differences are used). More than 7 fractional digits are truncated.
pub fn parse_timestamp_ticks(text: &str) -> Option<i64> {
    let text = text.trim().trim_end_matches('Z');
    let (date, time) = text.split_once([' ', 'T'])?;
    let mut date_parts = date.split('-');
    let year: i64 = date_parts.next()?.parse().ok()?;
    let month: u32 = date_parts.next()?.parse().ok()?;
    let day: u32 = date_parts.next()?.parse().ok()?;
    if date_parts.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, fraction)) => (hms, fraction),
        None => (time, ""),
    };
    let mut hms_parts = hms.split(':');
    let hour: i64 = hms_parts.next()?.parse().ok()?;
    let minute: i64 = hms_parts.next()?.parse().ok()?;
    let second: i64 = hms_parts.next()?.parse().ok()?;
    if hms_parts.next().is_some() || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut frac_ticks: i64 = 0;
    for i in 0..7 {
        let digit = fraction
            .as_bytes()
            .get(i)
            .map_or(0, |b| i64::from(b - b'0'));
        frac_ticks = frac_ticks * 10 + digit;
    }
    let days = common::civil::days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    Some(seconds * 10_000_000 + frac_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_to_exact_ticks() {
        let a = parse_timestamp_ticks("2023-11-16 18:15:46.6805900").expect("valid");
        let b = parse_timestamp_ticks("2023-11-16 18:15:50.9951690").expect("valid");
        assert_eq!(b - a, 43_145_790);
        assert_eq!(
            parse_timestamp_ticks("1970-01-02 00:00:00"),
            Some(86_400 * 10_000_000)
        );
        assert_eq!(parse_timestamp_ticks("2023-13-01 00:00:00"), None);
        assert_eq!(parse_timestamp_ticks("yesterday"), None);
    }
}

//! Sparse histograms: a worker's reported distributions as their non-zero buckets only.
//!
//! A coordinator receives a cumulative report from every worker every report interval. A
//! dense [`Histogram`] decoded from one is an array of 60–90 KB, allocated and zeroed for a
//! few hundred non-zero buckets, then cloned and subtracted for the time series: that was most
//! of a coordinator's CPU with hundreds of workers. [`SparseHistogram`] keeps the non-zero
//! buckets as `(value, count)` pairs, decoded straight from the V2+DEFLATE bytes (the same
//! checks as the dense decoder first), and adds into a dense histogram with one `record_n` per
//! bucket, which gives exactly the histogram the dense decode and `Histogram::add` give.

use hdrhistogram::Histogram;

use super::{
    Counters, ErrorSummary, Metric, MetricsDecodeError, RunMetrics, SIGNIFICANT_DIGITS, Stats,
    Window, stats_of, validated_v2,
};

/// One distribution as its non-zero buckets: `(value, count)` pairs in increasing value order,
/// `value` the lowest value that records into the bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseHistogram {
    buckets: Vec<(u64, u64)>,
    /// The sum of the counts (checked not to overflow when decoded).
    total: u64,
}

/// A worker's reported metrics with sparse histograms: what the coordinator keeps of each
/// report. The counters and the window are [`RunMetrics`]'s.
#[derive(Debug, Clone)]
pub struct SparseMetrics {
    /// [`Metric::every`]'s order, as in [`RunMetrics`].
    histograms: Vec<SparseHistogram>,
    pub counters: Counters,
    pub window: Option<Window>,
    /// What the failed requests were told (see [`RunMetrics::errors`]).
    pub errors: ErrorSummary,
}

impl Default for SparseMetrics {
    fn default() -> Self {
        SparseMetrics {
            histograms: Metric::every()
                .map(|_| SparseHistogram::default())
                .collect(),
            counters: Counters::default(),
            window: None,
            errors: ErrorSummary::default(),
        }
    }
}

// The bucket layout of an HDR histogram of `SIGNIFICANT_DIGITS` digits, as `hdrhistogram`
// computes it (`Histogram::new_with_bounds`): single-unit resolution up to 2 × 10^digits, so
// 2,048 sub-buckets per bucket, of which each bucket past the first uses the upper half.
const LARGEST_SINGLE_UNIT: u32 = 2 * 10u32.pow(SIGNIFICANT_DIGITS as u32);
const SUB_BUCKET_COUNT: u64 = LARGEST_SINGLE_UNIT.next_power_of_two() as u64;
const SUB_BUCKET_COUNT_MAGNITUDE: u32 = SUB_BUCKET_COUNT.trailing_zeros();
const SUB_BUCKET_HALF_COUNT: u64 = SUB_BUCKET_COUNT / 2;
const SUB_BUCKET_HALF_COUNT_MAGNITUDE: u32 = SUB_BUCKET_COUNT_MAGNITUDE - 1;

/// Where the counts of a V2 histogram go: its unit and how many counts its array holds.
struct Layout {
    unit_magnitude: u32,
    counts_len: u64,
}

impl Layout {
    /// The layout of `Histogram::new_with_bounds(lowest, highest, SIGNIFICANT_DIGITS)`.
    fn new(lowest: u64, highest: u64) -> Result<Layout, &'static str> {
        // As `hdrhistogram` computes it (through `f64`), so that a value maps where the dense
        // decoder puts it even for a lowest value just under a power of two.
        let unit_magnitude = (lowest as f64).log2().floor() as u32;
        if unit_magnitude + SUB_BUCKET_COUNT_MAGNITUDE > 63 {
            return Err("value range out of bounds");
        }
        // `Histogram::buckets_to_cover(highest)`.
        let mut smallest_untrackable = SUB_BUCKET_COUNT << unit_magnitude;
        let mut buckets: u64 = 1;
        while smallest_untrackable <= highest {
            if smallest_untrackable > u64::MAX / 2 {
                buckets += 1;
                break;
            }
            smallest_untrackable <<= 1;
            buckets += 1;
        }
        Ok(Layout {
            unit_magnitude,
            counts_len: (buckets + 1) * SUB_BUCKET_HALF_COUNT,
        })
    }

    /// The lowest value of the bucket at `index` (`Histogram::value_for`), `None` past the
    /// array.
    fn value_for(&self, index: u64) -> Option<u64> {
        if index >= self.counts_len {
            return None;
        }
        let (bucket, sub_bucket) = match (index >> SUB_BUCKET_HALF_COUNT_MAGNITUDE).checked_sub(1) {
            // The lower half of the first bucket.
            None => (0, index),
            Some(bucket) => (
                bucket,
                (index & (SUB_BUCKET_HALF_COUNT - 1)) + SUB_BUCKET_HALF_COUNT,
            ),
        };
        let shift = u32::try_from(bucket).ok()? + self.unit_magnitude;
        let value = sub_bucket.checked_shl(shift)?;
        // Bits shifted out would be a value past u64 (no valid layout has one).
        (value >> shift == sub_bucket).then_some(value)
    }
}

/// A V2 counts array: LEB128 varints (at most 9 bytes, the 9th whole), ZigZag-encoded;
/// a negative number is that many empty buckets.
struct Counts<'a> {
    bytes: &'a [u8],
}

impl Iterator for Counts<'_> {
    type Item = Result<i64, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let mut value: u64 = 0;
        for i in 0..9 {
            let Some(&byte) = self.bytes.get(i) else {
                self.bytes = &[];
                return Some(Err("truncated count"));
            };
            if i == 8 {
                value |= u64::from(byte) << 56;
            } else {
                value |= u64::from(byte & 0x7f) << (7 * i);
                if byte & 0x80 == 0 {
                    self.bytes = &self.bytes[i + 1..];
                    return Some(Ok(zig_zag_decode(value)));
                }
            }
        }
        self.bytes = &self.bytes[9..];
        Some(Ok(zig_zag_decode(value)))
    }
}

fn zig_zag_decode(encoded: u64) -> i64 {
    ((encoded >> 1) as i64) ^ -((encoded & 1) as i64)
}

impl SparseHistogram {
    /// Decode one V2 or V2+DEFLATE histogram from a peer (as [`RunMetrics::encode_all`]
    /// writes them), checked like the dense decoder's input (sizes, cookies, precision, value
    /// range), without allocating by what its header claims. `metric` names it in errors.
    pub fn decode(
        bytes: &[u8],
        metric: &'static str,
    ) -> Result<SparseHistogram, MetricsDecodeError> {
        let invalid = |reason| MetricsDecodeError::Invalid { metric, reason };
        let inner = validated_v2(bytes, metric)?;
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_be_bytes(inner.get(at..at + 4)?.try_into().ok()?))
        };
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(inner.get(at..at + 8)?.try_into().ok()?))
        };
        // `validated_v2` checked the cookie, the payload length, the precision and the range.
        if u32_at(8) != Some(0) {
            return Err(invalid("normalizing offset is not supported"));
        }
        if u64_at(32).map(f64::from_bits) != Some(1.0) {
            return Err(invalid("integer to double ratio is not supported"));
        }
        let lowest = u64_at(16).ok_or(invalid("truncated header"))?;
        let highest = u64_at(24).ok_or(invalid("truncated header"))?;
        let layout = Layout::new(lowest, highest).map_err(invalid)?;
        let mut histogram = SparseHistogram::default();
        let mut index: u64 = 0;
        // `validated_v2` checked that the 40 bytes of the header are there.
        let payload = inner.get(40..).unwrap_or_default();
        for count in (Counts { bytes: payload }) {
            let count = count.map_err(invalid)?;
            if count < 0 {
                // A valid encoder writes no run past the last count: refuse one past the
                // array (stricter than the dense decoder, which skips it).
                index = index
                    .checked_add(count.unsigned_abs())
                    .filter(|index| *index <= layout.counts_len)
                    .ok_or(invalid("a run of empty buckets past the range"))?;
                continue;
            }
            if count > 0 {
                let value = layout
                    .value_for(index)
                    .ok_or(invalid("a count past the value range"))?;
                let count = count.unsigned_abs();
                histogram.total = histogram
                    .total
                    .checked_add(count)
                    .ok_or(invalid("the counts overflow"))?;
                histogram.buckets.push((value, count));
            }
            index = index
                .checked_add(1)
                .ok_or(invalid("a count past the value range"))?;
        }
        Ok(histogram)
    }

    /// The non-zero buckets of a dense histogram.
    pub fn from_histogram(histogram: &Histogram<u64>) -> SparseHistogram {
        let buckets: Vec<(u64, u64)> = histogram
            .iter_recorded()
            .map(|v| {
                (
                    histogram.lowest_equivalent(v.value_iterated_to()),
                    v.count_at_value(),
                )
            })
            .collect();
        SparseHistogram {
            total: buckets.iter().map(|(_, count)| count).sum(),
            buckets,
        }
    }

    /// The non-zero buckets: `(lowest value of the bucket, count)`, in increasing value order.
    pub fn buckets(&self) -> &[(u64, u64)] {
        &self.buckets
    }

    /// Samples in the histogram.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// No samples.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Add these samples into `into`, which must auto-resize (as every histogram of
    /// [`RunMetrics`] and `Histogram::new` does): the result is exactly `into.add(&dense)` of
    /// the dense histogram these buckets came from.
    pub fn add_into(&self, into: &mut Histogram<u64>) {
        for &(value, count) in &self.buckets {
            // Decoded values are under 2^54 (the highest trackable value is checked), which an
            // auto-resizing histogram always takes.
            into.record_n(value, count)
                .expect("an auto-resizing histogram takes any checked value");
        }
    }

    /// A dense histogram of these samples (auto-resizing, like [`RunMetrics`]'s).
    pub fn to_histogram(&self) -> Histogram<u64> {
        let mut histogram =
            Histogram::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid");
        self.add_into(&mut histogram);
        histogram
    }

    /// The samples of this cumulative histogram that `previous` (an earlier one of the same
    /// worker) does not hold, bucket by bucket. `None` when some bucket of `previous` holds
    /// more than this one (its numbers went back, which a valid worker never does): the
    /// caller counts nothing from it, as `Histogram::subtract` refuses it.
    pub fn minus(&self, previous: &SparseHistogram) -> Option<SparseHistogram> {
        let mut delta = SparseHistogram {
            buckets: Vec::with_capacity(self.buckets.len()),
            total: 0,
        };
        let mut earlier = previous.buckets.iter().peekable();
        for &(value, count) in &self.buckets {
            let mut before = 0;
            while let Some(&&(earlier_value, earlier_count)) = earlier.peek() {
                if earlier_value > value {
                    break;
                }
                if earlier_value < value {
                    // A bucket that emptied.
                    return None;
                }
                before = earlier_count;
                earlier.next();
            }
            let difference = count.checked_sub(before)?;
            if difference > 0 {
                delta.buckets.push((value, difference));
                delta.total += difference;
            }
        }
        // Buckets of `previous` past this one's last went back too.
        earlier.next().is_none().then_some(delta)
    }
}

impl SparseMetrics {
    /// Decode a report's histograms, as [`RunMetrics::decode_with_connections`] does, into
    /// sparse ones.
    pub fn decode_with_connections(
        encoded: &[Vec<u8>],
        connections: &[Vec<u8>],
        counters: Counters,
        window: Option<Window>,
    ) -> Result<SparseMetrics, MetricsDecodeError> {
        if !connections.is_empty() && connections.len() != Metric::CONNECTION.len() {
            return Err(MetricsDecodeError::HistogramCount {
                expected: Metric::CONNECTION.len(),
                got: connections.len(),
            });
        }
        if encoded.len() != Metric::ALL.len() {
            return Err(MetricsDecodeError::HistogramCount {
                expected: Metric::ALL.len(),
                got: encoded.len(),
            });
        }
        let mut histograms = Vec::with_capacity(Metric::ALL.len() + Metric::CONNECTION.len());
        for (bytes, metric) in encoded.iter().zip(Metric::ALL) {
            histograms.push(SparseHistogram::decode(bytes, metric.json_key())?);
        }
        for (i, metric) in Metric::CONNECTION.into_iter().enumerate() {
            histograms.push(match connections.get(i) {
                Some(bytes) => SparseHistogram::decode(bytes, metric.json_key())?,
                None => SparseHistogram::default(),
            });
        }
        histograms.extend(Metric::FAILURE.map(|_| SparseHistogram::default()));
        Ok(SparseMetrics {
            histograms,
            counters,
            window,
            errors: ErrorSummary::default(),
        })
    }

    /// Set the failure histograms from [`RunMetrics::encode_failure`] output; `encoded` may
    /// be empty (an older peer: no samples).
    pub fn decode_failure(&mut self, encoded: &[Vec<u8>]) -> Result<(), MetricsDecodeError> {
        if encoded.is_empty() {
            return Ok(());
        }
        if encoded.len() != Metric::FAILURE.len() {
            return Err(MetricsDecodeError::HistogramCount {
                expected: Metric::FAILURE.len(),
                got: encoded.len(),
            });
        }
        for (bytes, metric) in encoded.iter().zip(Metric::FAILURE) {
            self.histograms[metric.index()] = SparseHistogram::decode(bytes, metric.json_key())?;
        }
        Ok(())
    }

    /// The histogram of `metric`.
    pub fn histogram(&self, metric: Metric) -> &SparseHistogram {
        &self.histograms[metric.index()]
    }

    /// Summary statistics of `metric` in display units, exactly [`RunMetrics::stats`]'s (from
    /// a dense histogram built for the call); `None` when it has no samples.
    pub fn stats(&self, metric: Metric) -> Option<Stats> {
        stats_of(
            &self.histogram(metric).to_histogram(),
            metric.unit().scale(),
        )
    }
}

impl From<&RunMetrics> for SparseMetrics {
    fn from(metrics: &RunMetrics) -> SparseMetrics {
        SparseMetrics {
            histograms: metrics
                .histograms
                .iter()
                .map(SparseHistogram::from_histogram)
                .collect(),
            counters: metrics.counters,
            window: metrics.window,
            errors: metrics.errors.clone(),
        }
    }
}

impl RunMetrics {
    /// [`RunMetrics::merge`] of sparse metrics: histograms add exactly, counters add, windows
    /// widen.
    pub fn merge_sparse(&mut self, other: &SparseMetrics) {
        for (mine, theirs) in self.histograms.iter_mut().zip(&other.histograms) {
            theirs.add_into(mine);
        }
        self.counters.add(&other.counters);
        if let Some(window) = other.window {
            self.extend_window(window);
        }
        self.errors.merge(&other.errors);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};

    /// xorshift64*, so that the tests need no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    fn encode(histogram: &Histogram<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        V2DeflateSerializer::new()
            .serialize(histogram, &mut out)
            .expect("serializes");
        out
    }

    /// The dense decoder's histogram, auto-resizing as `RunMetrics::decode` makes it.
    fn dense_decode(bytes: &[u8]) -> Histogram<u64> {
        let mut h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut &bytes[..])
            .expect("valid");
        h.auto(true);
        h
    }

    /// Histograms a worker sends: empty, one value, zero, and random values over several
    /// magnitudes (µs to hours, and up near the decoder's cap), with repeats.
    fn sample_histograms(rng: &mut Rng) -> Vec<Histogram<u64>> {
        let new = || Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
        let mut out = vec![new()];
        let mut one = new();
        one.record(1_234_567).expect("records");
        out.push(one);
        let mut zero = new();
        zero.record_n(0, 3).expect("records");
        zero.record(7).expect("records");
        out.push(zero);
        for case in 0..60 {
            let mut h = new();
            let samples = 1 + rng.next() % 2_000;
            for _ in 0..samples {
                let magnitude = rng.next() % if case % 10 == 0 { 15 } else { 11 };
                let value = rng.next() % 10u64.pow(magnitude as u32 + 1);
                h.record_n(value, 1 + rng.next() % 3).expect("records");
            }
            out.push(h);
        }
        out
    }

    /// Every bucket and every statistic of `a` and `b`.
    fn assert_same(a: &Histogram<u64>, b: &Histogram<u64>, what: &str) {
        assert_eq!(a, b, "{what}");
        let buckets = |h: &Histogram<u64>| -> Vec<(u64, u64)> {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        };
        assert_eq!(buckets(a), buckets(b), "{what}");
        assert_eq!(stats_of(a, 1.0), stats_of(b, 1.0), "{what}");
        assert_eq!(
            (a.min(), a.max(), a.len()),
            (b.min(), b.max(), b.len()),
            "{what}"
        );
    }

    /// The sparse decode added into a histogram gives exactly what the dense decode added
    /// into it gives, into an empty histogram and into one that already holds samples.
    #[test]
    fn sparse_decode_adds_exactly_as_the_dense_decode() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let histograms = sample_histograms(&mut rng);
        let mut dense_total = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
        let mut sparse_total = dense_total.clone();
        for (case, original) in histograms.iter().enumerate() {
            let bytes = encode(original);
            let sparse = SparseHistogram::decode(&bytes, "ttft_ms").expect("valid");
            let dense = dense_decode(&bytes);
            assert_eq!(sparse.len(), original.len(), "case {case}");
            assert_eq!(
                sparse,
                SparseHistogram::from_histogram(original),
                "case {case}"
            );
            assert_same(
                &sparse.to_histogram(),
                original,
                &format!("case {case} alone"),
            );

            dense_total.add(&dense).expect("adds");
            sparse.add_into(&mut sparse_total);
            assert_same(&sparse_total, &dense_total, &format!("case {case} summed"));
        }
        assert!(dense_total.len() > 10_000);
    }

    /// Histograms whose lowest discernible value is not 1 (a peer may send one): each value
    /// still lands in the bucket the dense decode and `add` put it in.
    #[test]
    fn other_value_ranges_decode_to_the_same_buckets() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for lowest in [1, 2, 3, 1_000, 1_023, 1_024, 1 << 20] {
            let mut h =
                Histogram::<u64>::new_with_bounds(lowest, 1 << 50, SIGNIFICANT_DIGITS).expect("ok");
            for _ in 0..500 {
                let magnitude = rng.next() % 14;
                let _ = h.record(rng.next() % 10u64.pow(magnitude as u32 + 1));
            }
            let bytes = encode(&h);
            let mut dense = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
            dense.add(dense_decode(&bytes)).expect("adds");
            let sparse = SparseHistogram::decode(&bytes, "ttft_ms").expect("valid");
            assert_same(&sparse.to_histogram(), &dense, &format!("lowest {lowest}"));
        }
    }

    /// A cumulative histogram minus an earlier one holds exactly what the dense subtraction
    /// holds; one whose buckets went back gives nothing, as the dense subtraction refuses it.
    #[test]
    fn minus_is_the_dense_subtraction() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut cumulative = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
        let mut previous_dense = cumulative.clone();
        let mut previous = SparseHistogram::default();
        for step in 0..20 {
            for _ in 0..(rng.next() % 300) {
                let magnitude = rng.next() % 9;
                cumulative
                    .record(rng.next() % 10u64.pow(magnitude as u32 + 1))
                    .expect("records");
            }
            let now = SparseHistogram::decode(&encode(&cumulative), "itl_ms").expect("valid");
            let delta = now
                .minus(&previous)
                .expect("cumulative histograms only grow");
            let mut dense_delta = cumulative.clone();
            dense_delta.subtract(&previous_dense).expect("grows");
            let mut a = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
            let mut b = a.clone();
            delta.add_into(&mut a);
            b.add(&dense_delta).expect("adds");
            assert_same(&a, &b, &format!("step {step}"));
            assert_eq!(delta.len(), cumulative.len() - previous_dense.len());

            // Backwards: every non-empty step went back.
            if !delta.is_empty() {
                assert_eq!(previous.minus(&now), None, "step {step}");
                assert!(previous_dense.clone().subtract(&cumulative).is_err());
            }
            previous = now;
            previous_dense = cumulative.clone();
        }
        // A bucket that emptied, one that shrank, one past the last: all went back.
        let of = |buckets: &[(u64, u64)]| SparseHistogram {
            buckets: buckets.to_vec(),
            total: buckets.iter().map(|(_, c)| c).sum(),
        };
        let now = of(&[(10, 2), (20, 5)]);
        assert_eq!(now.minus(&of(&[(5, 1), (10, 2)])), None);
        assert_eq!(now.minus(&of(&[(10, 3)])), None);
        assert_eq!(now.minus(&of(&[(10, 1), (30, 1)])), None);
        assert_eq!(now.minus(&of(&[(10, 2)])), Some(of(&[(20, 5)])));
        assert_eq!(now.minus(&now), Some(of(&[])));
    }

    /// LEB128 of a ZigZag-encoded count, as V2 writes it.
    fn varint(out: &mut Vec<u8>, n: i64) {
        let mut v = ((n << 1) ^ (n >> 63)) as u64;
        for _ in 0..8 {
            if v < 0x80 {
                out.push(v as u8);
                return;
            }
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A V2+DEFLATE histogram of 3 digits over `lowest..=highest` with `payload` as counts.
    fn v2_deflate(lowest: u64, highest: u64, offset: u32, payload: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut inner = Vec::new();
        inner.extend_from_slice(&(0x1c84_9303u32 | 0x10).to_be_bytes());
        inner.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        inner.extend_from_slice(&offset.to_be_bytes());
        inner.extend_from_slice(&3u32.to_be_bytes());
        inner.extend_from_slice(&lowest.to_be_bytes());
        inner.extend_from_slice(&highest.to_be_bytes());
        inner.extend_from_slice(&1f64.to_bits().to_be_bytes());
        inner.extend_from_slice(payload);
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zlib.write_all(&inner).expect("compress");
        let compressed = zlib.finish().expect("compress");
        let mut out = Vec::new();
        out.extend_from_slice(&(0x1c84_9304u32 | 0x10).to_be_bytes());
        out.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
        out.extend_from_slice(&compressed);
        out
    }

    /// Malformed counts are refused with a reason, never a panic, and so are they by the
    /// dense decoder where it checks them.
    #[test]
    fn malformed_histograms_are_refused() {
        let payload = |counts: &[i64]| {
            let mut out = Vec::new();
            for &n in counts {
                varint(&mut out, n);
            }
            out
        };
        // Sanity: the hand-made encoding decodes, to the buckets of value 0, 1 and 5.
        let good = v2_deflate(1, 1 << 20, 0, &payload(&[2, 1, -3, 4]));
        let sparse = SparseHistogram::decode(&good, "ttft_ms").expect("valid");
        assert_eq!(sparse.buckets(), [(0, 2), (1, 1), (5, 4)]);
        assert_same(
            &sparse.to_histogram(),
            &{
                let mut h = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
                h.add(dense_decode(&good)).expect("adds");
                h
            },
            "hand-made",
        );

        // 1 << 20 with 3 digits: 11 buckets, (11 + 1) × 1,024 counts.
        let len = 12 * 1024;
        let mut truncated = payload(&[1, 300]);
        truncated.pop();
        let cases: [(&str, Vec<u8>, &str); 7] = [
            (
                "a count past the range",
                payload(&[-len, 1]),
                "past the value range",
            ),
            (
                "counts that overflow",
                payload(&[i64::MAX, i64::MAX, 2]),
                "overflow",
            ),
            ("a truncated varint", truncated, "truncated count"),
            (
                "an endless run of zeros",
                payload(&[-i64::MAX, -i64::MAX, -i64::MAX, 1]),
                "past the range",
            ),
            ("i64::MIN zeros", payload(&[i64::MIN, 1]), "past the range"),
            ("a varint of 9 bytes", vec![0xff; 9], "past the range"),
            (
                "a run of zeros past the range",
                payload(&[1, -len]),
                "past the range",
            ),
        ];
        for (what, counts, reason) in cases {
            let bytes = v2_deflate(1, 1 << 20, 0, &counts);
            let error = SparseHistogram::decode(&bytes, "itl_ms").expect_err(what);
            assert!(error.to_string().contains(reason), "{what}: {error}");
            assert!(error.to_string().contains("itl_ms"), "{what}: {error}");
        }
        // The last count inside the range is taken, as the dense decoder takes it.
        let edge = v2_deflate(1, 1 << 20, 0, &payload(&[-(len - 1), 1]));
        let sparse = SparseHistogram::decode(&edge, "ttft_ms").expect("valid");
        assert_same(
            &sparse.to_histogram(),
            &{
                let mut h = Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("valid");
                h.add(dense_decode(&edge)).expect("adds");
                h
            },
            "edge",
        );

        let offset = v2_deflate(1, 1 << 20, 8, &payload(&[1]));
        let error = SparseHistogram::decode(&offset, "ttft_ms").expect_err("offset");
        assert!(error.to_string().contains("normalizing offset"), "{error}");
        // The header checks are the dense decoder's: a huge range or other precision.
        let huge = v2_deflate(1, u64::MAX, 0, &payload(&[1]));
        assert!(SparseHistogram::decode(&huge, "ttft_ms").is_err());
        // A lowest value whose double overflows (it once panicked in the range check).
        let lowest = v2_deflate(u64::MAX - 1, 1 << 20, 0, &payload(&[1]));
        let error = SparseHistogram::decode(&lowest, "ttft_ms").expect_err("range");
        assert!(error.to_string().contains("value range"), "{error}");
        let dense = RunMetrics::decode(&vec![lowest; 8], Counters::default(), None);
        assert!(dense.is_err());
    }

    /// Sparse metrics merge into dense ones as the dense metrics merge.
    #[test]
    fn merge_sparse_is_merge() {
        let mut rng = Rng(42);
        let mut worker = RunMetrics::new();
        for _ in 0..500 {
            for metric in Metric::ALL.iter().chain(&Metric::CONNECTION) {
                worker.record_value(*metric, rng.next() % 10_000_000);
            }
        }
        worker.counters.succeeded = 500;
        worker.window = Some(Window {
            start_unix_us: 5,
            end_unix_us: 9,
        });
        let sparse = SparseMetrics::decode_with_connections(
            &worker.encode_histograms(),
            &worker.encode_connection_histograms(),
            worker.counters,
            worker.window,
        )
        .expect("valid");
        let (mut dense_merged, mut sparse_merged) = (RunMetrics::new(), RunMetrics::new());
        for _ in 0..2 {
            dense_merged.merge(&worker);
            sparse_merged.merge_sparse(&sparse);
        }
        for metric in Metric::ALL.iter().chain(&Metric::CONNECTION) {
            assert_same(
                sparse_merged.histogram(*metric),
                dense_merged.histogram(*metric),
                &format!("{metric:?}"),
            );
            assert_eq!(sparse.stats(*metric), worker.stats(*metric), "{metric:?}");
        }
        assert_eq!(sparse_merged.counters, dense_merged.counters);
        assert_eq!(sparse_merged.window, dense_merged.window);
        let from = SparseMetrics::from(&worker);
        for metric in Metric::ALL {
            assert_eq!(
                from.histogram(metric),
                sparse.histogram(metric),
                "{metric:?}"
            );
        }
    }
}

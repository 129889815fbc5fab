//! Which tier set a search's limit (issue 32, item 11): the gateway's queue or the model
//! server's, compared between the highest load that held and the lowest that failed, from
//! each probe's scraped server section (`server_metrics::gateway`).

use crate::report::{CapacitySection, LimitTier, ProbeSection};
use crate::server_metrics::gateway::{TierFigures, tier_at_knee};

/// Name the tier whose queue moved at the knee in `capacity.limit_tier`, when the probes on
/// both sides of it were scraped and one tier's queue grew.
pub fn name_limit_tier(capacity: &mut CapacitySection) {
    let (Some(max), Some(fail)) = (capacity.max, capacity.min_failing) else {
        return;
    };
    let figures = |value: f64, passed: bool| -> Option<TierFigures> {
        capacity
            .probes
            .iter()
            .rev()
            .filter(|p| p.value == value && decided_as(p, passed))
            .find_map(|p| p.server.as_ref().map(TierFigures::of))
    };
    let (Some(below), Some(above)) = (figures(max, true), figures(fail, false)) else {
        return;
    };
    capacity.limit_tier = tier_at_knee(&below, &above).map(|(tier, text)| LimitTier {
        tier: tier.name().to_owned(),
        text,
    });
}

/// A probe whose own run passed (or failed) at a load the search decided so.
fn decided_as(probe: &ProbeSection, passed: bool) -> bool {
    probe.incomplete.is_none() && probe.passed == passed
}

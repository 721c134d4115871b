// G7: Refusal is non_exhaustive, so a match outside the crate must have a catch-all.
use stockade_verify::Refusal;

fn code(r: &Refusal) -> u8 {
    match r {
        Refusal::FailedToStart { .. } => 1,
        Refusal::EnforcementMissing { .. } => 2,
        Refusal::Timeout { .. } => 3,
        Refusal::CpuLimit => 4,
        Refusal::OutOfMemory => 5,
        Refusal::OutputTooLarge { .. } => 6,
        Refusal::KilledBySignal { .. } => 7,
        Refusal::NonZeroExit { .. } => 8,
        Refusal::MalformedOutput { .. } => 9,
        Refusal::AssertionFailed { .. } => 10,
        Refusal::Error { .. } => 11,
    }
}

fn main() {}
